"""The driver core, one per run: ``driver`` (the results database, the queue, slots
handed trials and their events applied), ``scheduler`` (pure packing decisions),
``store_writer`` (the one writer of the results database), ``search_source`` (the
search as the source of trials), ``confirm``/``confirm_run`` (the confirm phase),
``memory_gate``, ``identity``, ``health_notes``. Imports ``sweep.slots`` and
``sweep.events``; never an executor."""
