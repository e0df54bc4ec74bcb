"""servesweep.sim."""
