"""servesweep.sweep: running a sweep, in four sub-packages (docs/architecture.md draws them).

* ``sweep.events`` — the typed events every part speaks (imports nothing else of ``sweep``);
* ``sweep.slots`` — the slot runtime: one slot's work on the machine that owns its GPUs;
* ``sweep.core`` — the driver: the results database, the queue, the scheduler, the search;
* ``sweep.executors`` — where slots run: this machine (``local``) or a Ray cluster (``ray``);
* ``sweep.commands`` — what the CLI's commands call: ``run``, ``apply``, ``status``,
  ``stop``, ``doctor``, ``wait-gpus``.

Imports point one way: commands -> executors -> core -> slots -> events.
"""
