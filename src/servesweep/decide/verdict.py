"""What a finished trial tells a search: objective values, constraint values, and how
the sampler should count it.

- ``ok``: the objective values (means over repeats) and one value per constraint
  (<= 0 met, > 0 violated, scaled by the limit) -> ``complete``; a missing objective
  value makes it ``infeasible`` (the report could not rank it either).
- ``failed`` with a class that blames the configuration (``oom``, ``invalid_args``,
  ``ready_timeout``, ``bench_errors``...) -> ``infeasible``: the sampler learns that
  this region does not work.
- ``failed`` because of the environment (``gpu_busy``, ``port_in_use``,
  ``stop_failed``, ``node_lost``) -> ``retry``: never blamed on the configuration.
- ``pruned`` -> ``pruned`` with the objective value measured before the stop.
- ``skipped`` -> ``ignored``, except ``skipped`` with reason ``predicted_oom`` (the
  memory prediction said it cannot fit) -> ``infeasible``, and ``skipped`` with reason
  ``predicted_worse`` (the performance prediction said it cannot beat the best,
  ``decide.perf.gate``) -> ``pruned`` at its predicted values; a trial not finished
  (pending, running, interrupted) -> ``retry``.

A level the load generator could not time (``LevelResult.unreliable``) is left out
as if not measured, unless the goal's ``include_unreliable`` takes it in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from servesweep.decide.cost import priced
from servesweep.decide.perf.gate import PREDICTED_WORSE
from servesweep.metrics_catalog import GPUS
from servesweep.models import LevelResult, Outcome, usable
from servesweep.records import TrialRecord
from servesweep.spec.constraints import TRIAL_METRICS, Constraint, MetricRef

__all__ = [
    "FAILED_CONSTRAINT",
    "Goal",
    "Measured",
    "Verdict",
    "VerdictKind",
    "judge",
    "measure",
    "violation",
]

FAILED_CONSTRAINT = 1.0
"""The constraint value of a trial that failed because of its configuration (or lacks
an objective value): violated, as much as a metric twice its limit."""

_MIN_VIOLATION = 1e-6


class VerdictKind(str, Enum):
    COMPLETE = "complete"
    INFEASIBLE = "infeasible"
    PRUNED = "pruned"
    RETRY = "retry"
    IGNORED = "ignored"


@dataclass(frozen=True)
class Goal:
    """What the search optimises: objectives (reference, direction) and constraints."""

    objectives: tuple[tuple[MetricRef, Literal["max", "min"]], ...]
    constraints: tuple[Constraint, ...] = ()
    include_unreliable: bool = False
    """Whether levels marked ``unreliable`` count (default: they are left out)."""
    gpu_hour: float | None = None
    """The sweep file's price of a GPU-hour: levels get their cost metrics."""

    @property
    def directions(self) -> tuple[Literal["max", "min"], ...]:
        return tuple(d for _, d in self.objectives)


@dataclass(frozen=True)
class Measured:
    """One metric of one trial: mean and spread (max - min) over its repeats."""

    mean: float
    spread: float = 0.0
    count: int = 1


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    values: tuple[float | None, ...]
    """One per objective (None where not measured)."""
    spreads: tuple[float, ...]
    constraints: tuple[float, ...]
    """One per constraint of the goal, then the failure constraint (see module doc)."""
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return self.kind is VerdictKind.COMPLETE and all(v <= 0 for v in self.constraints)

    @property
    def told(self) -> bool:
        """Reported to the sampler as a result (complete, infeasible or pruned)."""
        return self.kind in (VerdictKind.COMPLETE, VerdictKind.INFEASIBLE, VerdictKind.PRUNED)


def measure(
    ref: MetricRef, results: Sequence[LevelResult], record: TrialRecord | None = None
) -> Measured | None:
    """The value of ``ref`` in one trial's results (mean over repeats), or None.

    A trial metric (``load_s``) comes from the record's phase seconds, ``gpus`` from
    the GPUs it was given. A reference
    without a level takes the results of its workload that carry the metric (an
    eval, a capacity search's summary, a workload of one level)."""
    if ref.workload is None:
        if ref.metric == GPUS.name and record is not None:
            held = record_gpus(record)
            return None if held is None else Measured(float(held))
        if ref.metric in TRIAL_METRICS and record is not None:
            secs = record.phase_seconds.get(ref.metric.removesuffix("_s"))
            return None if secs is None else Measured(float(secs))
        return None
    matches = [
        r
        for r in results
        if r.workload == ref.workload
        and (ref.level is None or r.level == ref.level)
        and ref.metric in r.metrics
    ]
    if ref.level is None and len({r.level for r in matches}) > 1:
        return None  # ambiguous: the reference must name a level
    found = [float(r.metrics[ref.metric]) for r in matches]
    found = [v for v in found if math.isfinite(v)]
    if not found:
        return None
    return Measured(sum(found) / len(found), max(found) - min(found), len(found))


def record_gpus(record: TrialRecord) -> int | None:
    """The GPUs a trial was given (its attempt's, else its instance's); None: unknown."""
    if record.gpus:
        return len(record.gpus)
    if record.instance is not None and record.instance.gpus:
        return len(record.instance.gpus)
    return None


def violation(constraint: Constraint, value: float | None) -> float:
    """<= 0 when the value meets the constraint, > 0 by how much (relative to the
    limit) it misses it; a missing value misses it by :data:`FAILED_CONSTRAINT`."""
    if value is None or math.isnan(value):
        return FAILED_CONSTRAINT
    scale = abs(constraint.value) or 1.0
    op, limit = constraint.op, constraint.value
    if op in ("<", "<="):
        distance = (value - limit) / scale
    elif op in (">", ">="):
        distance = (limit - value) / scale
    elif op == "==":
        distance = abs(value - limit) / scale
    else:  # "!="
        distance = 0.0 if value != limit else FAILED_CONSTRAINT
    if constraint.check(value):
        return min(distance, 0.0)
    return max(distance, _MIN_VIOLATION)


def _infeasible(goal: Goal, reason: str) -> Verdict:
    count = len(goal.objectives)
    zeros = tuple(0.0 for _ in goal.constraints)
    return Verdict(
        VerdictKind.INFEASIBLE, (None,) * count, (0.0,) * count, (*zeros, FAILED_CONSTRAINT), reason
    )


def _predicted(goal: Goal, details: Mapping[str, Any]) -> Verdict:
    """A configuration not launched as predicted worse: stopped early, at its predicted
    objective values (None where not predicted)."""
    predicted = details.get("predicted_performance")
    table = predicted if isinstance(predicted, Mapping) else {}
    values: list[float | None] = []
    for ref, _ in goal.objectives:
        entry = table.get(ref.key)
        value = entry.get("value") if isinstance(entry, Mapping) else None
        values.append(float(value) if isinstance(value, int | float) else None)
    zeros = (0.0,) * (len(goal.constraints) + 1)
    return Verdict(VerdictKind.PRUNED, tuple(values), (0.0,) * len(values), zeros, PREDICTED_WORSE)


def judge(goal: Goal, record: TrialRecord, results: Sequence[LevelResult]) -> Verdict:
    """How a finished trial counts for the search (see the module docstring)."""
    count = len(goal.objectives)
    outcome = record.outcome
    if outcome is Outcome.FAILED:
        failure = record.failure_class
        if failure is None or not failure.blames_config:
            what = failure.value if failure is not None else "unknown"
            return Verdict(
                VerdictKind.RETRY, (None,) * count, (0.0,) * count, (), f"environment: {what}"
            )
        reason = failure.value
        if record.evidence is not None and record.evidence.reason:
            reason += f" ({record.evidence.reason})"
        return _infeasible(goal, reason)
    if outcome is Outcome.SKIPPED:
        if record.evidence is not None and record.evidence.reason == "predicted_oom":
            return _infeasible(goal, "predicted_oom")  # not launched: it would not fit
        if record.evidence is not None and record.evidence.reason == PREDICTED_WORSE:
            return _predicted(goal, record.evidence.details)
        return Verdict(VerdictKind.IGNORED, (None,) * count, (0.0,) * count, (), "skipped")
    if outcome not in (Outcome.OK, Outcome.PRUNED):
        return Verdict(
            VerdictKind.RETRY, (None,) * count, (0.0,) * count, (), f"not finished: {outcome.value}"
        )
    results = priced(usable(results, goal.include_unreliable), record_gpus(record), goal.gpu_hour)
    measured = [measure(ref, results, record) for ref, _ in goal.objectives]
    values = tuple(None if m is None else m.mean for m in measured)
    spreads = tuple(0.0 if m is None else m.spread for m in measured)
    pruned = outcome is Outcome.PRUNED
    constraint_values: list[float] = []
    for constraint in goal.constraints:
        found = measure(constraint.ref, results, record)
        if found is None and pruned:
            constraint_values.append(0.0)  # not measured before the stop: unknown
        else:
            constraint_values.append(violation(constraint, None if found is None else found.mean))
    if pruned:
        reason = record.evidence.message if record.evidence is not None else "pruned"
        return Verdict(VerdictKind.PRUNED, values, spreads, (*constraint_values, 0.0), reason)
    if any(v is None for v in values):
        missing = [
            str(ref) for (ref, _), v in zip(goal.objectives, values, strict=True) if v is None
        ]
        return _infeasible(goal, f"objective not measured: {', '.join(missing)}")
    return Verdict(VerdictKind.COMPLETE, values, spreads, (*constraint_values, 0.0))
