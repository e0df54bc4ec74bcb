"""Confidence intervals: the statistics every measured figure's uncertainty comes from.

Pure functions, no I/O (at the sizes one bootstrap sees, a thousand requests at
most, a resample's values are gathered and sorted with numpy: the same values, so
the same statistics, as the units' lists sorted).

- :func:`bootstrap_stats`: a percentile bootstrap over *units* (requests), each unit
  carrying one or more values (a request's TTFT; a request's inter-token latencies),
  with a fixed seed and a bounded number of resamples, so it is deterministic and
  fast. Every statistic of :func:`summary_of` comes from the same resamples.
- :func:`bootstrap_ratio`: the interval of a ratio of sums over the same units
  (tokens over seconds in flight), resampled like the statistics above.
- :func:`subsample` and ``scale_to``: a level of more than :data:`MAX_UNITS` units is
  bootstrapped on a seeded subsample of that many, and each interval is shrunk by
  ``sqrt(m / n)`` around the subsample's own value and moved to the whole level's
  (an m-out-of-n bootstrap): the work is bounded, the interval is the one of all
  ``n`` units, and a level of at most :data:`MAX_UNITS` units gets exactly the
  interval it got before.
- :func:`wilson`: the Wilson score interval of a proportion (a pass rate of 4/5 is
  0.38..0.96 at 95 %, not evidence of >= 0.8).
- :func:`combine`: the interval of a mean over repeats (or launches) from each
  one's own interval and their spread: the wider of the two, so a single noisy
  repeat cannot hide behind a tight one and two lucky repeats cannot hide the noise
  inside each.
- :class:`Interval` and :func:`standard_error`: the form every consumer reads.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servesweep.decide.exact import (
    exact_row_sums,
    exact_segment_sums,
    exact_sum,
    python_choices,
)

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_RESAMPLES",
    "MAX_UNITS",
    "SEED",
    "Combined",
    "Interval",
    "bootstrap_ratio",
    "bootstrap_stats",
    "combine",
    "quantile",
    "standard_error",
    "subsample",
    "summary_of",
    "t_quantile",
    "wilson",
    "z_quantile",
]

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 200
"""Bootstrap resamples of one level (fewer when the level has very many values:
:data:`_WORK_LIMIT`)."""
SEED = 26
"""The bootstrap's fixed seed: the same requests give the same interval."""
MAX_UNITS = 1_000
"""Units (requests) one bootstrap resamples at most: a larger level is bootstrapped
on a seeded subsample of this many, its intervals rescaled to the whole level
(:func:`subsample`), so the intervals after a level of any size cost what those of
a level of a thousand requests do."""
_VALUES_PER_RESAMPLE = 8_000
"""Values one resample sorts at most: units with many values (a request's
inter-token latencies) are thinned to evenly spaced order statistics of their own
values, in proportion to their length, so a level of a million tokens costs what
one of eight thousand does (the between-request variation, which dominates the
interval, is kept whole)."""


@dataclass(frozen=True)
class Interval:
    """A value with its confidence interval ``lo..hi`` at ``confidence``."""

    value: float
    lo: float
    hi: float
    confidence: float = DEFAULT_CONFIDENCE

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2.0

    def overlaps(self, other: Interval) -> bool:
        return self.lo <= other.hi and other.lo <= self.hi


def z_quantile(confidence: float) -> float:
    """The two-sided normal quantile: 1.96 at 0.95."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2.0)


def t_quantile(confidence: float, df: int) -> float:
    """The two-sided Student t quantile (2.262 at 0.95 with 9 degrees of freedom):
    exact for 1 and 2 degrees of freedom, Hill's expansion (error < 0.1 %) above."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    p = 0.5 + confidence / 2.0
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = z_quantile(confidence)
    v = float(df)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / v + g2 / v**2 + g3 / v**3 + g4 / v**4


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), ``q`` in 0..1."""
    n = len(sorted_values)
    if n == 1:
        return float(sorted_values[0])
    pos = (n - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def summary_of(sorted_values: Sequence[float]) -> dict[str, float]:
    """mean, median, p90, p99 of sorted values (the statistics an interval is given for;
    a maximum has none: one more request can always raise it)."""
    return {
        "mean": math.fsum(sorted_values) / len(sorted_values),
        "median": quantile(sorted_values, 0.5),
        "p90": quantile(sorted_values, 0.9),
        "p99": quantile(sorted_values, 0.99),
    }


def bootstrap_stats(
    groups: Sequence[Sequence[Sequence[float]]],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = SEED,
    statistic: Callable[[Sequence[float]], dict[str, float]] = summary_of,
    scale_to: int | None = None,
    centers: Sequence[Mapping[str, float] | None] | None = None,
) -> list[dict[str, tuple[float, float]]]:
    """Percentile-bootstrap intervals of ``statistic`` for several measures of the
    same units at once.

    ``groups[g][u]`` is the values of unit ``u`` (a request) for measure ``g`` (TTFT,
    ITL...); every group has the same units, in the same order (a unit may have no
    values for a measure). Each resample draws the units with replacement once and
    evaluates every measure on it, so the measures' intervals come from the same
    resampled requests. Returns, per group, ``{stat: (lo, hi)}``; empty for a group
    with fewer than two values or with fewer than two units.

    ``scale_to`` and ``centers``: the units are a subsample of a level of
    ``scale_to`` units whose statistics are ``centers[g]`` (:func:`subsample`); each
    interval is rescaled to the whole level (:func:`_rescaled`). A statistic missing
    from ``centers[g]`` gets no interval then.
    """
    if not groups:
        return []
    n = len(groups[0])
    if any(len(g) != n for g in groups):
        raise ValueError("every group must have the same units")
    out: list[dict[str, tuple[float, float]]] = [{} for _ in groups]
    live = [i for i, g in enumerate(groups) if sum(len(u) for u in g) >= 2]
    if n < 2 or not live:
        return out
    groups = _thinned(groups, live)
    columns = {i: _UnitValues(groups[i]) for i in live}
    draws: list[dict[str, list[float]]] = [{} for _ in groups]
    for block in python_choices(seed, n, n, resamples):
        for i in live:
            runs = []
            for picks in block:
                drawn = columns[i].drawn(picks)
                if len(drawn):
                    drawn.sort()
                    runs.append(drawn)
            if statistic is summary_of:
                stats = _summaries(runs)  # the same numbers, for every resample at once
            else:
                stats = _listed(statistic(run.tolist()) for run in runs)
            for name, vs in stats.items():
                draws[i].setdefault(name, []).extend(vs)
    alpha = (1.0 - confidence) / 2.0
    for i in live:
        own: Mapping[str, float] = {}
        whole: Mapping[str, float] | None = None
        if scale_to is not None and scale_to > n:
            whole = (centers[i] if centers is not None else None) or {}
            values = sorted(v for u in groups[i] for v in u)
            own = statistic(values) if values else {}
        for name, vals in draws[i].items():
            vals.sort()
            found = (quantile(vals, alpha), quantile(vals, 1.0 - alpha))
            if whole is None:
                out[i][name] = found
            elif name in whole and name in own:
                out[i][name] = _rescaled(found, own[name], whole[name], n, scale_to or n)
    return out


def _listed(stats: Iterable[Mapping[str, float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for one in stats:
        for name, v in one.items():
            out.setdefault(name, []).append(v)
    return out


def _summaries(runs: Sequence[npt.NDArray[np.float64]]) -> dict[str, list[float]]:
    """:func:`summary_of` of each sorted run, computed for every run at once: the
    mean from the exact sum (``math.fsum``'s), the quantiles interpolated as
    :func:`quantile` does, in the same float operations: the same numbers."""
    if not runs:
        return {}
    lengths = np.fromiter(map(len, runs), dtype=np.int64, count=len(runs))
    values = np.concatenate(runs)
    starts = np.cumsum(lengths) - lengths
    sums = np.asarray(exact_segment_sums(values, lengths), dtype=np.float64)
    out = {"mean": (sums / lengths).tolist()}
    last = lengths - 1
    for name, q in (("median", 0.5), ("p90", 0.9), ("p99", 0.99)):
        pos = last * q
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, last)
        x, y = values[starts + lo], values[starts + hi]
        at = x + (y - x) * (pos - lo)
        out[name] = np.where(lengths == 1, x, at).tolist()
    return out


class _UnitValues:
    """The values of every unit of one measure in one array: a resample's values are
    gathered at once (numpy), not unit by unit; sorted, they are the list the units'
    values make, so every statistic is the same number."""

    def __init__(self, units: Sequence[Sequence[float]]) -> None:
        self.lengths = np.fromiter(map(len, units), dtype=np.int64, count=len(units))
        self.values = np.fromiter(
            (v for u in units for v in u), dtype=np.float64, count=int(self.lengths.sum())
        )
        self.starts = np.zeros(len(units), dtype=np.int64)
        if len(units) > 1:
            np.cumsum(self.lengths[:-1], out=self.starts[1:])
        self.single = bool((self.lengths == 1).all())

    def drawn(self, picks: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """The values of the units ``picks`` (a unit drawn twice gives them twice)."""
        if self.single:
            return self.values[picks]
        counts = self.lengths[picks]
        total = int(counts.sum())
        if not total:
            return self.values[:0]
        offsets = np.zeros(len(counts), dtype=np.int64)
        np.cumsum(counts[:-1], out=offsets[1:])
        at = np.arange(total, dtype=np.int64) + np.repeat(self.starts[picks] - offsets, counts)
        return self.values[at]


def subsample(n: int, m: int = MAX_UNITS, seed: int = SEED) -> list[int] | None:
    """Indices (ascending) of a seeded subsample of ``m`` of ``n`` units drawn without
    replacement; None when ``n <= m`` (every unit is used)."""
    if n <= m:
        return None
    return sorted(random.Random(seed).sample(range(n), m))


def _rescaled(
    bounds: tuple[float, float], own: float, whole: float, m: int, n: int
) -> tuple[float, float]:
    """A subsample's percentile interval ``bounds`` (of ``m`` units, around its own
    value ``own``) as the interval of the whole level (``n`` units, value ``whole``):
    its deviations shrunk by ``sqrt(m / n)`` (the standard error of a mean, a ratio or
    a quantile falls as one over the square root of the units)."""
    f = math.sqrt(m / n)
    return whole + (bounds[0] - own) * f, whole + (bounds[1] - own) * f


def _thinned(
    groups: Sequence[Sequence[Sequence[float]]], live: Sequence[int]
) -> list[Sequence[Sequence[float]]]:
    """``groups`` with the units of many values thinned (see :data:`_VALUES_PER_RESAMPLE`)."""
    single = sum(len(groups[i]) for i in live if all(len(u) <= 1 for u in groups[i]))
    multi = [i for i in live if any(len(u) > 1 for u in groups[i])]
    many = sum(sum(len(u) for u in groups[i]) for i in multi)
    budget = max(_VALUES_PER_RESAMPLE - single, _VALUES_PER_RESAMPLE // 4)
    if many <= budget:
        return list(groups)
    keep = budget / many
    out: list[Sequence[Sequence[float]]] = list(groups)
    for i in multi:
        units: list[list[float]] = []
        for unit in groups[i]:
            if len(unit) <= 1:
                units.append(list(unit))
                continue
            ordered = sorted(unit)
            r = max(1, round(len(ordered) * keep))
            units.append([quantile(ordered, (j + 0.5) / r) for j in range(r)])
        out[i] = units
    return out


def bootstrap_ratio(
    numerators: Sequence[Sequence[float]],
    denominator: Sequence[float],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = SEED,
    scale_to: int | None = None,
    centers: Sequence[float] | None = None,
) -> list[tuple[float, float] | None]:
    """Percentile-bootstrap intervals of ``sum(numerator) / sum(denominator)`` over
    units (requests), for several numerators sharing one denominator: unit ``u`` has
    ``numerators[k][u]`` and ``denominator[u]``. None for a numerator with fewer than
    two units or a zero denominator. ``scale_to`` and ``centers``: the units are a
    subsample of ``scale_to`` units whose ratios are ``centers`` (as in
    :func:`bootstrap_stats`)."""
    n = len(denominator)
    if n < 2 or any(len(x) != n for x in numerators):
        return [None for _ in numerators]
    den = np.asarray(denominator, dtype=np.float64)
    nums = [np.asarray(num, dtype=np.float64) for num in numerators]
    draws: list[list[float]] = [[] for _ in numerators]
    for picks in python_choices(seed, n, n, resamples):
        dens = exact_row_sums(den[picks])
        sums = [exact_row_sums(num[picks]) for num in nums]
        for r, d in enumerate(dens):
            if d <= 0:
                continue
            for k, s in enumerate(sums):
                draws[k].append(s[r] / d)
    alpha = (1.0 - confidence) / 2.0
    out: list[tuple[float, float] | None] = []
    den_all = exact_sum(den)
    for k, vals in enumerate(draws):
        if len(vals) < 2:
            out.append(None)
            continue
        vals.sort()
        found = (quantile(vals, alpha), quantile(vals, 1.0 - alpha))
        if scale_to is not None and scale_to > n and centers is not None:
            own = exact_sum(nums[k]) / den_all if den_all > 0 else math.nan
            found = _rescaled(found, own, centers[k], n, scale_to)
        out.append(found)
    return out


def wilson(
    successes: int, total: int, *, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float, float] | None:
    """The Wilson score interval of ``successes / total``; None when ``total`` is 0."""
    if total <= 0:
        return None
    z = z_quantile(confidence)
    p = successes / total
    denom = 1.0 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return max(0.0, centre - half), min(1.0, centre + half)


def standard_error(lo: float, hi: float, confidence: float) -> float:
    """The standard error an interval stands for (its half width over the normal
    quantile): how intervals of different confidences and shapes are combined."""
    return max(0.0, hi - lo) / (2.0 * z_quantile(confidence))


@dataclass(frozen=True)
class Combined:
    """A mean over parts (repeats, launches) with its interval and where the
    uncertainty comes from."""

    interval: Interval
    within_se: float
    """Standard error of the mean from the parts' own intervals."""
    between_sd: float | None
    """Standard deviation of the parts' values (None with one part)."""


def combine(
    parts: Sequence[tuple[float, float | None, float | None]],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    part_confidence: float = DEFAULT_CONFIDENCE,
) -> Combined | None:
    """The mean of ``parts`` (each ``(value, lo, hi)``, bounds None when the part has
    no interval) with its interval at ``confidence``.

    The standard error of the mean is the larger of the one the parts' own intervals
    give (``sqrt(sum se_i^2) / n``) and the one their spread gives (``sd / sqrt(n)``):
    the first is all there is with one part, the second catches what varies between
    parts (a launch's CUDA graphs, a repeat's cold cache) that no part sees inside
    itself. None when there is no interval at all (one part without bounds)."""
    if not parts:
        return None
    values = [p[0] for p in parts]
    n = len(values)
    mean = math.fsum(values) / n
    ses = [
        standard_error(lo, hi, part_confidence)
        for _, lo, hi in parts
        if lo is not None and hi is not None
    ]
    within = math.sqrt(math.fsum(s * s for s in ses)) / len(ses) if ses else 0.0
    between_sd = statistics.stdev(values) if n > 1 else None
    if not ses and between_sd is None:
        return None
    se = max(within, between_sd / math.sqrt(n) if between_sd is not None else 0.0)
    half = z_quantile(confidence) * se
    if n == 1 and confidence == part_confidence:
        lo, hi = parts[0][1], parts[0][2]
        assert lo is not None and hi is not None
        return Combined(Interval(mean, lo, hi, confidence), within, None)
    return Combined(Interval(mean, mean - half, mean + half, confidence), within, between_sd)
