"""The intervals of one level's key metrics, computed from its requests.

The load generator calls :func:`level_intervals` on the samples it just measured;
reports call it on the samples a results database kept when the level was stored
without intervals (a database from before intervals existed), so both give the same
numbers. Pure functions over :class:`~servesweep.models.RequestSample` and
:class:`~servesweep.models.EvalTaskResult`; the statistics are
:mod:`servesweep.intervals`. docs/metrics.md ("Uncertainty") says the same in words:

- latency statistics (mean, median, p90, p99 of TTFT, TPOT, ITL, E2E): a bootstrap
  over the completed requests (a request's inter-token latencies travel together);
- throughputs (requests, output, input, total tokens, goodput): batch means over
  equal time windows of the level, each request's tokens counted when their chunks
  arrived and each request's count spread over its time in flight;
- acceptance length: the bootstrap of the tokens per decode chunk over requests,
  its relative width applied to the engine counters' value when those decided it;
- pass rates and error rates: the Wilson interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from servesweep import metrics_catalog as mc
from servesweep.intervals import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    batch_means,
    bootstrap_stats,
    wilson,
)
from servesweep.metrics_catalog import Latency, Stat, latency
from servesweep.models import EvalTaskResult, RequestSample

__all__ = [
    "INTERVAL_METRICS",
    "SLO_KEYS",
    "eval_intervals",
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
_WINDOWS = 10
"""Time windows of the batch means (fewer when the level completed few requests)."""

INTERVAL_METRICS: frozenset[str] = frozenset(
    [latency(k, s).name for k in _KINDS for s in _STATS]
    + [m.name for m in _RATES]
    + [mc.ACCEPTANCE_LENGTH.name, mc.ERROR_RATE.name, mc.PASS_RATE.name]
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


def _spread(windows: list[float], width: float, q: float, a: float, b: float) -> None:
    """Add ``q`` to the windows, spread evenly over the time span ``a..b``."""
    k = len(windows)
    if b <= a:
        windows[min(k - 1, max(0, int(b / width)))] += q
        return
    rate = q / (b - a)
    first, last = max(0, int(a / width)), min(k - 1, int(b / width))
    for j in range(first, last + 1):
        overlap = min(b, (j + 1) * width) - max(a, j * width)
        if overlap > 0:
            windows[j] += rate * overlap


def _rates(
    done: Sequence[RequestSample],
    goods: Sequence[bool],
    duration_s: float,
    confidence: float,
) -> dict[str, tuple[float, float]]:
    k = min(_WINDOWS, len(done) // 2)
    if k < 3 or duration_s <= 0:
        return {}
    width = duration_s / k
    requests = [0.0] * k
    good = [0.0] * k
    out_tokens = [0.0] * k
    in_tokens = [0.0] * k
    for s, is_good in zip(done, goods, strict=True):
        end = s.finished_at if s.finished_at is not None else s.sent_at
        _spread(requests, width, 1.0, s.sent_at, end)
        if is_good:
            _spread(good, width, 1.0, s.sent_at, end)
        if s.prompt_tokens is not None:
            first = s.first_token_at if s.first_token_at is not None else end
            _spread(in_tokens, width, float(s.prompt_tokens), s.sent_at, first)
        ct = s.completion_tokens or 0
        chunk_sum = sum(s.chunk_tokens)
        if ct and s.first_token_at is not None and chunk_sum > 0:
            t = s.first_token_at
            scale = ct / chunk_sum
            times = [t]
            for gap in s.chunk_gaps:
                t += gap
                times.append(t)
            for at, tokens in zip(times, s.chunk_tokens, strict=False):
                out_tokens[min(k - 1, max(0, int(at / width)))] += tokens * scale
        elif ct:
            _spread(out_tokens, width, float(ct), s.first_token_at or s.sent_at, end)
    totals = {
        mc.REQUEST_THROUGHPUT.name: requests,
        mc.GOODPUT.name: good,
        mc.OUTPUT_THROUGHPUT.name: out_tokens,
        mc.INPUT_THROUGHPUT.name: in_tokens,
        mc.TOTAL_TOKEN_THROUGHPUT.name: [a + b for a, b in zip(in_tokens, out_tokens, strict=True)],
    }
    out: dict[str, tuple[float, float]] = {}
    for name, windows in totals.items():
        found = batch_means(windows, width, confidence=confidence)
        if found is not None:
            out[name] = found
    return out


def level_intervals(
    samples: Sequence[RequestSample],
    *,
    duration_s: float,
    slo: Mapping[str, float] | None = None,
    acceptance: tuple[float, str] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
) -> dict[str, tuple[float, float]]:
    """``{metric: (lo, hi)}`` at ``confidence`` for one level from its requests.

    ``duration_s`` is the level's ``duration_s`` (the throughputs' denominator);
    ``slo`` the workload's (goodput gets an interval only with it, or when it is
    empty: every completed request is good); ``acceptance`` the stored acceptance
    length and its source (``tokens_per_chunk_estimate`` or the engine's counters).
    A metric with too few requests for an interval is left out.
    """
    done = [s for s in samples if s.ok and s.finished_at is not None]
    out: dict[str, tuple[float, float]] = {}
    if samples:
        failed = sum(1 for s in samples if not s.ok)
        found = wilson(failed, len(samples), confidence=confidence)
        if found is not None:
            out[mc.ERROR_RATE.name] = found
    per_kind: dict[Latency, list[list[float]]] = {k: [] for k in _KINDS}
    middles: list[list[float]] = []
    goods: list[bool] = []
    for s in done:
        e2e = (s.finished_at - s.sent_at) * 1e3 if s.finished_at is not None else None
        ttft = s.ttft * 1e3 if s.ttft is not None else None
        ct = s.completion_tokens if s.completion_tokens is not None else sum(s.chunk_tokens)
        tpot = (e2e - ttft) / (ct - 1) if e2e is not None and ttft is not None and ct > 1 else None
        itl: list[float] = []
        if ttft is not None:
            for gap, k in zip(s.chunk_gaps, s.chunk_tokens[1:], strict=False):
                if k > 0:
                    itl.extend([gap * 1e3 / k] * k)
        per_kind[Latency.TTFT].append([] if ttft is None else [ttft])
        per_kind[Latency.TPOT].append([] if tpot is None else [tpot])
        per_kind[Latency.ITL].append(itl)
        per_kind[Latency.E2E].append([] if e2e is None else [e2e])
        middles.append([float(t) for t in s.chunk_tokens[1:-1]] if ttft is not None else [])
        goods.append(
            slo is not None and meets_slo(slo, {"ttft": ttft, "tpot": tpot, "e2e": e2e}, ct)
        )
    groups = [per_kind[k] for k in _KINDS] + [middles]
    found_stats = bootstrap_stats(groups, confidence=confidence, resamples=resamples)
    for kind, stats in zip(_KINDS, found_stats, strict=False):
        for stat in _STATS:
            if stat.value in stats:
                out[latency(kind, stat).name] = stats[stat.value]
    rates = _rates(done, goods, duration_s, confidence)
    if slo is None:
        rates.pop(mc.GOODPUT.name, None)
    out.update(rates)
    chunk_mean = found_stats[-1].get("mean") if found_stats else None
    if acceptance is not None and chunk_mean is not None:
        value, source = acceptance
        estimate = _mean(middles)
        if source == "tokens_per_chunk_estimate" or estimate is None:
            out[mc.ACCEPTANCE_LENGTH.name] = chunk_mean
        elif estimate > 0:
            lo, hi = chunk_mean
            out[mc.ACCEPTANCE_LENGTH.name] = (value * lo / estimate, value * hi / estimate)
    return {k: v for k, v in out.items() if all(math.isfinite(x) for x in v)}


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
