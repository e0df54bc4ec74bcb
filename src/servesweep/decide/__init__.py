"""Every decision a user meets, in one place, as pure functions over plain records.

See docs/architecture.md ("Where each decision is made") for which module decides
what; sweep, search and report use these modules and decide nothing of their own.
This package imports nothing above it (sweep, search, report, bench, servers, store,
cli): only spec, models, metrics_catalog, records and errors (tests/unit/test_layout.py).

- the statistics: ``intervals``, ``level_intervals``, ``stats``, ``refs``; ``exact``
  (their exact sums and order statistics of large arrays, at numpy's speed)
- the judgements: ``uncertainty`` (is A better than B), ``best`` (the winner or the
  tie), ``acceptance`` and ``trusted`` (can an acceptance figure be trusted),
  ``standing`` (each trial against the objective)
- the rules that act on them: ``screening`` (screened out), ``confirm`` (the confirm
  rounds), ``memory`` (fit or skip), ``verdict`` and ``prune`` (what a search learns,
  an early stop); ``screened`` and ``confirmed`` read their stored steps back
- ``perf/``: the performance prediction before a launch (each configuration's metrics
  with an interval, or unknown), its inputs (``perf.inputs``) and the rule that acts
  on it (``perf.gate``: launch or skip as predicted worse)
"""
