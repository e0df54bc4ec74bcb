"""Per-level metrics of the load generator, computed from the raw requests.

Definitions follow ``vllm bench serve`` where they mean the same; docs/metrics.md
lists every metric with its unit. In short, per request: TTFT to the first chunk
carrying generated tokens (a role-only chunk does not count), E2E to the last
chunk, completion tokens from the server's usage, TPOT = (E2E - TTFT) / (tokens - 1);
per level: ITL per token (a chunk of k tokens contributes k intervals of gap/k) with
the raw inter-chunk gap beside it.
"""

from __future__ import annotations

import gc
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

from servesweep import metrics_catalog as mc
from servesweep.bench.client import RawResult
from servesweep.bench.specdecode import estimate_from_chunks
from servesweep.decide.level_intervals import SLO_KEYS, meets_slo
from servesweep.metrics_catalog import Latency, Stat, latency
from servesweep.models import RequestSample

__all__ = ["LevelContext", "compute_level", "paused_gc", "percentile", "summary_stats"]

FloatArray = npt.NDArray[np.float64]

_NS = 1e-9
_MS = 1e-6


@dataclass
class LevelContext:
    """What the metrics need to know about how the level was run."""

    t0_ns: int
    concurrency: int | None = None
    rate: float | None = None
    slo: Mapping[str, float] = field(default_factory=dict)
    steady: tuple[int, int] | None = None
    """Closed loop: from the moment the whole concurrency was first in flight to
    the moment the first slot found no more work (ns)."""
    loop_lags_ns: Sequence[int] = ()
    stream: bool = True
    ignore_eos: tuple[bool, bool] = (False, False)
    """Whether the workload asked for ``ignore_eos``, and whether it was sent (the
    engine honours it): answers that still end at the model's end of turn are said."""


@contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cycle collector paused while a level's statistics are computed: they
    create a record per request and a float per token (millions at a high rate), none
    of them in a cycle, and each collection would walk them all again (about a quarter
    of the time at 200,000 requests, ``bench/level_cost.py``); memory is still freed
    as it is let go."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    n = len(sorted_values)
    if n == 1:
        return float(sorted_values[0])
    lo, hi, frac = _ranks(n, q)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def _ranks(n: int, q: float) -> tuple[int, int, float]:
    """The two closest ranks of percentile ``q`` of ``n`` sorted values and the
    fraction of the way from the first to the second."""
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    return lo, min(lo + 1, n - 1), pos - lo


def summary_stats(values: Sequence[float] | FloatArray) -> dict[str, float]:
    """mean, median, p90, p99, max of ``values``, keyed by the values of
    :class:`~servesweep.metrics_catalog.Stat` (empty: no keys).

    The percentiles are exact, those of :func:`percentile` over the sorted values:
    only the order statistics they need are found (``numpy.partition``, linear in
    the values, not a sort), and interpolated as :func:`percentile` does, in Python
    floats, so they are the same numbers to the last bit."""
    a = np.asarray(values, dtype=np.float64)
    n = len(a)
    if not n:
        return {}
    ranks: dict[float, tuple[int, int, float]] = {q: _ranks(n, q) for q in (50.0, 90.0, 99.0)}
    kth = sorted({n - 1} | {r for lo, hi, _ in ranks.values() for r in (lo, hi)})
    part = np.partition(a, kth)

    def at(q: float) -> float:
        if n == 1:
            return float(part[0])
        lo, hi, frac = ranks[q]
        x, y = float(part[lo]), float(part[hi])
        return float(x + (y - x) * frac)

    return {
        Stat.MEAN.value: float(a.sum()) / n,
        Stat.MEDIAN.value: at(50),
        Stat.P90.value: at(90),
        Stat.P99.value: at(99),
        Stat.MAX.value: float(part[n - 1]),
    }


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


def _warnings(
    m: Mapping[str, float], info: Mapping[str, Any], ctx: LevelContext, without_usage: int
) -> list[str]:
    out: list[str] = []
    # the generator's own timing (loop and schedule lag) is judged by bench.health
    advice = "raise workloads[].workers, or use a less busy machine"
    sched = m.get(mc.SCHEDULE_LAG_P99_MS.name)
    achieved = m.get(mc.ACHIEVED_RATE.name)
    if ctx.rate is not None and achieved is not None and abs(achieved / ctx.rate - 1) > 0.02:
        why = (
            f"schedule lag p99 {sched:.1f} ms"
            if sched is not None and sched > 5.0
            else "too few requests for the rate to settle"
            if m[mc.COMPLETED.name] + m[mc.FAILED.name] < 50
            else "the generator fell behind its schedule"
        )
        out.append(
            f"achieved {achieved:.2f} req/s against the requested {ctx.rate:g} req/s "
            f"({(achieved / ctx.rate - 1) * 100:+.1f}%): {why}"
        )
    if ctx.concurrency is not None and ctx.steady is not None:
        window = (ctx.steady[1] - ctx.steady[0]) * _NS
        held = m.get(mc.CONCURRENCY_MEAN.name, 0.0)
        if window > 0.05 and held < 0.95 * ctx.concurrency:
            out.append(
                f"only {held:.1f} of {ctx.concurrency} requests were really in flight on average "
                f"({held / ctx.concurrency:.0%}): the generator is too slow between requests; "
                f"{advice}"
            )
    if ctx.stream and without_usage:
        out.append(
            "the server sent no usage in some responses: token counts are stream chunk counts, "
            "which undercount with speculative decoding; enable stream_options.include_usage"
        )
    out.extend(_length_warnings(info["finish_reasons"], ctx.ignore_eos))
    rejected = info.get("usage_rejected")
    if rejected:
        out.append(
            f"{rejected} responses carried a usage that cannot be true "
            f"({info['usage_rejected_example']}): their token counts are the client's own "
            "(token-carrying chunks), not the server's; check the server's usage reporting"
        )
    return out


def _length_warnings(reasons: Mapping[str, int], ignore_eos: tuple[bool, bool]) -> list[str]:
    """What ``ignore_eos`` did to the answers' lengths, when it was asked for: each
    answer should run to ``max_tokens`` (finish_reason ``length``)."""
    asked, sent = ignore_eos
    if not asked:
        return []
    stopped = reasons.get("stop", 0)
    total = sum(reasons.values())
    if not sent:
        return [
            f"ignore_eos was asked but this engine does not support it (not sent): "
            f"{stopped} of {total} answers ended at the model's end of turn (finish_reason "
            "stop), their lengths the model's own, not max_tokens"
        ]
    if stopped:
        return [
            f"{stopped} of {total} answers ended at the model's end of turn (finish_reason "
            "stop) although ignore_eos was sent: the server did not honour it (or a stop "
            "string of the request's ended them), their lengths not max_tokens"
        ]
    return []
