"""servesweep.report."""
