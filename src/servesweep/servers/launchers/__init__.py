"""servesweep.servers.launchers."""
