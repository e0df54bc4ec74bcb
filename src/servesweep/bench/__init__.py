"""servesweep.bench."""
