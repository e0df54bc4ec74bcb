"""The screening decision: can a configuration measured with short levels still win?

Pure, no processes: the slot asks :func:`screen_reason` once a trial's screening
levels are measured (``screening`` in the sweep file, docs/sweep-file.md) and stops
the trial (``pruned``, reason ``screened``) when it says why, or measures it in full
when it says None. The rules, conservative on purpose (a configuration wrongly
screened out is a wrong winner; one wrongly kept costs one full measurement):

1. a constraint whose screening value *certainly* violates it (its whole interval at
   the decision's confidence is on the wrong side; a value without an interval, such
   as ``load_s``, by itself) screens the trial out: it cannot be a candidate;
2. the objectives: a reference — a configuration already measured in full and a
   candidate of ``best`` — screens the trial out when it beats it on every objective
   beyond both intervals and the threshold: for a maximised objective, the trial's
   upper bound is below the reference's lower bound by more than ``threshold`` of
   it (a minimised one: the trial's lower bound above the reference's upper bound).
   A later objective never rescues a trial beaten on every one; one not beaten on
   some objective is kept.

Like is compared with like: a reference's *screening* figures, measured exactly as
the trial's (the same short levels, first after the launch and its warm-up), never
its full measurement. A level the load generator could not time decides nothing
(unless ``include_unreliable``); a figure screening did not measure (an eval, a
level of a workload it left out) decides nothing either.

The :class:`ScreenPolicy` is a snapshot the driver makes when it hands the trial to
a slot (plain data: it travels to a slot on another machine); a reference that
finishes later is not in it, which can only keep a trial, never screen it out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from servesweep.decide.numbers import format_number
from servesweep.decide.stats import MetricStats, aggregate_results
from servesweep.decide.uncertainty import Rules, judge, rescaled
from servesweep.metrics_catalog import phase_of
from servesweep.models import LevelResult, usable
from servesweep.spec.constraints import Constraint, MetricRef

__all__ = [
    "Figure",
    "Reference",
    "ScreenPolicy",
    "figure_of",
    "screen_reason",
    "screening_stats",
]


@dataclass(frozen=True)
class Figure:
    """One screening figure: its mean and its interval at the decision's confidence
    (None: it has none, and counts as exact)."""

    mean: float
    lo: float | None = None
    hi: float | None = None

    def low(self) -> float:
        return self.mean if self.lo is None else self.lo

    def high(self) -> float:
        return self.mean if self.hi is None else self.hi

    def describe(self) -> str:
        shown = format_number(self.mean)
        if self.lo is not None and self.hi is not None:
            shown += f" ({format_number(self.lo)}..{format_number(self.hi)})"
        return shown


@dataclass(frozen=True)
class Reference:
    """A configuration measured in full that is a candidate of ``best``, by the
    figures of its own screening levels (one per objective)."""

    trial: int
    number: int
    figures: tuple[Figure, ...]


@dataclass(frozen=True)
class ScreenPolicy:
    """What a slot needs to decide on one trial's screening levels."""

    objectives: tuple[tuple[MetricRef, str], ...]
    """(reference, ``max``/``min``) in order."""
    constraints: tuple[Constraint, ...] = ()
    references: tuple[Reference, ...] = ()
    confidence: float = 0.95
    threshold: float = 0.05
    include_unreliable: bool = False


def screening_stats(
    results: Sequence[LevelResult],
    ref: MetricRef,
    phase_seconds: Mapping[str, float] | None = None,
) -> MetricStats | None:
    """The value of ``ref`` in one trial's screening levels ``results`` (a trial metric
    from ``phase_seconds``), or None when screening did not measure it."""
    if ref.workload is None:
        phase = phase_of(ref.metric)
        secs = None if phase is None else (phase_seconds or {}).get(phase.value)
        return None if secs is None else MetricStats.of([float(secs)])
    for lvl in aggregate_results(0, results):
        if lvl.workload == ref.workload and lvl.level == ref.level:
            return lvl.metrics.get(ref.metric)
    return None


def figure_of(stats: MetricStats, confidence: float) -> Figure:
    bounds = rescaled(stats, confidence)
    if bounds is None:
        return Figure(stats.mean)
    return Figure(stats.mean, bounds[0], bounds[1])


def _beaten(reference: Figure, mine: Figure, direction: str, threshold: float) -> bool:
    """Whether ``reference`` beats ``mine`` beyond both intervals and the threshold."""
    if direction == "max":
        bar = reference.low()
        return bar - mine.high() > threshold * abs(bar)
    bar = reference.high()
    return mine.low() - bar > threshold * abs(bar)


def screen_reason(
    policy: ScreenPolicy,
    results: Sequence[LevelResult],
    phase_seconds: Mapping[str, float] | None = None,
) -> str | None:
    """Why the trial whose screening levels are ``results`` cannot win (it is not
    measured in full), or None: it is measured in full. See the module doc."""
    results = usable(results, policy.include_unreliable)
    rules = Rules(confidence=policy.confidence, threshold=policy.threshold)
    for con in policy.constraints:
        stats = screening_stats(results, con.ref, phase_seconds)
        if stats is None:
            continue
        verdict = judge(con, stats, rules)
        if verdict.state == "violated":
            return f"constraint {con} is violated: {con.ref.key} = {verdict.describe()}"
    mine: list[Figure] = []
    for ref, _ in policy.objectives:
        stats = screening_stats(results, ref, phase_seconds)
        if stats is None:
            return None
        mine.append(figure_of(stats, policy.confidence))
    dirs = [d for _, d in policy.objectives]
    for reference in policy.references:
        if len(reference.figures) != len(mine):
            continue
        if all(
            _beaten(theirs, own, d, policy.threshold)
            for theirs, own, d in zip(reference.figures, mine, dirs, strict=True)
        ):
            key = policy.objectives[0][0].key
            if len(mine) == 1:
                return (
                    f"{key} = {mine[0].describe()} cannot reach #{reference.number}'s "
                    f"{reference.figures[0].describe()} beyond both intervals and the "
                    f"{policy.threshold:.0%} threshold"
                )
            return (
                f"#{reference.number} is better on every objective beyond both intervals "
                f"and the {policy.threshold:.0%} threshold"
            )
    return None
