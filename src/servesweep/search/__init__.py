"""servesweep.search: which server configuration to run next, learned from the trials
measured so far.

Layer: below :mod:`servesweep.sweep`, above :mod:`servesweep.decide` (whose
``verdict`` and ``prune`` judge what it is told); imports decide, spec, models and the
stored records, never sweep or report.

The driver's contract (the driver's side is ``servesweep.sweep.core.search_source``)::

    search = create_search(spec, history)   # history: [(TrialRecord, [LevelResult])]
    while not search.exhausted(elapsed_s=..., gpu_seconds=...):
        config = search.ask()               # None: finished (trials cap, space exhausted)
        ...hand config to a free slot, with search.prune_policy()...
        # the slot, after each level that has levels after it:
        #     reason = prune_reason(policy, results_so_far, phase_seconds)
        search.tell(trial_record, level_results)   # once per finished trial

- ``create_search`` rebuilds the search from the stored trials: a grid continues in its
  order; a sampler replays the stored asks and tells (same seed, same proposals), and
  trials left unfinished by a crash are asked again first. Nothing measured is
  proposed again. A history may hold a trial twice, an earlier state first (a skip
  the sampler was told, then the launch that followed at the sweep's end:
  ``search_source.search_history``): a sampler replays both, a grid reads the latest.
- ``ask`` never returns a configuration that ``exclude``/``when`` forbid (the sampler
  is told they are infeasible without a launch). Several asks may come before a tell
  (one per free slot); two asks never return the same configuration while it runs.
- ``tell``: ok -> objective and constraint values; failed with a class that blames the
  configuration (``FailureClass.blames_config``) -> infeasible; failed because of the
  environment -> not told as a result, the configuration is asked again (a sampling
  search; at most ``ENV_ATTEMPTS`` attempts; a grid keeps today's behaviour: a failure
  is final); pruned -> Optuna's ``PRUNED`` with the objective measured before the stop;
  a trial told that is not final (interrupted) is asked again.
- ``exhausted``: ``search.budget`` spent (wall time or GPU-hours, whichever first).
- :func:`prune_reason` with :meth:`Search.prune_policy` decides early stops (opt out
  per sweep with ``search.prune: false``).
"""

from servesweep.decide.prune import NOISE_MARGIN, Incumbent, PrunePolicy, prune_reason
from servesweep.decide.verdict import Goal, Measured, Verdict, VerdictKind, judge, measure
from servesweep.search.base import History, Search, goal_of
from servesweep.search.create import create_search

__all__ = [
    "NOISE_MARGIN",
    "Goal",
    "History",
    "Incumbent",
    "Measured",
    "PrunePolicy",
    "Search",
    "Verdict",
    "VerdictKind",
    "create_search",
    "goal_of",
    "judge",
    "measure",
    "prune_reason",
]
