"""The intervals of one level's key metrics, computed from its requests.

The load generator calls :func:`level_intervals` on the samples it just measured;
reports call it on the samples a results database kept when the level was stored
without intervals (a database from before intervals existed), so both give the same
numbers. Pure functions over :class:`~servesweep.models.RequestSample` and
:class:`~servesweep.models.EvalTaskResult`; the statistics are
:mod:`servesweep.decide.intervals`. docs/metrics.md ("Uncertainty") says the same in words:

- latency statistics (mean, median, p90, p99 of TTFT, TPOT, ITL, E2E): a bootstrap
  over the completed requests (a request's inter-token latencies travel together);
- throughputs (requests, output, input, total tokens, goodput): by Little's law, the
  mean number in flight (set by the load) times the requests' tokens per second in
  flight, bootstrapped over the requests;
- acceptance length: the bootstrap of the tokens per decode chunk over requests,
  its relative width applied to the engine counters' value when those decided it;
- pass rates and error rates: the Wilson interval.

A level of more than :data:`~servesweep.decide.intervals.MAX_UNITS` completed requests is
bootstrapped on a seeded subsample of that many, its intervals rescaled to the whole
level around the whole level's figures (:func:`servesweep.decide.intervals.subsample`): the
work after a level stays bounded at any number of requests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from servesweep import metrics_catalog as mc
from servesweep.decide.exact import exact_sum, order_stats
from servesweep.decide.intervals import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    MAX_UNITS,
    bootstrap_ratio,
    bootstrap_stats,
    subsample,
    wilson,
)
from servesweep.metrics_catalog import Latency, Stat, latency
from servesweep.models import EvalTaskResult, RequestSample
from servesweep.samples import SampleColumns, columns_of

FloatArray = npt.NDArray[np.floating[Any]]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "INTERVAL_METRICS",
    "SLO_KEYS",
    "eval_intervals",
    "good_mask",
    "level_intervals",
    "meets_slo",
]

SLO_KEYS: Mapping[str, str] = {
    "ttft_ms": "ttft",
    "tpot_ms": "tpot",
    "e2e_ms": "e2e",
    "e2el_ms": "e2e",
}
"""A workload's ``slo`` keys and the per-request latency each limits."""

_KINDS = (Latency.TTFT, Latency.TPOT, Latency.ITL, Latency.E2E)
_STATS = (Stat.MEAN, Stat.MEDIAN, Stat.P90, Stat.P99)
_RATES = (
    mc.REQUEST_THROUGHPUT,
    mc.OUTPUT_THROUGHPUT,
    mc.INPUT_THROUGHPUT,
    mc.TOTAL_TOKEN_THROUGHPUT,
    mc.GOODPUT,
)
_MIN_FOR_RATES = 5
"""Completed requests a throughput interval needs at least."""

INTERVAL_METRICS: frozenset[str] = frozenset(
    [latency(k, s).name for k in _KINDS for s in _STATS]
    + [m.name for m in _RATES]
    + [mc.ACCEPTANCE_LENGTH.name, mc.ERROR_RATE.name, mc.PASS_RATE.name]
    + [mc.COST_PER_MTOK.name, mc.TOKENS_PER_DOLLAR.name]
)
"""The metrics that carry an interval."""


def meets_slo(slo: Mapping[str, float], values: Mapping[str, float | None], tokens: int) -> bool:
    """Whether one request meets every SLO (``ttft``/``tpot``/``e2e`` in ms in
    ``values``; TPOT is not defined for one token). Keys outside :data:`SLO_KEYS`
    are ignored."""
    for key, limit in slo.items():
        name = SLO_KEYS.get(key)
        if name is None:
            continue
        value = values[name]
        if value is None:
            if name == "tpot" and tokens <= 1:
                continue
            return False
        if value > limit:
            return False
    return True


def good_mask(
    slo: Mapping[str, float], ttft_ms: FloatArray, e2e_ms: FloatArray, tokens: IntArray
) -> BoolArray:
    """:func:`meets_slo` over many requests at once: their TTFT and E2E in ms (NaN:
    none) and completion tokens; TPOT is computed here as :func:`meets_slo`'s callers
    do (none for one token)."""
    good = np.ones(len(e2e_ms), dtype=np.bool_)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(tokens > 1, (e2e_ms - ttft_ms) / (tokens - 1), np.nan)
    values = {"ttft": ttft_ms, "tpot": tpot, "e2e": e2e_ms}
    for key, limit in slo.items():
        name = SLO_KEYS.get(key)
        if name is None:
            continue
        value = values[name]
        missing = np.isnan(value)
        within = ~missing & (value <= limit)
        if name == "tpot":
            within |= missing & (tokens <= 1)
        good &= within
    return good


def _rates(
    columns: SampleColumns,
    done: IntArray,
    goods: Sequence[bool] | BoolArray,
    duration_s: float,
    confidence: float,
    resamples: int,
    picked: Sequence[int] | None = None,
) -> dict[str, tuple[float, float]]:
    """Throughputs by Little's law: a rate over the level is the mean number of
    requests in flight (``sum(e2e) / duration``, which the load generator's
    concurrency or arrival rate sets) times a per-second-in-flight ratio of the
    requests (tokens / e2e); the ratio is bootstrapped over the requests (over the
    ``picked`` ones, rescaled to all, when the level is subsampled). ``done``: the
    rows of the completed requests."""
    e2e = columns.finished_at[done] - columns.sent_at[done]
    total = exact_sum(e2e)
    if len(done) < _MIN_FOR_RATES or duration_s <= 0 or total <= 0:
        return {}
    in_flight = total / duration_s
    out_tokens = np.maximum(columns.completion_tokens[done], 0).astype(np.float64)
    in_tokens = np.maximum(columns.prompt_tokens[done], 0).astype(np.float64)
    names = [
        mc.REQUEST_THROUGHPUT.name,
        mc.GOODPUT.name,
        mc.OUTPUT_THROUGHPUT.name,
        mc.INPUT_THROUGHPUT.name,
        mc.TOTAL_TOKEN_THROUGHPUT.name,
    ]
    numerators = [
        np.ones(len(done), dtype=np.float64),
        np.asarray(goods, dtype=np.float64),
        out_tokens,
        in_tokens,
        in_tokens + out_tokens,
    ]
    if picked is None:
        found = bootstrap_ratio(
            [num.tolist() for num in numerators],
            e2e.tolist(),
            confidence=confidence,
            resamples=resamples,
        )
    else:
        rows = np.asarray(picked, dtype=np.int64)
        # the exact sum of each numerator (fsum's): whole numbers, summed as integers
        sums = [float(int(num.astype(np.int64).sum())) for num in numerators]
        found = bootstrap_ratio(
            [num[rows].tolist() for num in numerators],
            e2e[rows].tolist(),
            confidence=confidence,
            resamples=resamples,
            scale_to=len(done),
            centers=[whole / total for whole in sums],
        )
    return {
        name: (in_flight * b[0], in_flight * b[1])
        for name, b in zip(names, found, strict=True)
        if b is not None
    }


def level_intervals(
    samples: Sequence[RequestSample],
    *,
    duration_s: float,
    slo: Mapping[str, float] | None = None,
    acceptance: tuple[float, str] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    values: Mapping[str, float] | None = None,
    max_units: int = MAX_UNITS,
) -> dict[str, tuple[float, float]]:
    """``{metric: (lo, hi)}`` at ``confidence`` for one level from its requests.

    ``duration_s`` is the level's ``duration_s`` (the throughputs' denominator);
    ``slo`` the workload's (goodput gets an interval only with it, or when it is
    empty: every completed request is good); ``acceptance`` the stored acceptance
    length and its source (``tokens_per_chunk_estimate`` or the engine's counters).
    A metric with too few requests for an interval is left out.

    More than ``max_units`` completed requests: the bootstrap runs on a seeded
    subsample of ``max_units`` of them and each interval is rescaled to the whole
    level, around the whole level's figure (computed here from every request; for
    the inter-token latencies, which every token of every request would have to be
    sorted for, taken from ``values``, the level's metrics, when it has them).
    """
    columns = columns_of(samples)
    done = np.flatnonzero(columns.done)
    out: dict[str, tuple[float, float]] = {}
    if len(columns):
        failed = int((~columns.ok).sum())
        found = wilson(failed, len(columns), confidence=confidence)
        if found is not None:
            out[mc.ERROR_RATE.name] = found
    picked = subsample(len(done), max_units)
    rows = done if picked is None else done[np.asarray(picked, dtype=np.int64)]
    units = columns.rows(rows.tolist()) if samples is columns else [samples[i] for i in rows]
    per_kind: dict[Latency, list[list[float]]] = {k: [] for k in _KINDS}
    middles: list[list[float]] = []
    for s in units:
        ttft, tpot, e2e, _ = _latencies(s)
        per_kind[Latency.TTFT].append([] if ttft is None else [ttft])
        per_kind[Latency.TPOT].append([] if tpot is None else [tpot])
        per_kind[Latency.ITL].append(_itl(s) if ttft is not None else [])
        per_kind[Latency.E2E].append([] if e2e is None else [e2e])
        middles.append(_middle(s) if ttft is not None else [])
    ttft_ms = columns.ttft[done] * 1e3
    e2e_ms = columns.e2e[done] * 1e3
    tokens = _completion_tokens(columns)[done]
    goods = (
        good_mask(slo, ttft_ms, e2e_ms, tokens)
        if slo
        else np.full(len(done), slo is not None, dtype=np.bool_)
    )  # no SLO: every completed request is good
    groups = [per_kind[k] for k in _KINDS] + [middles]
    centers: list[Mapping[str, float] | None] | None = None
    chunk_estimate = _mean(middles)
    if picked is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot_ms = np.where(tokens > 1, (e2e_ms - ttft_ms) / (tokens - 1), np.nan)
        whole = {
            Latency.TTFT: ttft_ms[~np.isnan(ttft_ms)],
            Latency.TPOT: tpot_ms[~np.isnan(tpot_ms)],
            Latency.E2E: e2e_ms,
        }
        first = done[~np.isnan(ttft_ms)]
        centers = [_center(k, whole.get(k), columns, first, values) for k in _KINDS]
        # the decode chunks' interval serves the acceptance length only
        chunk_estimate = None if acceptance is None else _decode_chunk_mean(columns, first)
        centers.append(None if chunk_estimate is None else {"mean": chunk_estimate})
    found_stats = bootstrap_stats(
        groups,
        confidence=confidence,
        resamples=resamples,
        scale_to=None if picked is None else len(done),
        centers=centers,
    )
    for kind, stats in zip(_KINDS, found_stats, strict=False):
        for stat in _STATS:
            if stat.value in stats:
                out[latency(kind, stat).name] = stats[stat.value]
    rates = _rates(columns, done, goods, duration_s, confidence, resamples, picked)
    if slo is None:
        rates.pop(mc.GOODPUT.name, None)
    out.update(rates)
    chunk_mean = found_stats[-1].get("mean") if found_stats else None
    if acceptance is not None and chunk_mean is not None:
        value, source = acceptance
        if source == "tokens_per_chunk_estimate" or chunk_estimate is None:
            out[mc.ACCEPTANCE_LENGTH.name] = chunk_mean
        elif chunk_estimate > 0:
            lo, hi = chunk_mean
            out[mc.ACCEPTANCE_LENGTH.name] = (
                value * lo / chunk_estimate,
                value * hi / chunk_estimate,
            )
    return {k: v for k, v in out.items() if all(math.isfinite(x) for x in v)}


def _latencies(s: RequestSample) -> tuple[float | None, float | None, float | None, int]:
    """TTFT, TPOT and E2E of one request in ms, and its completion tokens."""
    e2e = (s.finished_at - s.sent_at) * 1e3 if s.finished_at is not None else None
    ttft = s.ttft * 1e3 if s.ttft is not None else None
    ct = s.completion_tokens if s.completion_tokens is not None else sum(s.chunk_tokens)
    tpot = (e2e - ttft) / (ct - 1) if e2e is not None and ttft is not None and ct > 1 else None
    return ttft, tpot, e2e, ct


def _itl(s: RequestSample) -> list[float]:
    """One request's inter-token latencies in ms: a chunk's gap shared by its tokens."""
    itl: list[float] = []
    for gap, k in zip(s.chunk_gaps, s.chunk_tokens[1:], strict=False):
        if k > 0:
            itl.extend([gap * 1e3 / k] * k)
    return itl


def _middle(s: RequestSample) -> list[float]:
    """Tokens per decode chunk of one request (first and last chunk left out)."""
    return [float(t) for t in s.chunk_tokens[1:-1]]


def _completion_tokens(columns: SampleColumns) -> IntArray:
    """Each request's completion tokens: the server's count, else its chunks' tokens."""
    counted = columns.completion_tokens
    if bool((counted >= 0).all()):
        return counted
    running = np.concatenate(([0], np.cumsum(columns.chunk_tokens)))
    starts = columns.starts
    own = running[starts + columns.chunk_count] - running[starts]
    return np.where(counted >= 0, counted, own)


def _decode_chunk_mean(columns: SampleColumns, rows: IntArray) -> float | None:
    """Mean tokens of the decode chunks of ``rows`` (each one's chunks but its first
    and its last): from each request's total, first and last chunk."""
    counts = columns.chunk_count[rows]
    n = int(np.maximum(counts - 2, 0).sum())
    if not n:
        return None
    some = rows[counts > 0]
    starts, counts = columns.starts[some], columns.chunk_count[some]
    tokens = columns.chunk_tokens
    total = _tokens_of(columns, some)
    firsts = int(tokens[starts].sum())
    lasts = int(tokens[(starts + counts - 1)[counts > 1]].sum())
    return (total - firsts - lasts) / n


def _tokens_of(columns: SampleColumns, rows: IntArray) -> int:
    """The tokens of every chunk of ``rows``: of every chunk less those of the few
    requests left out, else summed request by request."""
    left_out = np.ones(len(columns), dtype=np.bool_)
    left_out[rows] = False
    left_out &= columns.chunk_count > 0
    others = np.flatnonzero(left_out)
    if len(others) > _FEW:
        return int(_token_sums(columns)[rows].sum())
    tokens = columns.chunk_tokens
    starts, counts = columns.starts, columns.chunk_count
    return int(tokens.sum()) - sum(
        int(tokens[starts[i] : starts[i] + counts[i]].sum()) for i in others.tolist()
    )


_FEW = 1_000
"""Requests left out of a sum over chunks that are subtracted one by one."""


def _token_sums(columns: SampleColumns) -> IntArray:
    """Each request's tokens over its chunks (one pass over the chunks: the chunk
    columns hold every request's chunks once, one request's after another's)."""
    sums = np.zeros(len(columns), dtype=np.int64)
    some = np.flatnonzero(columns.chunk_count > 0)
    if len(some):
        some = some[np.argsort(columns.starts[some], kind="stable")]
        sums[some] = np.add.reduceat(columns.chunk_tokens, columns.starts[some])
    return sums


def _runs(starts: IntArray, counts: IntArray) -> IntArray:
    """The positions ``starts[i] .. starts[i] + counts[i] - 1`` of every ``i``, in turn."""
    total = int(counts.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    offsets = np.zeros(len(counts), dtype=np.int64)
    if len(counts) > 1:
        np.cumsum(counts[:-1], out=offsets[1:])
    return np.arange(total, dtype=np.int64) + np.repeat(starts - offsets, counts)


def _center(
    kind: Latency,
    values: FloatArray | None,
    columns: SampleColumns,
    rows: IntArray,
    metrics: Mapping[str, float] | None,
) -> Mapping[str, float] | None:
    """The whole level's statistics of ``kind``: from ``values`` (every request's),
    or for ITL from the level's ``metrics`` (else from every token of ``rows``)."""
    if kind is Latency.ITL:
        names = {stat.value: latency(kind, stat).name for stat in _STATS}
        if metrics is not None and all(n in metrics for n in names.values()):
            return {stat: float(metrics[n]) for stat, n in names.items()}
        # a gap with the tokens of the chunk it ended (as many as both have)
        pairs = np.minimum(columns.gap_count[rows], np.maximum(columns.chunk_count[rows] - 1, 0))
        gaps = columns.chunk_gaps[_runs(columns.gap_starts[rows], pairs)]
        k = columns.chunk_tokens[_runs(columns.starts[rows] + 1, pairs)]
        some = k > 0
        values = np.repeat(gaps[some] * 1e3 / k[some], k[some])
    if values is None or not len(values):
        return None
    return _summary(values)


def _summary(values: FloatArray) -> dict[str, float]:
    """:func:`~servesweep.decide.intervals.summary_of` of ``values`` sorted, the same
    numbers: the mean ``math.fsum``'s (exact, in any order:
    :func:`~servesweep.decide.exact.exact_sum`), the quantiles from the order
    statistics they need (:func:`~servesweep.decide.exact.order_stats`, not a sort)."""
    n = len(values)
    picks = {}
    for q in (0.5, 0.9, 0.99):
        pos = (n - 1) * q
        lo = math.floor(pos)
        picks[q] = (lo, min(lo + 1, n - 1), pos - lo)
    ranks = sorted({r for lo, hi, _ in picks.values() for r in (lo, hi)})
    found = dict(zip(ranks, order_stats(values, ranks).tolist(), strict=True))

    def at(q: float) -> float:
        lo, hi, frac = picks[q]
        x, y = found[lo], found[hi]
        if n == 1:
            return float(x)
        return float(x + (y - x) * frac)

    return {
        "mean": exact_sum(values) / n,
        "median": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
    }


def _mean(units: Sequence[Sequence[float]]) -> float | None:
    n = sum(len(u) for u in units)
    return sum(sum(u) for u in units) / n if n else None


def eval_intervals(
    results: Sequence[EvalTaskResult], *, confidence: float = DEFAULT_CONFIDENCE
) -> dict[str, tuple[float, float]]:
    """Wilson intervals of an eval's pass rate and error rate."""
    total = len(results)
    out: dict[str, tuple[float, float]] = {}
    passed = wilson(sum(1 for r in results if r.status == "pass"), total, confidence=confidence)
    errors = wilson(sum(1 for r in results if r.status == "error"), total, confidence=confidence)
    if passed is not None:
        out[mc.PASS_RATE.name] = passed
    if errors is not None:
        out[mc.EVAL_ERROR_RATE.name] = errors
    return out
