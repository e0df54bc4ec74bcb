"""servesweep.servers."""
