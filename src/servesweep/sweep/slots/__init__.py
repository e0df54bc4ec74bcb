"""The slot runtime: the work of one slot (a set of GPUs and a port on one machine),
the same in a thread of ``servesweep run`` and in a Ray actor. ``data`` is the plain
data a slot is driven with, ``channel`` where it sends its events, ``worker`` the
trial state machine, and its pieces (``launch``, ``instance``, ``measure``,
``telemetry``, ``generators``), ``node`` a machine made ready, ``leases`` the run's
hold on it, ``handle`` what every slot handle does. Imports ``sweep.events`` only, of
``sweep``."""
