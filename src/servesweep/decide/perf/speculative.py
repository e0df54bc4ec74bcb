"""The structural model of speculative decoding: acceptance apart from step cost.

Acceptance depends on the target, the drafter, the text and the temperature, not on the
GPUs or the batch: it is one curve per sweep, ``alpha_i``, the probability that draft
position ``i`` is accepted once the positions before it were. A step then emits
``E[L](k) = 1 + sum_{i<=k} prod_{j<=i} alpha_j`` tokens per sequence with ``k`` drafted.
The engines' per-position counters (``accepted_per_pos`` over ``drafts``) give the
cumulative rates ``r_i = prod_{j<=i} alpha_j`` directly, as far as the longest draft
counted (past it the last rate goes on, within the family's decays below: an
interval); without them the curve is
fitted from acceptance lengths measured at a few draft lengths, as
``alpha_i = a * d**(i - 1)`` (``d = 1``: a constant rate), and every ``(a, d)`` that
fits them within the measurement's noise is kept, so a draft length far beyond the
measured ones gets the spread of all curves that agree with what was measured.

The cost of a step depends on the batch (concurrency ``c``) and on how many tokens are
drafted and verified, never on the text: each measured level gives a step time
``T = c * E[L] / throughput``. It is fitted, with non-negative coefficients, by several
cost shapes that all start from a fixed part, a part per sequence and the cost of
switching speculation on, and differ in how drafting grows with ``k`` (linearly, as
``log2(1 + k)``, as ``sqrt(k)``; each also per sequence). Throughput is
``c * E[L](k) / T(c, k)``. The value is the median of the shapes' best fits (a draft
model on CPUs, whose every drafted token costs a pass of the draft and a share of the
target's, takes the linear shape, and where its fits tie (one draft length measured:
switching on and per token fit alike), switching on costing as much as one
drafted token; on GPUs, below the shortest of two or more draft lengths measured, a
draft model's step is read between no draft and that length the same way); the
interval is the envelope of every non-negative fit, of every shape and subset of its
terms that keeps a cost for a step without a draft (the target's pass), that agrees
with the measurements within their noise (chi-square, as for the acceptance curves:
from no draft and one draft length alone, a draft's cost may all be the switching on
of speculation or all per drafted token, and the interval holds both), and of the
acceptance curves, widened by the residuals and by a term that grows with the distance
(in doublings of ``k``) to the nearest measured draft length, at the rate the
measurements themselves show when each measured draft length is predicted from the
others (leave one out).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "AcceptanceFit",
    "StepCostFit",
    "StepTime",
    "accepted_length",
    "alphas_from_rates",
    "fit_acceptance",
    "fit_step_cost",
    "predict_throughput",
]

NOISE = 0.02
"""Relative noise of one measured acceptance length or step time (a level's figure)."""
TIE = 1e-12
"""Squared error (relative, summed over the points) within which two fits fit alike."""
GROWTH = 0.25
"""Relative error per doubling of the draft length away from the measured ones, until
three draft lengths let the measurements say (leave one out)."""


def accepted_length(alphas: Sequence[float], k: int) -> float:
    """``E[L](k) = 1 + sum_{i<=k} prod_{j<=i} alpha_j``; positions past the curve's end
    take its last rate."""
    total, run = 1.0, 1.0
    for i in range(k):
        run *= alphas[min(i, len(alphas) - 1)] if alphas else 0.0
        total += run
    return total


def alphas_from_rates(rates: Sequence[float]) -> tuple[float, ...]:
    """Conditional acceptance per position from the cumulative rates the engines count
    (position ``i`` accepted in a fraction ``r_i`` of the drafts)."""
    out: list[float] = []
    previous = 1.0
    for rate in rates:
        out.append(min(1.0, rate / previous) if previous > 0 else 0.0)
        previous = rate
    return tuple(out)


_A_GRID = tuple(i / 200 for i in range(1, 200))
_D_GRID = tuple(0.5 + i / 100 for i in range(51))


@dataclass(frozen=True)
class AcceptanceFit:
    """The acceptance curves that agree with the measurements: ``(a, d)`` pairs, or the
    measured per-position curve (``curves`` with one entry, exact)."""

    best: tuple[float, ...]
    """The curve that fits best: the predicted value."""
    curves: tuple[tuple[float, ...], ...]
    """Each a conditional acceptance per position (the last rate repeats): those that
    agree with the measurements, the interval."""
    measured: Mapping[int, float]
    """Draft length -> acceptance length measured (returned as is for those)."""

    def length(self, k: int) -> tuple[float, float, float]:
        """(value, low, high) of ``E[L](k)``."""
        if k <= 0:
            return 1.0, 1.0, 1.0
        if k in self.measured:
            value = self.measured[k]
            return value, value * (1 - 2 * NOISE), value * (1 + 2 * NOISE)
        values = [accepted_length(c, k) for c in self.curves]
        return accepted_length(self.best, k), min(values), max(values)


def fit_acceptance(
    lengths: Mapping[int, float], rates: Sequence[float] = (), noise: float = NOISE
) -> AcceptanceFit | None:
    """The acceptance curves from per-position rates (``rates``, exact as far as they
    go) or from acceptance lengths per draft length (``lengths``); None from neither."""
    measured = {k: v for k, v in lengths.items() if k > 0}
    if rates:
        # exact as far as the engine counted; past its last position the rate is not
        # known: it goes on as the family's curves do, from constant (the value) to
        # falling by the family's steepest decay per position (the interval)
        alphas = alphas_from_rates(rates)
        depth = max(32, len(alphas) * 2) - len(alphas)

        def going_on(d: float) -> tuple[float, ...]:
            return alphas + tuple(alphas[-1] * d**j for j in range(1, depth + 1))

        return AcceptanceFit(alphas, tuple(going_on(d) for d in _D_GRID), measured)
    if not measured:
        return None
    a, d = np.meshgrid(np.array(_A_GRID), np.array(_D_GRID), indexing="ij")
    sse = np.zeros_like(a)
    for k, v in measured.items():
        run, length = np.ones_like(a), np.ones_like(a)
        for i in range(k):
            run = run * a * d**i
            length = length + run
        sse += ((length - v) / (v * noise)) ** 2
    least = float(sse.min())
    at = np.unravel_index(int(sse.argmin()), sse.shape)
    best_a, best_d = float(a[at]), float(d[at])
    # the curves within the noise: chi-square with 2 parameters, 95 % (5.99) above the best
    keep = sse <= least + 5.99
    kept = list(zip(a[keep].tolist(), d[keep].tolist(), strict=True))
    depth = max(32, max(measured) * 2)

    def curve(a: float, d: float) -> tuple[float, ...]:
        return tuple(a * d**i for i in range(depth))

    return AcceptanceFit(curve(best_a, best_d), tuple(curve(a, d) for a, d in kept), measured)


@dataclass(frozen=True)
class StepTime:
    """One measured level as the cost model reads it."""

    concurrency: float
    draft: int
    seconds: float
    """Step time: ``concurrency * acceptance length / throughput``."""


Shape = Callable[[float, int], tuple[float, ...]]


def _shape(grow: Callable[[int], float]) -> Shape:
    return lambda c, k: (1.0, c, float(k > 0), grow(k), c * grow(k))


SHAPES: dict[str, Shape] = {
    "linear": _shape(float),
    "log": _shape(lambda k: math.log2(1 + k)),
    "sqrt": _shape(lambda k: math.sqrt(k)),
}
"""How drafting and verifying grow with the draft length (features of the step time)."""


def _subset_fits(a: np.ndarray, y: np.ndarray) -> list[tuple[float, np.ndarray]]:
    """Every least-squares fit over a subset of the columns whose coefficients are all
    non-negative, as ``(sse, coefficients)``, the smaller subsets first (the cost shapes
    have five columns: 31 subsets)."""
    out = []
    columns = a.shape[1]
    for size in range(1, columns + 1):
        for keep in itertools.combinations(range(columns), size):
            sub = a[:, keep]
            coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(columns)
            full[list(keep)] = coef
            out.append((float(((sub @ coef - y) ** 2).sum()), full))
    return out


def _best(fits: Sequence[tuple[float, np.ndarray]], columns: int) -> list[np.ndarray]:
    """Least squares with non-negative coefficients, from :func:`_subset_fits`' fits:
    the smallest subset of the columns with the least squared error (the first such in
    the columns' order: the cost of switching speculation on before that per drafted
    token), then every other subset of its size that fits exactly as well (from draft
    lengths 0 and 1 alone, the switching on and the drafted token fit alike)."""
    best: tuple[float, np.ndarray] | None = None
    for sse, coef in fits:
        if best is None or sse < best[0] - 1e-15:
            best = (sse, coef)
    if best is None:
        return [np.zeros(columns)]
    size = int((best[1] != 0).sum())
    tied = [
        coef
        for sse, coef in fits
        if coef is not best[1]
        and sse <= best[0] + TIE
        and int((coef != 0).sum()) == size
        and (coef[0] > 0 or coef[1] > 0)  # a step without a draft still runs the target
    ]
    return [best[1], *tied]


def _time(name: str, coef: Sequence[float] | np.ndarray, concurrency: float, draft: int) -> float:
    """The step time shape ``name`` with ``coef`` gives."""
    return float(np.dot(SHAPES[name](concurrency, draft), coef))


def _value(
    best: Mapping[str, Sequence[Sequence[float] | np.ndarray]],
    concurrency: float,
    draft: int,
    sequential: bool = False,
    measured: int | None = None,
) -> float:
    """The value of the step time. A drafter without a model (ngram lookup) costs next
    to nothing, and the step grows with the draft length as the target verifies it, in
    one pass; on a GPU at a small batch a small draft model's passes and the target's
    are bound by memory: there the median of the shapes' best fits (on an H100 the step
    time grew unlike any one shape, and the median of the three predicted it best), each
    the first of its ties (the switching on of speculation). A draft model on CPUs drafts
    each token in a pass of its own, and the target verifies each at a cost of its own
    (``sequential``, ``Setting.cpu``): the linear shape. Where one draft length alone
    was measured (``measured``, ``m``) its best fits tie: the draft's cost there, ``D``
    over no draft, may be all the switching on of speculation (flat in ``k``) or all per
    drafted token. The value takes switching on to cost as much as one drafted token,
    ``D (1 + k) / (1 + m)`` over no draft (the flat fit weighted 1, the per-token fit
    ``m``): from draft length 1 halfway between them, and from a longer one the same
    split (their middle would make switching on cost ``m`` drafted tokens, more the
    longer the draft measured). Other ties: the middle of what they give."""
    if sequential:
        fits = best["linear"]
        times = [_time("linear", c, concurrency, draft) for c in fits]
        # the columns (_shape): fixed, per sequence, switching on, per drafted token,
        # per drafted token and sequence; a tied fit reads the draft's cost as
        # switching on where it has that column, else per drafted token
        flat = [t for t, c in zip(times, fits, strict=True) if c[2] > 0]
        token = [t for t, c in zip(times, fits, strict=True) if c[2] == 0]
        if measured and flat and token:
            return (sum(flat) / len(flat) + measured * sum(token) / len(token)) / (1 + measured)
        return (min(times) + max(times)) / 2
    values = sorted(_time(n, fits[0], concurrency, draft) for n, fits in best.items())
    return values[len(values) // 2]


def _point(
    best: Mapping[str, Sequence[Sequence[float] | np.ndarray]],
    concurrency: float,
    draft: int,
    sequential: bool,
    model: bool,
    drafts: Iterable[int],
) -> float:
    """The value of the step time at ``draft`` from the draft lengths ``drafts``
    measured: :func:`_value`, but where a draft model's step is asked below the shortest
    draft length measured, ``m``, of two or more: there the shapes extrapolate their
    bends towards no draft, where they disagree most (on an H200 two of the three put
    the step of draft lengths 1 and 2 too high from 4, 8 and 16), and the value is read
    between the two measured ends instead, switching speculation on costing as much as
    one drafted token, as from one draft length on CPUs: ``t(0) + (t(m) - t(0)) (1 + k)
    / (1 + m)``."""
    drafted = sorted(d for d in drafts if d > 0)
    if model and not sequential and len(drafted) > 1 and 0 < draft < drafted[0]:
        shortest = drafted[0]
        none = _value(best, concurrency, 0)
        there = _value(best, concurrency, shortest)
        return none + (there - none) * (1 + draft) / (1 + shortest)
    measured = drafted[0] if len(drafted) == 1 else None
    return _value(best, concurrency, draft, sequential, measured)


CHI2 = 3.84
"""Chi-square of one degree of freedom at 95 %: a fit whose squared error (in units of
the noise) is within this of the best agrees with the measurements."""

Fit = tuple[str, tuple[float, ...]]
"""A cost shape's name and its coefficients."""


@dataclass(frozen=True)
class StepCostFit:
    coefficients: Mapping[str, tuple[tuple[float, ...], ...]]
    """Per shape, its best fits' coefficients (the fewest columns with the least error:
    the first in the columns' order, then every other that fits exactly as well; from
    draft lengths 0 and 1 alone, the cost of switching speculation on and the cost per
    drafted token fit alike)."""
    residual: float
    """Relative residual (root mean square over the shapes and points, at least the noise)."""
    growth: float
    """Relative error added per doubling of the draft length away from a measured one."""
    drafts: tuple[int, ...]
    """The draft lengths measured."""
    agreeing: tuple[Fit, ...] = ()
    """Every non-negative fit, of every shape and subset of its columns, that agrees
    with the measurements within their noise: the interval. From draft lengths 0 and 1
    alone, all of a draft's cost may be the switching on of speculation (flat in the
    draft length) or all per drafted token, and both are kept."""
    sequential: bool = False
    """Whether a draft model drafts on CPUs, at a cost per drafted token: the value's
    rule (:func:`_value`)."""
    model: bool = False
    """Whether a draft model drafts (on GPUs or CPUs): below the shortest draft length
    measured the value is read between no draft and it (:func:`_point`)."""

    def seconds(self, concurrency: float, draft: int) -> tuple[float, float, float]:
        """(value, low, high) of the step time before widening: the value
        (:func:`_value`), and the ends of what every agreeing fit gives."""
        best = [(n, cs[0]) for n, cs in self.coefficients.items()]
        if self.sequential:  # the value is the middle of the linear shape's ties
            best += [("linear", c) for c in self.coefficients["linear"][1:]]
        fits = (*self.agreeing, *best)
        values = [_time(name, coef, concurrency, draft) for name, coef in fits]
        value = _point(
            self.coefficients, concurrency, draft, self.sequential, self.model, self.drafts
        )
        return min(max(value, min(values)), max(values)), min(values), max(values)

    def spread(self, draft: int) -> float:
        """Relative half-width to add: the residual, and the growth per doubling of the
        distance to the nearest measured draft length."""
        distance = min(abs(math.log2(1 + draft) - math.log2(1 + m)) for m in self.drafts)
        return 2 * self.residual + self.growth * distance


def _fit(points: Sequence[StepTime], noise: float) -> tuple[dict[str, list[np.ndarray]], list[Fit]]:
    """The best fits of each shape (the value is their median: on an H100 the step time
    grew unlike any one shape, and the median of the three predicted it best), and
    every fit of every shape whose squared error is within chi-square of the least of
    all (in units of the noise, or of the best fit's own residual where that is
    larger): the fits that agree with the points as well as the best does."""
    best: dict[str, list[np.ndarray]] = {}
    every: list[tuple[float, Fit]] = []
    for name, shape in SHAPES.items():
        # relative error: each row over its time
        a = np.array([shape(p.concurrency, p.draft) for p in points]) / np.array(
            [[p.seconds] for p in points]
        )
        fits = _subset_fits(a, np.ones(len(points)))
        best[name] = _best(fits, a.shape[1])
        every += [
            (sse, (name, tuple(float(x) for x in coef)))
            for sse, coef in fits
            if coef[0] > 0 or coef[1] > 0  # a step without a draft still runs the target
        ]
    if not every:
        return best, []
    least = min(sse for sse, _ in every)
    sigma2 = max(noise * noise, least / len(points))
    return best, [fit for sse, fit in every if sse <= least + CHI2 * sigma2]


def fit_step_cost(
    points: Iterable[StepTime],
    noise: float = NOISE,
    sequential: bool = False,
    model: bool = False,
) -> StepCostFit | None:
    """The step cost fitted from the measured levels (None from fewer than two draft
    lengths, counting no speculation as one); ``sequential``: a draft model drafts on
    CPUs, at a cost per drafted token (:func:`_value`); ``model``: a draft model drafts
    (:func:`_point`). A pure function of its inputs, kept for the last few hundred: a
    search predicts every configuration at each step, and between two launches the
    points of most configurations stay the same."""
    pts = tuple(points)
    if len({p.draft for p in pts}) < 2:
        return None
    return _fit_step_cost(pts, noise, sequential, model)


@functools.lru_cache(maxsize=512)
def _fit_step_cost(
    pts: tuple[StepTime, ...], noise: float, sequential: bool, model: bool
) -> StepCostFit:
    drafts = tuple(sorted({p.draft for p in pts}))
    coefs, agreeing = _fit(pts, noise)
    shapes = ("linear",) if sequential else tuple(coefs)
    errors = [
        _time(name, coefs[name][0], p.concurrency, p.draft) / p.seconds - 1
        for name in shapes
        for p in pts
    ]
    residual = max(noise, math.sqrt(sum(e * e for e in errors) / len(errors)))
    growth = 0.0
    tried = False
    for left in (d for d in drafts if d > 0):  # leave each draft length out, predict it
        rest = [p for p in pts if p.draft != left]
        if len({p.draft for p in rest if p.draft > 0}) < 2:
            continue  # the cost of switching speculation on and of a draft token: two
        tried = True
        sub, _ = _fit(rest, noise)
        kept = {p.draft for p in rest}
        distance = min(abs(math.log2(1 + left) - math.log2(1 + m)) for m in kept)
        for p in (p for p in pts if p.draft == left):
            value = _point(sub, p.concurrency, p.draft, sequential, model, kept)
            miss = abs(value / p.seconds - 1)
            growth = max(growth, max(0.0, miss - 2 * residual) / max(distance, 1e-9))
    if not tried:
        growth = GROWTH  # too few draft lengths to tell: the prior rate
    return StepCostFit(
        {n: tuple(tuple(float(x) for x in c) for c in cs) for n, cs in coefs.items()},
        residual,
        growth,
        drafts,
        tuple(agreeing),
        sequential,
        model or sequential,
    )


def predict_throughput(
    acceptance: AcceptanceFit,
    cost: StepCostFit,
    concurrency: float,
    draft: int,
    first: StepCostFit | None = None,
    tokens: float | None = None,
) -> tuple[float, float, float] | None:
    """(value, low, high) of the output throughput at ``concurrency`` with ``draft``
    tokens drafted per step: ``c * E[L](k) / T(c, k)`` (None where a fit that agrees
    with the measurements gives a step no time: they do not bound it); with the time to
    the first token fitted apart (``first``, the same shapes) and the tokens of an answer
    (``tokens``, ``n``), a request of ``c`` in flight takes the first token's time and
    ``n - 1`` tokens at ``T / E[L]`` each: ``c * n / (TTFT + (n - 1) * T / E[L])``."""
    length, length_low, length_high = acceptance.length(draft)
    step, step_low, step_high = cost.seconds(concurrency, draft)
    if step <= 0 or step_low <= 0:
        return None  # a fit that agrees with the measurements gives no time: unknown
    spread = cost.spread(draft)
    if first is None or tokens is None or tokens <= 1:
        value = concurrency * length / step
        low = concurrency * length_low / step_high * (1 - spread)
        high = concurrency * length_high / step_low * (1 + spread)
        return value, max(0.0, low), high
    ttft, ttft_low, ttft_high = first.seconds(concurrency, draft)
    spread = max(spread, first.spread(draft))
    n = tokens

    def throughput(ttft: float, step: float, length: float) -> float:
        seconds = ttft + (n - 1) * step / length
        return concurrency * n / seconds if seconds > 0 else math.inf

    value = throughput(ttft, step, length)
    # widened as the throughput of the steps alone is: by the spread of the time that
    # is less known (the step's or the first token's), either side of the envelope
    low = max(0.0, throughput(ttft_high, step_high, length_low) * (1 - spread))
    high = throughput(ttft_low, step_low, length_high) * (1 + spread)
    return value, low, high
