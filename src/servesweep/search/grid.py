"""The grid as a search: every configuration of the expansion, in its order.

It behaves as a grid sweep always has: a configuration with a final outcome (ok,
failed, pruned, skipped) is not run again, whatever failed it (``--retry-failed`` is
the driver's to apply, by resetting trials before it builds the search); a trial left
pending, running or interrupted runs again in its place in the order. ``trials``
caps how many configurations run; the budget is checked by :meth:`exhausted`.

With ``only`` (a grid without a cap or budget, or ``servesweep run --trial N``) it
runs exactly those configurations, whatever the cap or budget: a plan known before
the first ask (:attr:`Search.planned`), which the driver queues all at once.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from servesweep.models import LevelResult, ServerConfig
from servesweep.records import TrialRecord
from servesweep.search.base import History, Search
from servesweep.spec.expand import expand_params
from servesweep.spec.schema import SweepSpec

__all__ = ["GridSearch"]


class GridSearch(Search):
    def __init__(
        self, spec: SweepSpec, history: History = (), only: Collection[str] | None = None
    ) -> None:
        super().__init__(spec)
        self.configs: tuple[ServerConfig, ...] = expand_params(spec.params).configs
        self.only = None if only is None else frozenset(only)
        """The fingerprints of the configurations to run, exactly these (None: every
        configuration the cap and the budget allow)."""
        if self.only is not None:
            self.configs = tuple(c for c in self.configs if c.fingerprint in self.only)
        self._finished: set[str] = set()
        self._running: set[str] = set()
        in_grid = {c.fingerprint for c in self.configs}
        # each trial as it is now (a history may hold a trial's earlier state first:
        # the skip a sampler was told, ``search_source.search_history``)
        latest = {record.id: (record, results) for record, results in history}
        for record, results in latest.values():
            if record.fingerprint not in in_grid:
                continue
            if record.outcome.final:
                self.launched.add(record.fingerprint)
                self._finished.add(record.fingerprint)
                self.record(record, self.judge(record, results))
            elif record.started_at is not None:
                self.launched.add(record.fingerprint)

    def ask(self) -> ServerConfig | None:
        for config in self.configs:
            fp = config.fingerprint
            if fp in self._finished or fp in self._running:
                continue
            if self.only is None and fp not in self.launched and self.trials_left == 0:
                return None
            self._running.add(fp)
            self.launched.add(fp)
            return config
        return None

    @property
    def planned(self) -> bool:
        return self.only is not None

    def exhausted(self, *, elapsed_s: float, gpu_seconds: float) -> bool:
        if self.only is not None:
            # exactly the configurations named, whatever the budget: done once each of
            # them is running or finished
            return all(
                c.fingerprint in self._finished or c.fingerprint in self._running
                for c in self.configs
            )
        return super().exhausted(elapsed_s=elapsed_s, gpu_seconds=gpu_seconds)

    def tell(self, trial: TrialRecord, results: Sequence[LevelResult]) -> None:
        fp = trial.fingerprint
        self._running.discard(fp)
        if not trial.outcome.final:
            return  # interrupted: asked again in its place
        self._finished.add(fp)
        self.record(trial, self.judge(trial, results))
