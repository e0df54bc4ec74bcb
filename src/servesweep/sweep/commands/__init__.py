"""What the CLI's commands call: ``run`` (``run_sweep``: the sweep, its lock, resume
checks), ``apply``, ``status``, ``stop``, ``doctor`` and ``wait_gpus``."""
