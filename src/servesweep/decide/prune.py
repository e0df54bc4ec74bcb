"""Early stop inside a trial: after a workload level, can this trial still win?

:func:`prune_reason` is a pure decision the slot makes after each level that has
levels after it (on the last level there is nothing left to save). It says why to
stop, or None:

1. a constraint whose level is fully measured (every repeat) is violated: the report
   would exclude the trial whatever comes next;
2. the objective's level is fully measured and the value is worse than the best so
   far by more than the noise: the larger of the spread measured across repeats (of
   this trial and of the best) and ``margin`` (relative, default 5 %). With several
   objectives: a trial of the Pareto front beats it on every objective by more than
   the noise.

Nothing is inferred from a level that is not the one a constraint or objective names.
The :class:`PrunePolicy` is a snapshot the search makes (:meth:`Search.prune_policy`);
it is plain data, so it can travel to a slot on another machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from servesweep.decide.verdict import Goal, Measured, measure
from servesweep.models import LevelResult, usable
from servesweep.spec.constraints import TRIAL_METRICS, MetricRef

__all__ = ["NOISE_MARGIN", "Incumbent", "PrunePolicy", "prune_reason"]

NOISE_MARGIN = 0.05
"""Relative margin under which two objective values are not told apart when no repeats
measured the noise (a trial is pruned only when it is worse than the best by more)."""


@dataclass(frozen=True)
class Incumbent:
    """A finished, feasible trial the pruner compares against."""

    values: tuple[float, ...]
    spreads: tuple[float, ...]
    trial: int | None = None
    """Its trial id, for the reason's text."""


@dataclass(frozen=True)
class PrunePolicy:
    goal: Goal
    repeats: Mapping[str, int] = field(default_factory=dict)
    """Repeats per workload: a level counts as measured once it has them all."""
    front: tuple[Incumbent, ...] = ()
    """The best trial so far (one objective) or the Pareto front (several)."""
    margin: float = NOISE_MARGIN
    enabled: bool = True


def _measured(
    ref: MetricRef,
    results: Sequence[LevelResult],
    repeats: Mapping[str, int],
    phase_seconds: Mapping[str, float],
) -> Measured | None:
    """The metric once its level is fully measured, else None."""
    if ref.workload is None:
        if ref.metric not in TRIAL_METRICS:
            return None
        secs = phase_seconds.get(ref.metric.removesuffix("_s"))
        return None if secs is None else Measured(float(secs))
    if ref.level is not None:
        done = sum(1 for r in results if r.workload == ref.workload and r.level == ref.level)
        if done < repeats.get(ref.workload, 1):
            return None
    return measure(ref, results)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _beats(best: float, value: float, noise: float, direction: str) -> bool:
    return value + noise < best if direction == "max" else value - noise > best


def prune_reason(
    policy: PrunePolicy,
    results: Sequence[LevelResult],
    phase_seconds: Mapping[str, float] | None = None,
) -> str | None:
    """Why the trial whose results so far are ``results`` should stop, or None.

    ``phase_seconds``: the trial's phase durations so far (for constraints on trial
    metrics such as ``load_s``)."""
    if not policy.enabled:
        return None
    # a level the load generator could not time decides nothing (unless told)
    results = usable(results, policy.goal.include_unreliable)
    phases = phase_seconds or {}
    for constraint in policy.goal.constraints:
        found = _measured(constraint.ref, results, policy.repeats, phases)
        if found is not None and constraint.check(found.mean) is False:
            return f"constraint {constraint} is violated: {constraint.ref} = {_fmt(found.mean)}"
    if not policy.front:
        return None
    measured = [
        _measured(ref, results, policy.repeats, phases) for ref, _ in policy.goal.objectives
    ]
    if any(m is None for m in measured):
        return None
    values = [m.mean for m in measured if m is not None]
    spreads = [m.spread for m in measured if m is not None]
    directions = policy.goal.directions
    for incumbent in policy.front:
        noises = [
            max(policy.margin * abs(best), spread, best_spread)
            for best, spread, best_spread in zip(
                incumbent.values, spreads, incumbent.spreads, strict=True
            )
        ]
        beaten = all(
            _beats(best, value, noise, direction)
            for best, value, noise, direction in zip(
                incumbent.values, values, noises, directions, strict=True
            )
        )
        if not beaten:
            continue
        which = f"trial {incumbent.trial}" if incumbent.trial is not None else "a finished trial"
        if len(values) == 1:
            ref = policy.goal.objectives[0][0]
            return (
                f"{ref} = {_fmt(values[0])} cannot reach the best so far "
                f"{_fmt(incumbent.values[0])} ({which}) within the noise ±{_fmt(noises[0])}"
            )
        return f"{which} is better on every objective by more than the noise"
    return None
