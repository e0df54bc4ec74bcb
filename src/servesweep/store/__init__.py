"""servesweep.store."""
