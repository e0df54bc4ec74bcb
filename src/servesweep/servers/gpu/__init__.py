"""servesweep.servers.gpu."""
