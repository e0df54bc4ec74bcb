"""servesweep.spec."""
