"""The load generator's per-level metrics as computed before they were vectorised
(a copy of ``servesweep.bench.metrics`` then, Python lists and a full sort): the
reference ``tests/unit/test_metrics_vectorised.py`` pins the current module to.

Per-level metrics of the load generator, computed from the raw requests.

Definitions follow ``vllm bench serve`` where they mean the same; docs/metrics.md
lists every metric with its unit. In short, per request: TTFT to the first chunk
carrying generated tokens (a role-only chunk does not count), E2E to the last
chunk, completion tokens from the server's usage, TPOT = (E2E - TTFT) / (tokens - 1);
per level: ITL per token (a chunk of k tokens contributes k intervals of gap/k) with
the raw inter-chunk gap beside it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from servesweep import metrics_catalog as mc
from servesweep.bench.client import RawResult
from servesweep.bench.metrics import LevelContext
from servesweep.bench.specdecode import estimate_from_chunks
from servesweep.decide.level_intervals import SLO_KEYS, meets_slo
from servesweep.metrics_catalog import Latency, Stat, latency
from servesweep.models import RequestSample

__all__ = ["compute_level", "percentile", "summary_stats"]

_NS = 1e-9
_MS = 1e-6


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    n = len(sorted_values)
    if n == 1:
        return float(sorted_values[0])
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def summary_stats(values: Sequence[float]) -> dict[str, float]:
    """mean, median, p90, p99, max of ``values``, keyed by the values of
    :class:`~servesweep.metrics_catalog.Stat` (empty: no keys)."""
    if not values:
        return {}
    s = sorted(values)
    return {
        Stat.MEAN.value: sum(s) / len(s),
        Stat.MEDIAN.value: percentile(s, 50),
        Stat.P90.value: percentile(s, 90),
        Stat.P99.value: percentile(s, 99),
        Stat.MAX.value: float(s[-1]),
    }


def _spread(total: int, n: int) -> list[int]:
    base, rem = divmod(total, n)
    return [base + (1 if i < rem else 0) for i in range(n)]


def _in_flight_mean(raws: Sequence[RawResult], start: int, end: int) -> float:
    """Time-weighted mean number of requests in flight in ``[start, end]``."""
    if end <= start:
        return 0.0
    events: list[tuple[int, int]] = []
    for r in raws:
        a, b = r.sent_ns, r.end_ns if r.end_ns is not None else r.sent_ns
        a, b = max(a, start), min(b, end)
        if b > a:
            events.append((a, 1))
            events.append((b, -1))
    events.sort()
    area = 0
    level = 0
    last = start
    for t, d in events:
        area += level * (t - last)
        level += d
        last = t
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
    itl: list[float] = []
    gaps_ms: list[float] = []
    prompt_tokens: list[int] = []
    completion_tokens: list[int] = []
    per_request_chunk_tokens: list[list[int]] = []
    token_source = Counter[str]()
    good = 0
    samples: list[RequestSample] = []
    reasoning: list[float] = []
    reasoning_tokens: list[int] = []
    slo = {k: v for k, v in ctx.slo.items() if k in SLO_KEYS}

    for r in sorted(raws, key=lambda x: x.sent_ns):
        n_chunks = len(r.chunk_ns)
        if r.chunk_tokens is not None and len(r.chunk_tokens) == n_chunks:
            tokens = r.chunk_tokens
            token_source["continuous_usage"] += 1
        elif r.completion_tokens is not None and n_chunks:
            tokens = _spread(r.completion_tokens, n_chunks)
            token_source["usage_spread"] += 1
        else:
            tokens = [1] * n_chunks
            if n_chunks:
                token_source["chunk_count"] += 1
        gaps = [(b - a) * _NS for a, b in zip(r.chunk_ns, r.chunk_ns[1:], strict=False)]
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
                chunk_gaps=tuple(gaps),
                chunk_tokens=tuple(tokens),
            )
        )
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
            for gap, k in zip(gaps, tokens[1:], strict=False):
                g = gap * 1e3
                gaps_ms.append(g)
                if k > 0:
                    itl.extend([g / k] * k)
            if r.first_answer_ns is not None and r.first_answer_ns > r.first_ns:
                reasoning.append((r.first_answer_ns - r.sent_ns) * _MS)
        if r.reasoning_tokens:
            reasoning_tokens.append(r.reasoning_tokens)
        if meets_slo(slo, {"ttft": t, "tpot": tp, "e2e": e}, ct):
            good += 1

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
    n_chunks_total = sum(len(t) for t in per_request_chunk_tokens)
    if n_chunks_total:
        chunk_tokens = sum(sum(t) for t in per_request_chunk_tokens)
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
