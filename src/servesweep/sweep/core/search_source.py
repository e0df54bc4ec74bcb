"""A search as the driver's source of trials: the configurations Optuna's sampler
proposes (``search.strategy`` random, tpe, nsga2), one by one, as slots free up, or
the grid's (``search.GridSearch``): in its order, one by one under a ``trials`` cap
or a budget, otherwise its plan of pending trials all at once.

The results database stays the single source of truth: the search is rebuilt from the
stored trials of the sweep at every run (``create_search`` replays them), so after a
crash or Ctrl-C the same search continues and nothing measured is measured twice.
Each proposal becomes a trial of the sweep (in plan, numbered in the order it was
asked); a configuration asked again (an environment failure, or a trial a dead run
left unfinished) reuses its trial. Finished trials are told to the search by the
driver, from its own thread. A trial skipped as predicted worse and launched before
the end is replayed as the sampler saw it (:func:`search_history`).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from servesweep.decide.perf import Measured
from servesweep.decide.prune import PrunePolicy
from servesweep.models import LevelResult, Outcome
from servesweep.search import History, create_search
from servesweep.search.base import MemoryOver
from servesweep.spec.schema import SweepSpec
from servesweep.store import ReopenedSkip, Store, SweepRecord, TrialRecord
from servesweep.sweep.core.predict_gate import guide_of

__all__ = ["SearchSource", "measuring_time", "search_history"]


def search_history(store: Store, sweep_id: int) -> History:
    """The sweep's stored trials with their results, as a search is rebuilt from them.
    A trial skipped as predicted worse and then launched before the end (a
    ``reopened`` event, :class:`~servesweep.records.ReopenedSkip`) comes twice: first
    as the skip the sampler was told, when it was told (its record holds only the late
    launch now), then as it is."""
    skips = ReopenedSkip.by_trial(store.events(sweep_id, ReopenedSkip.kind))
    history: list[tuple[TrialRecord, Sequence[LevelResult]]] = []
    for trial in store.trials(sweep_id):
        history.extend((fact.skip(trial), ()) for fact in skips.get(trial.id, ()))
        history.append((trial, store.results(trial.id, with_samples=False)))
    return history


def measuring_time(trials: Sequence[TrialRecord], now: float) -> float:
    """Wall time during which at least one trial of the sweep was running (the union
    of the trials' intervals, across every run; a trial still running counts up to
    ``now``): what a search's time budget is spent on."""
    spans = sorted(
        (t.started_at, t.finished_at if t.finished_at is not None else now)
        for t in trials
        if t.started_at is not None
    )
    total, end = 0.0, float("-inf")
    for begin, finish in spans:
        if finish <= end:
            continue
        total += finish - max(begin, end)
        end = finish
    return total


def _gpu_seconds(trials: Sequence[TrialRecord], now: float) -> float:
    held = 0.0
    for t in trials:
        if t.finished_at is not None:
            held += t.gpu_seconds
        elif t.started_at is not None and t.outcome is Outcome.RUNNING:
            held += (now - t.started_at) * max(1, len(t.gpus))
    return held


class SearchSource:
    """The driver's ``TrialSource``: a search, the grid's or a sampler's (see the
    module doc)."""

    def __init__(
        self,
        store: Store,
        sweep: SweepRecord,
        spec: SweepSpec,
        only: Collection[str] | None = None,
        predict: bool = True,
        earlier: Sequence[Measured] = (),
        memory: MemoryOver | None = None,
    ) -> None:
        self.store = store
        self.sweep = sweep
        history = search_history(store, sweep.id)
        guide = guide_of(spec, predict)
        self.search = create_search(spec, history, only, guide, earlier, memory)
        self.planned = self.search.planned
        """A grid's plan of pending trials: all of them are taken at once."""
        self.notes: list[str] = list(self.search.notes)
        """What the rebuilt search noticed in the stored trials (worth a warning)."""
        self._finished = False

    def take(self, room: int) -> list[TrialRecord]:
        if self.planned:
            return self._take_plan()
        out: list[TrialRecord] = []
        while len(out) < room and not self.exhausted():
            config = self.search.ask()
            if config is None:
                self._finished = True
                break
            trial = self.store.ensure_trial(self.sweep.id, config, in_plan=True)
            if trial.outcome.final or trial.outcome is Outcome.INTERRUPTED:
                # asked again (an environment failure): a new attempt of its trial
                self.store.reset_trial(trial.id)
                trial = self.store.trial(trial.id)
            out.append(trial)
        return out

    def _take_plan(self) -> list[TrialRecord]:
        """A grid's plan, all at once: its trials as stored (an interrupted one keeps its
        outcome until it starts)."""
        stored = {t.fingerprint: t for t in self.store.trials(self.sweep.id, in_plan_only=True)}
        out: list[TrialRecord] = []
        while (config := self.search.ask()) is not None:
            out.append(stored[config.fingerprint])
        self._finished = True
        return out

    def tell(self, trial: TrialRecord, results: Sequence[LevelResult]) -> None:
        self.search.tell(trial, results)

    def exhausted(self) -> bool:
        if self._finished:
            return True
        if self.planned:
            return self.search.exhausted(elapsed_s=0.0, gpu_seconds=0.0)  # spends no budget
        trials = self.store.trials(self.sweep.id)
        now = time.time()
        return self.search.exhausted(
            elapsed_s=measuring_time(trials, now), gpu_seconds=_gpu_seconds(trials, now)
        )

    def prune_policy(self) -> PrunePolicy | None:
        """The early-stop rule for the next trial handed to a slot (None: every level
        runs): a snapshot of the best so far, taken when the trial starts, so a grid's
        plan queued at once prunes against the trials finished before each one."""
        policy = self.search.prune_policy()
        return policy if policy.enabled else None
