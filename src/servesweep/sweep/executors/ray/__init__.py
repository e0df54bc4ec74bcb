"""Slots on the nodes of a Ray cluster: ``nodes`` (a cluster's nodes, errors and events
as plain data; imports no Ray), ``executor`` (joining the cluster, preparing its nodes,
the run's executor), ``site`` (the cluster as a run's site), ``actor`` (a slot's actor
on its node) and ``handle`` (its handle in the driver). Only ``executor``, ``site``,
``actor`` and ``handle`` import Ray; this package's ``__init__`` imports nothing."""
