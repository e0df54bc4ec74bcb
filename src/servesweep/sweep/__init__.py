"""servesweep.sweep."""
