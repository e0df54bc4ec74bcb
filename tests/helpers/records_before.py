"""The level's statistics as they were computed from one record per request, before
a level's requests were kept as columns (a copy of ``servesweep.bench.metrics``,
``servesweep.decide.level_intervals``, the bootstrap of ``servesweep.decide.intervals``
and the capacity search's ``slo_score`` then, its values gathered unit by unit and sorted as
Python lists): the reference
``tests/unit/test_sample_columns.py`` pins the columns' figures to, and the *before*
of ``bench/level_cost.py``."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from servesweep import metrics_catalog as mc
from servesweep.bench.capacity_search import _SLO_SECONDS
from servesweep.bench.client import RawResult
from servesweep.bench.metrics import LevelContext, _warnings, summary_stats
from servesweep.bench.specdecode import estimate_from_chunks
from servesweep.decide.intervals import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    MAX_UNITS,
    SEED,
    _rescaled,
    _thinned,
    quantile,
    subsample,
    summary_of,
    wilson,
)
from servesweep.decide.level_intervals import _KINDS, _MIN_FOR_RATES, _STATS, SLO_KEYS, meets_slo
from servesweep.metrics_catalog import Latency, Stat, latency
from servesweep.models import RequestSample

__all__ = ["compute_level", "level_intervals", "slo_score"]

FloatArray = Any

_NS = 1e-9
_MS = 1e-6


def _spread(total: int, n: int) -> list[int]:
    base, rem = divmod(total, n)
    return [base + (1 if i < rem else 0) for i in range(n)]


def _tokens(r: RawResult, source: Counter[str]) -> list[int]:
    """Tokens of each of a request's chunks, and where the count came from."""
    n_chunks = len(r.chunk_ns)
    if r.chunk_tokens is not None and len(r.chunk_tokens) == n_chunks:
        source["continuous_usage"] += 1
        return r.chunk_tokens
    if r.completion_tokens is not None and n_chunks:
        source["usage_spread"] += 1
        return _spread(r.completion_tokens, n_chunks)
    if n_chunks:
        source["chunk_count"] += 1
    return [1] * n_chunks


class _Chunks:
    """Every chunk of a level's requests in one array (the per-token work of a level
    of many requests done once over all of them, not token by token)."""

    def __init__(self, raws: Sequence[RawResult], tokens: Sequence[Sequence[int]]) -> None:
        lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
        total = int(lengths.sum())
        self.starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        self.lengths = lengths
        at = np.fromiter(chain.from_iterable(r.chunk_ns for r in raws), np.int64, total)
        self.tokens = np.fromiter(chain.from_iterable(tokens), np.int64, total)
        # gap i runs from chunk i to chunk i + 1 (across two requests at a boundary,
        # never read then): seconds, computed as (b - a) * 1e-9 in Python floats is
        self.gaps = np.diff(at) * _NS
        self._gaps_list: list[float] = self.gaps.tolist()
        self._starts_list: list[int] = self.starts.tolist()
        self._lengths_list: list[int] = lengths.tolist()

    def gaps_s(self, i: int) -> tuple[float, ...]:
        """Request ``i``'s gaps between its chunks, in seconds."""
        n = self._lengths_list[i]
        if n < 2:
            return ()
        start = self._starts_list[i]
        return tuple(self._gaps_list[start : start + n - 1])

    def per_token_ms(self, counted: Sequence[bool]) -> tuple[FloatArray, FloatArray]:
        """The chunk gaps (ms) of the ``counted`` requests, and their inter-token
        latencies: a chunk of k tokens gives k intervals of its gap / k."""
        n = len(self.tokens)
        if n < 2:
            empty = np.zeros(0, dtype=np.float64)
            return empty, empty
        own = np.repeat(np.asarray(counted, dtype=bool), self.lengths)
        first = np.zeros(n, dtype=bool)
        first[self.starts[self.lengths > 0]] = True
        # gap i belongs to chunk i + 1 when that chunk is not a request's first
        keep = own[1:] & ~first[1:]
        gaps_ms = self.gaps[keep] * 1e3
        k = self.tokens[1:][keep]
        some = k > 0
        itl = np.repeat(gaps_ms[some] / k[some], k[some])
        return gaps_ms, itl


def _in_flight_mean(raws: Sequence[RawResult], start: int, end: int) -> float:
    """Time-weighted mean number of requests in flight in ``[start, end]``: the
    requests' times in flight inside the window, summed (integer nanoseconds, so
    exactly the area under the in-flight count), over the window."""
    if end <= start:
        return 0.0
    n = len(raws)
    sent = np.fromiter((r.sent_ns for r in raws), np.int64, n)
    done = np.fromiter((r.sent_ns if r.end_ns is None else r.end_ns for r in raws), np.int64, n)
    inside = np.minimum(done, end) - np.maximum(sent, start)
    area = int(inside[inside > 0].sum())
    return area / (end - start)


def compute_level(
    raws: Sequence[RawResult], ctx: LevelContext
) -> tuple[dict[str, float], dict[str, Any], tuple[RequestSample, ...], list[str]]:
    """Metrics, info, samples and warnings of one level."""
    t0 = ctx.t0_ns
    ok = [r for r in raws if r.ok]
    failed = [r for r in raws if not r.ok]
    ends = [r.end_ns for r in raws if r.end_ns is not None]
    duration = max(1e-9, ((max(ends) if ends else t0) - t0) * _NS)

    ttft: list[float] = []
    e2e: list[float] = []
    tpot: list[float] = []
    prompt_tokens: list[int] = []
    completion_tokens: list[int] = []
    per_request_chunk_tokens: list[list[int]] = []
    token_source = Counter[str]()
    good = 0
    samples: list[RequestSample] = []
    reasoning: list[float] = []
    reasoning_tokens: list[int] = []
    slo = {k: v for k, v in ctx.slo.items() if k in SLO_KEYS}

    ordered = sorted(raws, key=lambda x: x.sent_ns)
    per_request_tokens = [_tokens(r, token_source) for r in ordered]
    chunks = _Chunks(ordered, per_request_tokens)
    counted: list[bool] = []
    """Per request: whether its chunk gaps count in ITL and chunk gaps."""
    for i, (r, tokens) in enumerate(zip(ordered, per_request_tokens, strict=True)):
        n_chunks = len(tokens)
        ct = r.completion_tokens if r.completion_tokens is not None else sum(tokens)
        samples.append(
            RequestSample(
                index=r.index,
                ok=r.ok,
                error=f"{r.error}: {r.message}" if r.error and r.message else r.error,
                scheduled_at=None if r.scheduled_ns is None else (r.scheduled_ns - t0) * _NS,
                sent_at=(r.sent_ns - t0) * _NS,
                first_token_at=None if r.first_ns is None else (r.first_ns - t0) * _NS,
                finished_at=None if r.end_ns is None else (r.end_ns - t0) * _NS,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=ct if (n_chunks or r.completion_tokens is not None) else None,
                reasoning_tokens=r.reasoning_tokens,
                chunk_gaps=chunks.gaps_s(i),
                chunk_tokens=tuple(tokens),
            )
        )
        counted.append(r.ok and r.end_ns is not None and r.first_ns is not None)
        if not r.ok or r.end_ns is None:
            continue
        e = (r.end_ns - r.sent_ns) * _MS
        e2e.append(e)
        completion_tokens.append(ct)
        if r.prompt_tokens is not None:
            prompt_tokens.append(r.prompt_tokens)
        t = None
        tp = None
        if r.first_ns is not None:
            t = (r.first_ns - r.sent_ns) * _MS
            ttft.append(t)
            if ct > 1:
                tp = (e - t) / (ct - 1)
                tpot.append(tp)
            per_request_chunk_tokens.append(tokens)
            if r.first_answer_ns is not None and r.first_answer_ns > r.first_ns:
                reasoning.append((r.first_answer_ns - r.sent_ns) * _MS)
        if r.reasoning_tokens:
            reasoning_tokens.append(r.reasoning_tokens)
        if not slo or meets_slo(slo, {"ttft": t, "tpot": tp, "e2e": e}, ct):
            good += 1
    gaps_ms, itl = chunks.per_token_ms(counted)

    total_out = sum(completion_tokens)
    total_in = sum(prompt_tokens)
    n = len(raws)
    m: dict[str, float] = {
        mc.COMPLETED.name: float(len(ok)),
        mc.FAILED.name: float(len(failed)),
        mc.ERROR_RATE.name: len(failed) / n if n else 0.0,
        mc.DURATION_S.name: duration,
        mc.REQUEST_THROUGHPUT.name: len(ok) / duration,
        mc.OUTPUT_THROUGHPUT.name: total_out / duration,
        mc.INPUT_THROUGHPUT.name: total_in / duration,
        mc.TOTAL_TOKEN_THROUGHPUT.name: (total_in + total_out) / duration,
        mc.GOODPUT.name: good / duration,
    }
    if prompt_tokens:
        m[mc.PROMPT_TOKENS_MEAN.name] = total_in / len(prompt_tokens)
    if completion_tokens:
        m[mc.COMPLETION_TOKENS_MEAN.name] = total_out / len(completion_tokens)
    for kind, values_ms in (
        (Latency.TTFT, ttft),
        (Latency.TPOT, tpot),
        (Latency.ITL, itl),
        (Latency.E2E, e2e),
        (Latency.CHUNK_GAP, gaps_ms),
    ):
        stats = summary_stats(values_ms)
        for stat in Stat if stats else ():
            m[latency(kind, stat).name] = stats[stat.value]
    n_chunks_total = sum(map(len, per_request_chunk_tokens))
    if n_chunks_total:
        chunk_tokens = sum(map(sum, per_request_chunk_tokens))
        m[mc.TOKENS_PER_CHUNK_MEAN.name] = chunk_tokens / n_chunks_total

    # what the generator itself did
    info: dict[str, Any] = {}
    lags = [(r.sent_ns - r.scheduled_ns) * _MS for r in raws if r.scheduled_ns is not None]
    if lags:
        s = summary_stats(lags)
        m[mc.SCHEDULE_LAG_P99_MS.name] = s[Stat.P99.value]
        info["schedule_lag_ms"] = {k: round(v, 3) for k, v in s.items()}
    if ctx.loop_lags_ns:
        s = summary_stats([x * _MS for x in ctx.loop_lags_ns])
        m[mc.LOOP_LAG_P99_MS.name] = s[Stat.P99.value]
        info["loop_lag_ms"] = {k: round(v, 3) for k, v in s.items()}
    ttfb = [(r.first_byte_ns - r.sent_ns) * _MS for r in ok if r.first_byte_ns is not None]
    if ttfb and ctx.stream:
        info["ttfb_ms"] = {k: round(v, 3) for k, v in summary_stats(ttfb).items()}
    sent = sorted(r.sent_ns for r in raws)
    end_all = max(ends) if ends else t0
    if ctx.steady is not None:
        m[mc.CONCURRENCY_MEAN.name] = _in_flight_mean(raws, *ctx.steady)
        info["steady_window_s"] = round((ctx.steady[1] - ctx.steady[0]) * _NS, 3)
        info["concurrency_mean_whole_run"] = round(_in_flight_mean(raws, t0, end_all), 2)
    else:
        m[mc.CONCURRENCY_MEAN.name] = _in_flight_mean(raws, t0, end_all)
    if ctx.rate is not None and sent:
        span = (sent[-1] - t0) * _NS
        if span > 0:
            m[mc.ACHIEVED_RATE.name] = len(sent) / span

    # facts for the record
    info["errors"] = dict(Counter(r.error for r in failed if r.error))
    examples: dict[str, str] = {}
    for r in failed:
        if r.error and r.error not in examples and r.message:
            examples[r.error] = r.message
    if examples:
        info["error_examples"] = examples
    resent = [r.resent for r in raws if r.resent]
    if resent:
        info["resent_requests"] = len(resent)
        info["resent_example"] = resent[0]
    rejected = [r.usage_problem for r in raws if r.usage_problem]
    if rejected:
        info["usage_rejected"] = len(rejected)
        info["usage_rejected_example"] = rejected[0]
    info["finish_reasons"] = dict(Counter(r.finish_reason or "none" for r in ok))
    info["tokens_per_chunk_source"] = dict(token_source)
    info["completion_tokens_source"] = (
        "usage" if all(r.completion_tokens is not None for r in ok) else "chunk_count"
    )
    without_usage = sum(1 for r in ok if r.completion_tokens is None and not r.usage_problem)
    if reasoning or reasoning_tokens:
        info["reasoning"] = {
            "requests": len(reasoning),
            "time_to_first_answer_ms": {
                k: round(v, 3) for k, v in summary_stats(reasoning).items()
            },
            "reasoning_tokens_mean": (
                sum(reasoning_tokens) / len(reasoning_tokens) if reasoning_tokens else None
            ),
        }
    warnings = _warnings(m, info, ctx, without_usage)
    est = estimate_from_chunks(per_request_chunk_tokens)
    if est is not None:
        info["acceptance_estimate_from_chunks"] = round(est, 4)
    return m, info, tuple(samples), warnings


def _rates(
    done: Sequence[RequestSample],
    goods: Sequence[bool],
    duration_s: float,
    confidence: float,
    resamples: int,
    picked: Sequence[int] | None = None,
) -> dict[str, tuple[float, float]]:
    """Throughputs by Little's law: a rate over the level is the mean number of
    requests in flight (``sum(e2e) / duration``, which the load generator's
    concurrency or arrival rate sets) times a per-second-in-flight ratio of the
    requests (tokens / e2e); the ratio is bootstrapped over the requests (over the
    ``picked`` ones, rescaled to all, when the level is subsampled)."""
    e2e = [(s.finished_at - s.sent_at) if s.finished_at is not None else 0.0 for s in done]
    total = math.fsum(e2e)
    if len(done) < _MIN_FOR_RATES or duration_s <= 0 or total <= 0:
        return {}
    in_flight = total / duration_s
    out_tokens = [float(s.completion_tokens or 0) for s in done]
    in_tokens = [float(s.prompt_tokens or 0) for s in done]
    names = [
        mc.REQUEST_THROUGHPUT.name,
        mc.GOODPUT.name,
        mc.OUTPUT_THROUGHPUT.name,
        mc.INPUT_THROUGHPUT.name,
        mc.TOTAL_TOKEN_THROUGHPUT.name,
    ]
    numerators = [
        [1.0] * len(done),
        [1.0 if g else 0.0 for g in goods],
        out_tokens,
        in_tokens,
        [a + b for a, b in zip(in_tokens, out_tokens, strict=True)],
    ]
    if picked is None:
        found = bootstrap_ratio(numerators, e2e, confidence=confidence, resamples=resamples)
    else:
        found = bootstrap_ratio(
            [[num[i] for i in picked] for num in numerators],
            [e2e[i] for i in picked],
            confidence=confidence,
            resamples=resamples,
            scale_to=len(done),
            centers=[math.fsum(num) / total for num in numerators],
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
    done = [s for s in samples if s.ok and s.finished_at is not None]
    out: dict[str, tuple[float, float]] = {}
    if samples:
        failed = sum(1 for s in samples if not s.ok)
        found = wilson(failed, len(samples), confidence=confidence)
        if found is not None:
            out[mc.ERROR_RATE.name] = found
    picked = subsample(len(done), max_units)
    units = done if picked is None else [done[i] for i in picked]
    per_kind: dict[Latency, list[list[float]]] = {k: [] for k in _KINDS}
    middles: list[list[float]] = []
    for s in units:
        ttft, tpot, e2e, _ = _latencies(s)
        per_kind[Latency.TTFT].append([] if ttft is None else [ttft])
        per_kind[Latency.TPOT].append([] if tpot is None else [tpot])
        per_kind[Latency.ITL].append(_itl(s) if ttft is not None else [])
        per_kind[Latency.E2E].append([] if e2e is None else [e2e])
        middles.append(_middle(s) if ttft is not None else [])
    goods: list[bool] = []
    whole: dict[Latency, list[float]] = {k: [] for k in _KINDS if k is not Latency.ITL}
    ttfts, tpots, e2es = whole[Latency.TTFT], whole[Latency.TPOT], whole[Latency.E2E]
    for s in done if slo or picked is not None else ():
        ttft, tpot, e2e, ct = _latencies(s)
        if slo:
            goods.append(meets_slo(slo, {"ttft": ttft, "tpot": tpot, "e2e": e2e}, ct))
        if picked is not None:
            if ttft is not None:
                ttfts.append(ttft)
            if tpot is not None:
                tpots.append(tpot)
            if e2e is not None:
                e2es.append(e2e)
    if not slo:
        goods = [slo is not None] * len(done)  # no SLO: every completed request is good
    groups = [per_kind[k] for k in _KINDS] + [middles]
    centers: list[Mapping[str, float] | None] | None = None
    chunk_estimate = _mean(middles)
    if picked is not None:
        centers = [_center(k, whole.get(k), done, values) for k in _KINDS]
        middle = [s.chunk_tokens[1:-1] for s in done if s.ttft is not None]
        count = sum(map(len, middle))
        chunk_estimate = sum(map(sum, middle)) / count if count else None
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
    rates = _rates(done, goods, duration_s, confidence, resamples, picked)
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


def _center(
    kind: Latency,
    values: list[float] | None,
    done: Sequence[RequestSample],
    metrics: Mapping[str, float] | None,
) -> Mapping[str, float] | None:
    """The whole level's statistics of ``kind``: from ``values`` (every request's),
    or for ITL from the level's ``metrics`` (else from every token: slow)."""
    if kind is Latency.ITL:
        names = {stat.value: latency(kind, stat).name for stat in _STATS}
        if metrics is not None and all(n in metrics for n in names.values()):
            return {stat: float(metrics[n]) for stat, n in names.items()}
        values = [v for s in done if s.ttft is not None for v in _itl(s)]
    if not values:
        return None
    return summary_of(sorted(values))


def _mean(units: Sequence[Sequence[float]]) -> float | None:
    n = sum(len(u) for u in units)
    return sum(sum(u) for u in units) / n if n else None


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
    rng = random.Random(seed)
    draws: list[dict[str, list[float]]] = [{} for _ in groups]
    for _ in range(resamples):
        picks = rng.choices(range(n), k=n)
        for i in live:
            units = groups[i]
            values: list[float] = []
            for p in picks:
                values.extend(units[p])
            if not values:
                continue
            values.sort()
            for name, v in statistic(values).items():
                draws[i].setdefault(name, []).append(v)
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


def _ratio(sample: RequestSample, slo: Mapping[str, float]) -> float:
    if not sample.ok or sample.e2e is None:
        return math.inf
    worst = 0.0
    for key, limit in slo.items():
        kind = _SLO_SECONDS[key]
        if kind == "ttft":
            value = sample.ttft
        elif kind == "e2e":
            value = sample.e2e
        else:
            tokens = sample.completion_tokens or 0
            if tokens <= 1 or sample.ttft is None:
                continue
            value = (sample.e2e - sample.ttft) / (tokens - 1)
        if value is None:
            return math.inf
        worst = max(worst, value * 1000.0 / limit)
    return worst


def slo_score(
    samples: Sequence[RequestSample], slo: Mapping[str, float], quantile: float
) -> tuple[float, float]:
    """(score, attainment) of one level's requests (see the module docstring)."""
    if not samples:
        return math.inf, 0.0
    ratios = sorted(_ratio(s, slo) for s in samples)
    attainment = sum(1 for r in ratios if r <= 1.0) / len(ratios)
    rank = max(0, math.ceil(quantile * len(ratios) - 1e-9) - 1)
    return ratios[rank], attainment


def bootstrap_ratio(  # as it was: Python draws, math.fsum per resample
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
    rng = random.Random(seed)
    draws: list[list[float]] = [[] for _ in numerators]
    for _ in range(resamples):
        get = itemgetter(*rng.choices(range(n), k=n))
        den = math.fsum(get(denominator))
        if den <= 0:
            continue
        for k, num in enumerate(numerators):
            draws[k].append(math.fsum(get(num)) / den)
    alpha = (1.0 - confidence) / 2.0
    out: list[tuple[float, float] | None] = []
    den_all = math.fsum(denominator)
    for k, vals in enumerate(draws):
        if len(vals) < 2:
            out.append(None)
            continue
        vals.sort()
        found = (quantile(vals, alpha), quantile(vals, 1.0 - alpha))
        if scale_to is not None and scale_to > n and centers is not None:
            own = math.fsum(numerators[k]) / den_all if den_all > 0 else math.nan
            found = _rescaled(found, own, centers[k], n, scale_to)
        out.append(found)
    return out
