"""servesweep.cli."""
