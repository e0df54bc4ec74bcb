"""Deciding with uncertainty: is one configuration really better, is a constraint
really met.

:mod:`servesweep.decide.best` ranks; this module says what the ranking is worth:

- :func:`margin`: how far one candidate leads another on one objective, against the
  uncertainty of the difference (the two intervals combined) and the practical
  threshold (:attr:`Rules.threshold`, default 1 %). A lead is *decisive* only when it
  is beyond both; otherwise the two are tied.
- :func:`decision_se`: the standard error a decision gives a candidate's mean: its
  interval's, and at least what launches vary (:attr:`Rules.launch_sd`, learned by
  :func:`learned_launch_sd` from the sweep's own relaunches): one launch's interval
  cannot see launch-to-launch variation, so a candidate of one launch is never
  separated from another by less than launches vary.
- :attr:`Margin.equivalent`: the two are equivalent within the threshold (an
  equivalence test as in TOST: the difference's interval at ``1 - 2 alpha``, 90 %
  for a 95 % decision, lies inside ``± threshold``); more launches would not make
  either the winner.
- :func:`tie_set`: the candidates the leader does not decisively beat, objective by
  objective (a later objective can separate what an earlier one left tied), at the
  family-wise confidence of :meth:`Rules.for_ties`.
- :func:`prefer`: among tied candidates, the cheaper one (fewer GPUs, then less GPU
  memory, then lower latency; :attr:`Rules.prefer` orders these), with the reason
  in one line.
- :func:`judge`: a constraint judged with the value's interval: ``met`` (the whole
  interval satisfies it), ``violated`` (none of it does) or ``uncertain`` (the
  interval straddles the limit), with what it would take to decide.

A value without an interval (a sweep file metric like ``load_s``, a synthetic
result) counts as exact: the threshold alone decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from servesweep.decide.intervals import DEFAULT_CONFIDENCE, standard_error, z_quantile
from servesweep.decide.numbers import format_number
from servesweep.decide.stats import MetricStats
from servesweep.spec.constraints import Constraint

__all__ = [
    "COSTS",
    "DEFAULT_LAUNCH_SD",
    "DEFAULT_THRESHOLD",
    "PRIOR_LAUNCHES",
    "Margin",
    "Rules",
    "Verdict",
    "decision_se",
    "judge",
    "learned_launch_sd",
    "margin",
    "prefer",
    "rescaled",
    "tie_set",
]

DEFAULT_THRESHOLD = 0.01
DEFAULT_LAUNCH_SD = 0.02
"""Relative standard deviation between launches of one configuration assumed until the
sweep's relaunches measure it (the H200 measured 1.9-2.2 % for llama-server;
``decision.launch_sd``)."""
PRIOR_LAUNCHES = 4
"""The weight of :data:`DEFAULT_LAUNCH_SD` against what relaunches measure, in degrees
of freedom (a configuration measured in k launches brings k - 1)."""
COSTS: tuple[str, ...] = ("gpus", "memory", "latency")
"""What "cheaper" weighs, in the default order of :attr:`Rules.prefer`."""


@dataclass(frozen=True)
class Rules:
    """How ``best`` decides (the sweep file's ``decision``)."""

    confidence: float = DEFAULT_CONFIDENCE
    threshold: float = DEFAULT_THRESHOLD
    """The smallest relative lead that counts (0.01: 1 %)."""
    prefer: tuple[str, ...] = COSTS
    launch_sd: float = DEFAULT_LAUNCH_SD
    """Relative standard deviation between launches (stated, or learned:
    :func:`learned_launch_sd`)."""
    family_wise: bool = True
    """Drop a candidate from the tie set only at the family-wise confidence
    (:meth:`for_ties`)."""

    def for_ties(self, candidates: int) -> Rules:
        """The rules the tie set is decided with among ``candidates``: each of the
        leader's ``candidates - 1`` comparisons at ``1 - alpha / (candidates - 1)``
        (Bonferroni), so that the chance of dropping any configuration as good as the
        leader stays ``alpha`` however many there are (pairwise 95 % comparisons with 11
        others dropped one of three equal configurations in 23 of 100 simulated sweeps).
        Declaring the leader the winner needs every comparison anyway, so that claim
        needs no correction; only its confidence is the stricter one."""
        if not self.family_wise or candidates <= 2:
            return self
        alpha = (1.0 - self.confidence) / (candidates - 1)
        return replace(self, confidence=1.0 - alpha)

    @classmethod
    def of(cls, spec: Mapping[str, Any] | None) -> Rules:
        """From the sweep file's ``decision`` (as a dict); defaults for what it leaves out."""
        if not spec:
            return cls()
        return cls(
            confidence=float(spec.get("confidence", DEFAULT_CONFIDENCE)),
            threshold=float(spec.get("threshold", DEFAULT_THRESHOLD)),
            prefer=tuple(spec.get("prefer", COSTS)),
            launch_sd=float(spec.get("launch_sd", DEFAULT_LAUNCH_SD)),
        )


def _se(stats: MetricStats) -> float | None:
    if stats.lo is None or stats.hi is None:
        return None
    return standard_error(stats.lo, stats.hi, stats.confidence or DEFAULT_CONFIDENCE)


def decision_se(stats: MetricStats, launch_sd: float) -> float | None:
    """The standard error of ``stats.mean`` a decision uses (None: no interval, an
    exact value). Its interval's, and at least ``sqrt(within^2 + (launch_sd x
    mean)^2 / launches)``: the part its requests give (``within_se``) plus the
    variation between launches, ``launch_sd`` relative, divided among its launches.
    With one launch the interval holds none of that variation; with several, their
    spread already counts, and the floor keeps two launches that happen to agree from
    hiding it."""
    se = _se(stats)
    if se is None:
        return None
    within = stats.within_se if stats.within_se is not None else se
    floor = within * within + (launch_sd * stats.mean) ** 2 / max(1, stats.launches)
    return math.sqrt(max(se * se, floor))


def learned_launch_sd(
    stats: Sequence[MetricStats], stated: float = DEFAULT_LAUNCH_SD, prior: int = PRIOR_LAUNCHES
) -> float:
    """The relative standard deviation between launches, learned from the candidates
    measured in several launches (``stats``: one metric of each candidate): each with
    ``k`` launches brings ``k - 1`` degrees of freedom of its launches' variance less
    the part their requests explain (``k x within_se^2``), relative to its mean;
    pooled with ``stated`` weighted as :data:`PRIOR_LAUNCHES` degrees of freedom, so
    ``stated`` holds until relaunches have measured some."""
    weight = float(prior)
    total = prior * stated * stated
    for st in stats:
        if st.launches < 2 or st.launch_sd is None or st.mean == 0:
            continue
        within = st.within_se or 0.0
        between = (st.launch_sd**2 - st.launches * within * within) / (st.mean * st.mean)
        total += (st.launches - 1) * between
        weight += st.launches - 1
    return math.sqrt(max(0.0, total / weight)) if weight > 0 else stated


def rescaled(stats: MetricStats, confidence: float) -> tuple[float, float] | None:
    """The interval of ``stats`` at ``confidence``: as measured when the confidence is
    the measured one, else symmetric around the mean from its standard error."""
    if stats.lo is None or stats.hi is None:
        return None
    if confidence == (stats.confidence or DEFAULT_CONFIDENCE):
        return stats.lo, stats.hi
    se = _se(stats) or 0.0
    half = z_quantile(confidence) * se
    return stats.mean - half, stats.mean + half


@dataclass(frozen=True)
class Margin:
    """How far ``a`` leads ``b`` on one objective (negative: it trails)."""

    lead: float
    """``a - b`` in the better direction."""
    relative: float
    """``lead / |b|``."""
    uncertainty: float | None
    """Half width of the difference's interval (None: neither value has one)."""
    threshold: float
    confidence: float
    base: float = 0.0
    """``|b|``: what the threshold is relative to."""
    se: float | None = None
    """Standard error of the difference (None: neither value has an interval)."""

    @property
    def beyond_noise(self) -> bool:
        return self.lead > (self.uncertainty or 0.0)

    @property
    def practical(self) -> bool:
        return self.relative > self.threshold

    @property
    def decisive(self) -> bool:
        return self.beyond_noise and self.practical

    @property
    def equivalence_bound(self) -> float | None:
        """The largest relative difference the equivalence test leaves possible: the
        far end of the difference's interval at ``1 - 2 alpha`` (90 % for a 95 %
        decision), relative to ``base`` (None: no base)."""
        if self.base <= 0:
            return None
        half = 0.0 if self.se is None else z_quantile(2 * self.confidence - 1) * self.se
        return (abs(self.lead) + half) / self.base

    @property
    def equivalent(self) -> bool:
        """Equivalent within the threshold (TOST at ``alpha = 1 - confidence``): the
        whole interval of the difference at ``1 - 2 alpha`` lies inside ``± threshold``,
        so neither leads by a difference that counts, however long it is measured."""
        bound = self.equivalence_bound
        return bound is not None and bound < self.threshold

    def describe(self) -> str:
        """``leads by 2.3 % (±0.8 % at 95 %)``, saying what keeps it from deciding."""
        text = f"leads by {self.relative:.1%}"
        if self.uncertainty is not None and self.lead != 0:
            rel = self.uncertainty / abs(self.lead) * abs(self.relative)
            shown = f"{self.confidence:.1%}".replace(".0%", "%")  # 95%, 99.5% (family-wise)
            text += f" (±{rel:.1%} at {shown})"
        if not self.beyond_noise:
            text += ", within its uncertainty"
        elif not self.practical:
            text += f", below the {self.threshold:.0%} threshold"
        return text


def margin(
    a: MetricStats, b: MetricStats, direction: str, rules: Rules, launch_sd: float | None = None
) -> Margin:
    """How far ``a`` leads ``b`` (``direction`` ``max`` or ``min``) under ``rules``;
    each mean's standard error is :func:`decision_se`'s, with ``launch_sd`` (default
    ``rules.launch_sd``)."""
    lead = a.mean - b.mean if direction == "max" else b.mean - a.mean
    base = abs(b.mean)
    relative = lead / base if base > 0 else (math.inf if lead > 0 else 0.0)
    sd = rules.launch_sd if launch_sd is None else launch_sd
    ses = [s for s in (decision_se(a, sd), decision_se(b, sd)) if s is not None]
    se = math.sqrt(sum(s * s for s in ses)) if ses else None
    uncertainty = None if se is None else z_quantile(rules.confidence) * se
    return Margin(lead, relative, uncertainty, rules.threshold, rules.confidence, base, se)


def tie_set(
    ranked: Sequence[Any],
    stats_of: Callable[[Any, int], MetricStats],
    dirs: Sequence[str],
    rules: Rules,
    launch_sds: Sequence[float] | None = None,
) -> tuple[list[Any], list[tuple[Any, Margin]]]:
    """The candidates tied with the leader, leader first, in ranking order; and, for
    each candidate the leader beat decisively, on which objective's margin.

    ``ranked`` is best first by the means; ``stats_of(candidate, k)`` the stats of
    objective ``k``; ``launch_sds[k]`` its variation between launches (default
    ``rules.launch_sd``). Objective by objective, the leader of those still tied keeps
    the ones it does not decisively beat."""
    tied = list(ranked)
    beaten: list[tuple[Any, Margin]] = []
    for k, direction in enumerate(dirs):
        if len(tied) < 2:
            break
        leader = max(
            tied,
            key=lambda c: (
                stats_of(c, k).mean if direction == "max" else -stats_of(c, k).mean,
                -tied.index(c),
            ),
        )
        keep = [leader]
        for cand in tied:
            if cand is leader:
                continue
            sd = None if launch_sds is None else launch_sds[k]
            m = margin(stats_of(leader, k), stats_of(cand, k), direction, rules, sd)
            if m.decisive:
                beaten.append((cand, m))
            else:
                keep.append(cand)
        tied = sorted(keep, key=ranked.index)
    return tied, beaten


def prefer(
    tied: Sequence[Any],
    costs: Mapping[str, Callable[[Any], float | None]],
    rules: Rules,
) -> tuple[Any, str]:
    """The cheapest of ``tied`` (ranking order breaks what the costs leave equal) and
    why, in words: ``fewest GPUs (1 against 2)``. ``costs[name](candidate)`` is the
    candidate's cost (None: unknown, never cheaper)."""

    def key(cand: Any) -> tuple[float, ...]:
        out = []
        for name in rules.prefer:
            value = costs[name](cand) if name in costs else None
            out.append(math.inf if value is None else value)
        return (*out, float(tied.index(cand)))

    chosen = min(tied, key=key)
    first = tied[0]
    if chosen is first:
        return chosen, "the leader on the objective"
    words = {"gpus": "fewest GPUs", "memory": "least GPU memory", "latency": "lowest latency"}
    for name in rules.prefer:
        fn = costs.get(name)
        if fn is None:
            continue
        mine, theirs = fn(chosen), fn(first)
        if mine is not None and (theirs is None or mine < theirs):
            return chosen, (
                f"{words.get(name, name)} ({format_number(mine)} against "
                f"{format_number(theirs)} for the leader)"
            )
    return chosen, "first in run order"


@dataclass(frozen=True)
class Verdict:
    """A constraint judged with the interval of its value."""

    state: str
    """``met``, ``violated`` or ``uncertain``."""
    value: float
    lo: float | None = None
    hi: float | None = None
    advice: str = ""
    """What would decide an uncertain one."""

    def describe(self) -> str:
        shown = format_number(self.value)
        if self.lo is not None and self.hi is not None:
            shown += f" ({format_number(self.lo)}..{format_number(self.hi)})"
        return f"{shown} ({self.state}{': ' + self.advice if self.advice else ''})"


def judge(con: Constraint, stats: MetricStats, rules: Rules) -> Verdict:
    """``con`` judged on ``stats``: by the mean, and by the interval at
    ``rules.confidence`` whether that judgement is certain."""
    bounds = rescaled(stats, rules.confidence)
    value = stats.mean
    ok = bool(con.check(value))
    if bounds is None or con.op in ("==", "!="):
        # an equality is a fact about what was counted (error_rate == 0), not a bound
        return Verdict("met" if ok else "violated", value)
    lo, hi = bounds
    ends = [bool(con.check(lo)), bool(con.check(hi))]
    if all(ends):
        return Verdict("met", value, lo, hi)
    if not any(ends):
        return Verdict("violated", value, lo, hi)
    distance = abs(value - con.value)
    half = (hi - value) if (con.value > value) else (value - lo)
    if distance <= 0 or half <= 0:
        advice = "the value is at the limit: no amount of measuring decides it"
    else:
        factor = (half / distance) ** 2
        advice = (
            f"{'passes' if ok else 'fails'} by the mean; about {factor:.1f}x the requests, "
            "samples or repeats would decide it"
        )
    return Verdict("uncertain", value, lo, hi, advice)
