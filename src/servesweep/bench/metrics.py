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
from typing import Any

import numpy as np
import numpy.typing as npt

from servesweep import metrics_catalog as mc
from servesweep.bench.client import RawResult
from servesweep.bench.columns import RawColumns
from servesweep.decide.exact import order_stats
from servesweep.decide.level_intervals import SLO_KEYS, good_mask
from servesweep.metrics_catalog import Latency, Stat, latency
from servesweep.samples import SampleColumns

__all__ = ["LevelContext", "compute_level", "paused_gc", "percentile", "summary_stats"]

FloatArray = npt.NDArray[np.floating[Any]]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

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


def summary_stats(
    values: Sequence[float] | FloatArray | IntArray,
    *,
    ns_to_ms: bool = False,
) -> dict[str, float]:
    """mean, median, p90, p99, max of ``values``, keyed by the values of
    :class:`~servesweep.metrics_catalog.Stat` (empty: no keys).

    The percentiles are exact, those of :func:`percentile` over the sorted values:
    only the order statistics they need are found
    (:func:`~servesweep.decide.exact.order_stats`: ``numpy.partition``'s, from the
    values near each rank), and interpolated as :func:`percentile` does, in Python
    floats, so they are the same numbers to the last bit. With ``ns_to_ms`` the values
    are integer nanoseconds and the statistics are of each one's ``v * 1e-9 * 1e3``
    ms (the order is the same: each statistic is the same number to the last bit;
    the mean from the exact sum)."""
    a = np.asarray(values, dtype=np.int64 if ns_to_ms else np.float64)
    n = len(a)
    if not n:
        return {}
    mean = int(a.sum()) * _NS * 1e3 / n if ns_to_ms else float(a.sum()) / n
    unit = (lambda v: float(v) * _NS * 1e3) if ns_to_ms else float
    ranks: dict[float, tuple[int, int, float]] = {q: _ranks(n, q) for q in (50.0, 90.0, 99.0)}
    kth = sorted({n - 1} | {r for lo, hi, _ in ranks.values() for r in (lo, hi)})
    part = dict(zip(kth, order_stats(a, kth).tolist(), strict=True))

    def at(q: float) -> float:
        if n == 1:
            return unit(part[0])
        lo, hi, frac = ranks[q]
        x, y = unit(part[lo]), unit(part[hi])
        return float(x + (y - x) * frac)

    return {
        Stat.MEAN.value: mean,
        Stat.MEDIAN.value: at(50),
        Stat.P90.value: at(90),
        Stat.P99.value: at(99),
        Stat.MAX.value: unit(part[n - 1]),
    }


def _stats_ms(values: FloatArray) -> dict[str, float]:
    return {k: round(v, 3) for k, v in summary_stats(values).items()}


def _in_flight_mean(sent: IntArray, done: IntArray, start: int, end: int) -> float:
    """Time-weighted mean number of requests in flight in ``[start, end]``: the
    requests' times in flight inside the window, summed (integer nanoseconds, so
    exactly the area under the in-flight count), over the window."""
    if end <= start:
        return 0.0
    inside = np.minimum(done, end) - np.maximum(sent, start)
    area = int(inside[inside > 0].sum())
    return area / (end - start)


def compute_level(
    raws: Sequence[RawResult], ctx: LevelContext
) -> tuple[dict[str, float], dict[str, Any], SampleColumns, list[str]]:
    """Metrics, info, samples and warnings of one level of ``raws``."""
    columns = RawColumns()
    columns.extend(raws)
    return compute_columns(columns, ctx)


def compute_columns(
    columns: RawColumns, ctx: LevelContext
) -> tuple[dict[str, float], dict[str, Any], SampleColumns, list[str]]:
    """Metrics, info, samples and warnings of one level, from its requests' columns
    (numpy over every request and every chunk at once; no pass over the requests).
    The columns are read, not changed: the percentiles of every gap are selected
    from the values near each rank, not in a copy of every gap."""
    t0 = ctx.t0_ns
    a = columns.arrays()
    n = len(a.sent)
    ok = a.ok
    has_end = a.end >= 0
    n_ok = int(ok.sum())
    n_failed = n - n_ok
    end_all = int(a.end[has_end].max()) if has_end.any() else t0
    duration = max(1e-9, (end_all - t0) * _NS)

    # the requests in the order they were sent (their chunks stay where they are)
    order = np.argsort(a.sent, kind="stable")
    sent = a.sent[order]
    first = a.first[order]
    first_answer = a.first_answer[order]
    end = a.end[order]
    is_ok = ok[order]
    counts = a.chunk_count[order]
    starts_raw = np.zeros(n, dtype=np.int64)
    if n > 1:
        np.cumsum(a.chunk_count[:-1], out=starts_raw[1:])
    sums_raw = a.token_sum  # each request's tokens over its chunks, summed as it came
    completion_raw = a.completion_tokens
    ct_raw = np.where(completion_raw >= 0, completion_raw, sums_raw)
    ct = ct_raw[order]
    prompt = a.prompt_tokens[order]
    reasoning_tokens = a.reasoning_tokens[order]

    done = is_ok & (end >= 0)
    with_first = done & (first >= 0)
    e2e_all = (end - sent) * _MS
    ttft_all = _times(first, sent, _MS)
    e2e = _picked(e2e_all, done)
    ttft = _picked(ttft_all, with_first)
    many = with_first & (ct > 1)
    tpot = (_picked(e2e_all, many) - _picked(ttft_all, many)) / (_picked(ct, many) - 1)
    completion_tokens = _picked(ct, done)
    prompt_tokens = _picked(prompt, done & (prompt >= 0))
    late = with_first & (first_answer >= 0) & (first_answer > first)
    reasoning = (first_answer[late] - sent[late]) * _MS
    thought = reasoning_tokens[done & (reasoning_tokens > 0)]
    slo = {k: v for k, v in ctx.slo.items() if k in SLO_KEYS}
    good = int(done.sum()) if not slo else int((good_mask(slo, ttft_all, e2e_all, ct) & done).sum())

    # every request's gaps between its chunks (seconds, in the order the requests
    # completed), and those of the requests that count in ITL and the chunk gaps:
    # completed with a first token
    gap_count = np.maximum(a.chunk_count - 1, 0)
    gap_start = np.zeros(n, dtype=np.int64)
    if n > 1:
        np.cumsum(gap_count[:-1], out=gap_start[1:])
    gaps = a.gap_s
    counted_raw = np.zeros(n, dtype=np.bool_)
    counted_raw[order] = with_first
    every = bool(counted_raw.all())
    if every and not columns.other_chunks:
        # every gap counts, and is one inter-token latency (one token a chunk): their
        # statistics from the gaps' nanoseconds (no copy of them)
        gap_stats = summary_stats(a.gap_ns, ns_to_ms=True)
        itl_stats = gap_stats
    else:
        gaps_ms = (gaps if every else gaps[np.repeat(counted_raw, gap_count)]) * 1e3
        later = np.ones(len(a.chunk_tokens), dtype=np.bool_)
        later[starts_raw[a.chunk_count > 0]] = False  # each request's first chunk
        k = a.chunk_tokens[later]
        if not every:
            k = k[np.repeat(counted_raw, gap_count)]
        some = k > 0
        itl_stats = summary_stats(np.repeat(gaps_ms[some] / k[some], k[some]))
        gap_stats = summary_stats(gaps_ms)

    total_out = int(completion_tokens.sum())
    total_in = int(prompt_tokens.sum())
    m: dict[str, float] = {
        mc.COMPLETED.name: float(n_ok),
        mc.FAILED.name: float(n_failed),
        mc.ERROR_RATE.name: n_failed / n if n else 0.0,
        mc.DURATION_S.name: duration,
        mc.REQUEST_THROUGHPUT.name: n_ok / duration,
        mc.OUTPUT_THROUGHPUT.name: total_out / duration,
        mc.INPUT_THROUGHPUT.name: total_in / duration,
        mc.TOTAL_TOKEN_THROUGHPUT.name: (total_in + total_out) / duration,
        mc.GOODPUT.name: good / duration,
    }
    if len(prompt_tokens):
        m[mc.PROMPT_TOKENS_MEAN.name] = total_in / len(prompt_tokens)
    if len(completion_tokens):
        m[mc.COMPLETION_TOKENS_MEAN.name] = total_out / len(completion_tokens)
    for kind, stats in (
        (Latency.TTFT, summary_stats(ttft)),
        (Latency.TPOT, summary_stats(tpot)),
        (Latency.ITL, itl_stats),
        (Latency.E2E, summary_stats(e2e)),
        (Latency.CHUNK_GAP, gap_stats),
    ):
        for stat in Stat if stats else ():
            m[latency(kind, stat).name] = stats[stat.value]
    n_chunks_total = int(a.chunk_count[counted_raw].sum())
    if n_chunks_total:
        chunk_tokens = int(sums_raw[counted_raw].sum())
        m[mc.TOKENS_PER_CHUNK_MEAN.name] = chunk_tokens / n_chunks_total

    # what the generator itself did (in the order the requests completed)
    info: dict[str, Any] = {}
    scheduled = a.scheduled >= 0
    if scheduled.any():
        lags = (a.sent[scheduled] - a.scheduled[scheduled]) * _MS
        s = summary_stats(lags)
        m[mc.SCHEDULE_LAG_P99_MS.name] = s[Stat.P99.value]
        info["schedule_lag_ms"] = {k: round(v, 3) for k, v in s.items()}
    if ctx.loop_lags_ns:
        s = summary_stats(np.asarray(ctx.loop_lags_ns, dtype=np.int64) * _MS)
        m[mc.LOOP_LAG_P99_MS.name] = s[Stat.P99.value]
        info["loop_lag_ms"] = {k: round(v, 3) for k, v in s.items()}
    byte = ok & (a.first_byte >= 0)
    if byte.any() and ctx.stream:
        info["ttfb_ms"] = _stats_ms((a.first_byte[byte] - a.sent[byte]) * _MS)
    done_at = np.where(has_end, a.end, a.sent)
    if ctx.steady is not None:
        m[mc.CONCURRENCY_MEAN.name] = _in_flight_mean(a.sent, done_at, *ctx.steady)
        info["steady_window_s"] = round((ctx.steady[1] - ctx.steady[0]) * _NS, 3)
        info["concurrency_mean_whole_run"] = round(_in_flight_mean(a.sent, done_at, t0, end_all), 2)
    else:
        m[mc.CONCURRENCY_MEAN.name] = _in_flight_mean(a.sent, done_at, t0, end_all)
    if ctx.rate is not None and n:
        span = (int(sent[-1]) - t0) * _NS
        if span > 0:
            m[mc.ACHIEVED_RATE.name] = n / span

    # facts for the record
    failed = [e for row, e in columns.errors.items() if not ok[row]]
    info["errors"] = dict(Counter(error for error, _ in failed))
    examples: dict[str, str] = {}
    for error, message in failed:
        if error not in examples and message:
            examples[error] = message
    if examples:
        info["error_examples"] = examples
    if columns.resent:
        info["resent_requests"] = len(columns.resent)
        info["resent_example"] = next(iter(columns.resent.values()))
    if columns.usage_problem:
        info["usage_rejected"] = len(columns.usage_problem)
        info["usage_rejected_example"] = next(iter(columns.usage_problem.values()))
    info["finish_reasons"] = dict(columns.finish_reasons)
    info["tokens_per_chunk_source"] = dict(columns.token_source)
    no_usage = ok & (completion_raw < 0)
    info["completion_tokens_source"] = "chunk_count" if no_usage.any() else "usage"
    without_usage = int(no_usage.sum()) - sum(
        1 for row in columns.usage_problem if ok[row] and completion_raw[row] < 0
    )
    if len(reasoning) or len(thought):
        info["reasoning"] = {
            "requests": len(reasoning),
            "time_to_first_answer_ms": _stats_ms(reasoning),
            "reasoning_tokens_mean": (int(thought.sum()) / len(thought) if len(thought) else None),
        }
    warnings = _warnings(m, info, ctx, without_usage)
    est = _decode_chunk_mean(a.chunk_count, sums_raw, a.edge_tokens, counted_raw)
    if est is not None:
        info["acceptance_estimate_from_chunks"] = round(est, 4)
    samples = SampleColumns(
        indices=a.index[order],
        ok=is_ok,
        sent_at=(sent - t0) * _NS,
        scheduled_at=_times(a.scheduled[order], t0),
        first_token_at=_times(first, t0),
        finished_at=_times(end, t0),
        prompt_tokens=prompt,
        completion_tokens=np.where((counts > 0) | (completion_raw[order] >= 0), ct, -1),
        reasoning_tokens=reasoning_tokens,
        chunk_count=counts,
        chunk_tokens=a.chunk_tokens,
        gap_count=gap_count[order],
        chunk_gaps=gaps,
        chunk_start=starts_raw[order],
        gap_start=gap_start[order],
        errors=_error_texts(columns, order),
    )
    return m, info, samples, warnings


def _decode_chunk_mean(
    counts: IntArray, sums: IntArray, edges: IntArray, counted: BoolArray
) -> float | None:
    """Mean tokens of the ``counted`` requests' decode chunks, each request's first
    and last chunk left out (:func:`~servesweep.bench.specdecode.estimate_from_chunks`):
    from each request's total and the tokens of its first and last chunk, gathered
    as it came (:class:`~servesweep.bench.columns.RawColumns`), not chunk by chunk."""
    every = bool(counted.all())
    n = int(np.maximum(_picked(counts, counted) - 2, 0).sum())
    if not n:
        return None
    inner = sums - edges
    return int((inner if every else inner[counted]).sum()) / n


def _picked(values: npt.NDArray[Any], mask: BoolArray) -> npt.NDArray[Any]:
    """``values[mask]``: ``values`` themselves when the mask keeps every one (no copy)."""
    return values if bool(mask.all()) else values[mask]


def _times(ns: IntArray, t0: int | IntArray, unit: float = _NS) -> FloatArray:
    """``(ns - t0) * unit`` (NaN where ``ns`` is missing)."""
    if len(ns) and int(ns.max()) < 0:
        return np.full(len(ns), np.nan)
    out = (ns - t0) * unit
    if len(ns) and int(ns.min()) < 0:
        out[ns < 0] = np.nan
    return out


def _error_texts(columns: RawColumns, order: IntArray) -> dict[int, str]:
    """The samples' error texts, by their row in ``order``."""
    if not columns.errors:
        return {}
    row_of = np.empty(len(order), dtype=np.int64)
    row_of[order] = np.arange(len(order), dtype=np.int64)
    return {
        int(row_of[row]): f"{error}: {message}" if message else error
        for row, (error, message) in columns.errors.items()
    }


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
