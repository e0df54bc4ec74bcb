"""What every search shares: the goal, the results told so far, the best so far, the
trials cap and the budget. :class:`Search` is the driver's one interface; the grid
(:mod:`servesweep.search.grid`) and Optuna's samplers
(:mod:`servesweep.search.sampled`) implement it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from servesweep.decide.prune import Incumbent, PrunePolicy
from servesweep.decide.verdict import Goal, Verdict, VerdictKind, judge
from servesweep.models import LevelResult, Outcome, ServerConfig
from servesweep.records import TrialRecord
from servesweep.spec.constraints import resolve_objectives, validate_constraints
from servesweep.spec.schema import SweepSpec

__all__ = ["History", "MemoryOver", "Search", "Told", "goal_of"]

History = Sequence[tuple[TrialRecord, Sequence[LevelResult]]]
"""The stored trials of a sweep with their level results (latest attempt)."""


class MemoryOver(Protocol):
    """The memory gate's prediction: a configuration's predicted memory beyond its
    capacity (bytes, negative: room left; None: unknown), with the calibration the
    trials that ended by ``at`` gave (their ``finished_at``; None: every trial so
    far)."""

    def __call__(self, params: Mapping[str, Any], at: float | None = None) -> int | None: ...


def goal_of(spec: SweepSpec) -> Goal:
    """The sweep's objectives and constraints, resolved against its workloads."""
    return Goal(
        resolve_objectives(spec),
        validate_constraints(spec),
        include_unreliable=spec.include_unreliable,
        gpu_hour=spec.cost.gpu_hour if spec.cost is not None else None,
    )


@dataclass(frozen=True)
class Told:
    """A finished trial as the search counts it."""

    trial: int
    fingerprint: str
    verdict: Verdict


def _dominates(a: Incumbent, b: Incumbent, directions: Sequence[str]) -> bool:
    better = False
    for x, y, d in zip(a.values, b.values, directions, strict=True):
        if (x < y) if d == "max" else (x > y):
            return False
        if x != y:
            better = True
    return better


class Search(ABC):
    """Proposes server configurations and learns from finished trials.

    The driver calls, from one thread: :meth:`ask` for each free slot (several asks
    may come before a tell), :meth:`tell` once per finished trial (ok, failed, pruned,
    skipped), :meth:`exhausted` before each ask, and :meth:`prune_policy` when it hands
    a trial to a slot. The contract is in the docstring of :mod:`servesweep.search`.
    """

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self.goal = goal_of(spec)
        self.told: dict[str, Told] = {}
        """Finished trials by fingerprint (the latest verdict of each config)."""
        self.launched: set[str] = set()
        """Fingerprints handed out at least once (the ``trials`` cap counts these)."""
        self.notes: list[str] = []
        """What the search noticed while it was rebuilt from the stored trials (a
        sampler's replay that diverged), for the driver to show as warnings; a grid
        notices nothing."""

    @property
    def planned(self) -> bool:
        """Whether every configuration it proposes is known before the first ask (a
        grid's plan of pending trials): the driver then queues them all at once,
        counts them exactly, and asks for no pruning (False: a search that learns)."""
        return False

    @abstractmethod
    def ask(self) -> ServerConfig | None:
        """The next configuration to run, or None when the search is finished."""

    @abstractmethod
    def tell(self, trial: TrialRecord, results: Sequence[LevelResult]) -> None:
        """A finished trial and its level results."""

    def exhausted(self, *, elapsed_s: float, gpu_seconds: float) -> bool:
        """Whether the budget (``search.budget``: wall time or GPU-hours, whichever
        comes first) is spent. ``elapsed_s``: wall time of the sweep so far (across
        resumed runs); ``gpu_seconds``: GPU-seconds its trials held."""
        budget = self.spec.search.budget
        if budget is None:
            return False
        if budget.time is not None and elapsed_s >= budget.time:
            return True
        return budget.gpu_hours is not None and gpu_seconds >= budget.gpu_hours * 3600.0

    @property
    def trials_left(self) -> int | None:
        """Configurations the ``trials`` cap still allows (None: no cap)."""
        cap = self.spec.search.trials
        return None if cap is None else max(0, cap - len(self.launched))

    def judge(self, trial: TrialRecord, results: Sequence[LevelResult]) -> Verdict:
        return judge(self.goal, trial, results)

    def record(self, trial: TrialRecord, verdict: Verdict) -> None:
        """Keep a finished trial's verdict (for the best so far and duplicates)."""
        if verdict.kind is not VerdictKind.RETRY:
            self.told[trial.fingerprint] = Told(trial.id, trial.fingerprint, verdict)
        if trial.outcome is Outcome.SKIPPED:
            self.launched.discard(trial.fingerprint)  # never launched: not in the cap

    def front(self) -> tuple[Incumbent, ...]:
        """The best feasible trial so far (one objective) or the Pareto front."""
        feasible = [
            Incumbent(
                tuple(v for v in t.verdict.values if v is not None), t.verdict.spreads, t.trial
            )
            for t in self.told.values()
            if t.verdict.feasible
        ]
        directions = self.goal.directions
        if not feasible:
            return ()
        if len(directions) == 1:
            sign = 1.0 if directions[0] == "max" else -1.0
            return (max(feasible, key=lambda inc: (sign * inc.values[0], -(inc.trial or 0))),)
        return tuple(
            inc
            for inc in feasible
            if not any(_dominates(other, inc, directions) for other in feasible)
        )

    def prune_policy(self) -> PrunePolicy:
        """What the slot needs to decide :func:`~servesweep.decide.prune.prune_reason`
        for the next trial: a snapshot of the goal and the best so far."""
        repeats = {w.name: w.repeats for w in self.spec.workloads}
        return PrunePolicy(
            goal=self.goal,
            repeats=repeats,
            front=self.front(),
            enabled=self.spec.search.pruning,
        )
