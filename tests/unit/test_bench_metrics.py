"""Metrics of one level computed from raw requests with known timings."""

from __future__ import annotations

import pytest

from servesweep.bench.client import RawResult
from servesweep.bench.health import assess
from servesweep.bench.metrics import LevelContext, compute_level, percentile, summary_stats

MS = 1_000_000


def _raw(
    index: int,
    sent_ms: float,
    chunk_ms: list[float],
    tokens: list[int] | None,
    completion: int | None,
    *,
    end_ms: float | None = None,
    prompt: int = 10,
) -> RawResult:
    chunk_ns = [int(t * MS) for t in chunk_ms]
    return RawResult(
        index=index,
        sent_ns=int(sent_ms * MS),
        ok=True,
        first_ns=chunk_ns[0],
        first_answer_ns=chunk_ns[0],
        end_ns=int((end_ms if end_ms is not None else chunk_ms[-1]) * MS),
        chunk_ns=chunk_ns,
        chunk_tokens=tokens,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


def test_percentile_matches_linear_interpolation() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile([5.0], 99) == 5.0
    s = summary_stats([3.0, 1.0, 2.0])
    assert s == {
        "mean": 2.0,
        "median": 2.0,
        "p90": pytest.approx(2.8),
        "p99": pytest.approx(2.98),
        "max": 3.0,
    }


def test_single_token_chunks_give_ttft_tpot_itl() -> None:
    # sent at 0, first token at 30 ms, then 4 chunks every 8 ms
    raw = _raw(0, 0.0, [30, 38, 46, 54, 62], [1, 1, 1, 1, 1], 5)
    m, info, samples, warnings = compute_level([raw], LevelContext(t0_ns=0, concurrency=1))
    assert m["ttft_mean_ms"] == pytest.approx(30.0)
    assert m["e2e_mean_ms"] == pytest.approx(62.0)
    assert m["tpot_mean_ms"] == pytest.approx(8.0)  # (62 - 30) / (5 - 1)
    assert m["itl_median_ms"] == pytest.approx(8.0)
    assert m["chunk_gap_max_ms"] == pytest.approx(8.0)
    assert m["tokens_per_chunk_mean"] == 1.0
    assert m["completed"] == 1.0 and m["failed"] == 0.0
    assert info["tokens_per_chunk_source"] == {"continuous_usage": 1}
    assert samples[0].ttft == pytest.approx(0.030)
    assert samples[0].chunk_gaps == pytest.approx((0.008,) * 4)
    assert warnings == []


def test_multi_token_chunks_spread_the_gap_over_their_tokens() -> None:
    # speculative decoding: first chunk 1 token, then chunks of 3, 1, 4 tokens 12 ms apart
    raw = _raw(0, 0.0, [20, 32, 44, 56], [1, 3, 1, 4], 9)
    m, info, _, _ = compute_level([raw], LevelContext(t0_ns=0, concurrency=1))
    # per-token intervals: 4, 4, 4, 12, 3, 3, 3, 3
    assert m["itl_mean_ms"] == pytest.approx(36.0 / 8)
    assert m["itl_median_ms"] == pytest.approx(3.5)
    assert m["itl_max_ms"] == pytest.approx(12.0)
    assert m["chunk_gap_median_ms"] == pytest.approx(12.0)
    assert m["tpot_mean_ms"] == pytest.approx((56 - 20) / 8)
    assert m["tokens_per_chunk_mean"] == pytest.approx(9 / 4)
    # decode chunks between the first and the last: 3 and 1
    assert info["acceptance_estimate_from_chunks"] == pytest.approx(2.0)


def test_usage_totals_are_spread_when_no_continuous_usage() -> None:
    raw = _raw(0, 0.0, [10, 20, 30], None, 7)
    m, info, samples, _ = compute_level([raw], LevelContext(t0_ns=0, concurrency=1))
    assert samples[0].chunk_tokens == (3, 2, 2)
    assert samples[0].completion_tokens == 7
    assert info["tokens_per_chunk_source"] == {"usage_spread": 1}
    assert m["completion_tokens_mean"] == 7.0


def test_missing_usage_counts_chunks_and_warns() -> None:
    raw = _raw(0, 0.0, [10, 20, 30], None, None)
    m, info, _, warnings = compute_level([raw], LevelContext(t0_ns=0, concurrency=1))
    assert m["completion_tokens_mean"] == 3.0
    assert info["completion_tokens_source"] == "chunk_count"
    assert any("no usage" in w for w in warnings)


def test_failures_are_counted_by_type_and_throughput_uses_the_level_span() -> None:
    ok = [_raw(i, i * 100.0, [i * 100 + 10, i * 100 + 20], [1, 1], 2) for i in range(3)]
    bad = [
        RawResult(index=3, sent_ns=0, error="http_500", message="boom", end_ns=5 * MS),
        RawResult(index=4, sent_ns=0, error="http_500", end_ns=6 * MS),
        RawResult(index=5, sent_ns=0, error="timeout", end_ns=7 * MS),
    ]
    m, info, samples, _ = compute_level([*ok, *bad], LevelContext(t0_ns=0, concurrency=2))
    assert m["completed"] == 3 and m["failed"] == 3
    assert m["error_rate"] == pytest.approx(0.5)
    assert info["errors"] == {"http_500": 2, "timeout": 1}
    assert info["error_examples"]["http_500"] == "boom"
    assert m["duration_s"] == pytest.approx(0.220)
    assert m["request_throughput"] == pytest.approx(3 / 0.220)
    assert m["output_throughput"] == pytest.approx(6 / 0.220)
    assert m["input_throughput"] == pytest.approx(30 / 0.220)
    assert m["total_token_throughput"] == pytest.approx(36 / 0.220)
    assert len(samples) == 6 and sum(not s.ok for s in samples) == 3


def test_goodput_counts_requests_meeting_every_slo() -> None:
    fast = _raw(0, 0.0, [10, 15, 20], [1, 1, 1], 3)  # ttft 10, tpot 5
    slow_ttft = _raw(1, 0.0, [50, 55, 60], [1, 1, 1], 3)  # ttft 50
    slow_tpot = _raw(2, 0.0, [10, 40, 70], [1, 1, 1], 3)  # tpot 30
    ctx = LevelContext(t0_ns=0, concurrency=3, slo={"ttft_ms": 20, "tpot_ms": 10})
    m, _, _, _ = compute_level([fast, slow_ttft, slow_tpot], ctx)
    assert m["goodput"] == pytest.approx(1 / 0.070)
    assert m["request_throughput"] == pytest.approx(3 / 0.070)


def test_concurrency_mean_is_time_weighted_in_the_steady_window() -> None:
    # two requests overlap fully in [0, 100] ms, a third runs alone in [100, 200]
    a = _raw(0, 0.0, [50, 100], [1, 1], 2)
    b = _raw(1, 0.0, [50, 100], [1, 1], 2)
    c = _raw(2, 100.0, [150, 200], [1, 1], 2)
    ctx = LevelContext(t0_ns=0, concurrency=2, steady=(0, 100 * MS))
    m, info, _, warnings = compute_level([a, b, c], ctx)
    assert m["concurrency_mean"] == pytest.approx(2.0)
    assert info["concurrency_mean_whole_run"] == pytest.approx(1.5)
    assert not any("in flight" in w for w in warnings)
    starved = LevelContext(t0_ns=0, concurrency=4, steady=(0, 100 * MS))
    _, _, _, warnings = compute_level([a, b, c], starved)
    assert any("really in flight" in w for w in warnings)


def test_open_loop_rate_and_schedule_lag() -> None:
    raws = []
    for i in range(100):
        planned = (i + 1) * 10.0
        r = _raw(i, planned + 0.5, [planned + 5, planned + 6], [1, 1], 2)
        r.scheduled_ns = int(planned * MS)
        raws.append(r)
    m, _, _, warnings = compute_level(raws, LevelContext(t0_ns=0, rate=100.0))
    assert m["schedule_lag_p99_ms"] == pytest.approx(0.5)
    assert m["achieved_rate"] == pytest.approx(100 / 1.0005)
    assert warnings == []
    for i, r in enumerate(raws):
        if i % 10 == 0:
            r.sent_ns += 20 * MS
    m, _, _, warnings = compute_level(raws, LevelContext(t0_ns=0, rate=100.0))
    assert m["schedule_lag_p99_ms"] > 5
    # 20 ms late against one arrival every 10 ms: judged by bench.health, not a warning
    assert not any("planned arrival" in w for w in warnings)
    assert assess(m, rate=100.0).state == "unreliable"


def test_loop_lag_large_against_latency_is_judged_not_warned_per_level() -> None:
    raw = _raw(0, 0.0, [2, 3, 4], [1, 1, 1], 3)
    ctx = LevelContext(t0_ns=0, concurrency=1, loop_lags_ns=[3 * MS] * 10)
    m, _, _, warnings = compute_level([raw], ctx)
    assert m["loop_lag_p99_ms"] == pytest.approx(3.0)
    assert not warnings  # said once per sweep (sweep.core.health_notes), not per level
    health = assess(m)
    assert health.state == "mild" and "3.0 ms" in health.reason  # ITL p50 is 1 ms
    ctx = LevelContext(t0_ns=0, concurrency=1, loop_lags_ns=[6 * MS] * 10)
    m, _, _, warnings = compute_level([raw], ctx)
    assert not warnings and assess(m).state == "unreliable"  # 6 ms against 1 ms a token
    ctx = LevelContext(t0_ns=0, concurrency=1, loop_lags_ns=[int(1.5 * MS)] * 10)
    m, _, _, warnings = compute_level([raw], ctx)
    assert not warnings and assess(m).state == "ok"


def test_reasoning_counts_for_ttft_and_is_reported_apart() -> None:
    raw = _raw(0, 0.0, [10, 20, 30], [1, 1, 1], 3)
    raw.first_answer_ns = 20 * MS
    raw.reasoning_tokens = 1
    m, info, _, _ = compute_level([raw], LevelContext(t0_ns=0, concurrency=1))
    assert m["ttft_mean_ms"] == pytest.approx(10.0)
    assert info["reasoning"]["time_to_first_answer_ms"]["mean"] == pytest.approx(20.0)
    assert info["reasoning"]["reasoning_tokens_mean"] == 1


def test_an_unbelievable_usage_gives_the_client_count_and_a_warning() -> None:
    raw = _raw(0, 0.0, [10, 20, 30], None, None, prompt=0)
    raw.prompt_tokens = None
    raw.usage_problem = "completion_tokens -3 is negative"
    good = _raw(1, 0.0, [10, 20, 30], [1, 1, 1], 3)
    m, info, samples, warnings = compute_level([raw, good], LevelContext(t0_ns=0, concurrency=2))
    assert m["completion_tokens_mean"] == 3.0  # three chunks, counted by the client
    assert m["input_throughput"] == pytest.approx(10 / 0.030)  # only the credible prompt
    assert samples[0].completion_tokens == 3 and samples[0].prompt_tokens is None
    assert info["usage_rejected"] == 1
    assert info["usage_rejected_example"] == "completion_tokens -3 is negative"
    assert any("cannot be true" in w and "-3 is negative" in w for w in warnings)
    assert not any("no usage" in w for w in warnings)


def test_a_failed_request_keeps_its_error_text_and_resends_are_counted() -> None:
    text = "ServerDisconnectedError: Server disconnected"
    bad = RawResult(index=1, sent_ns=0, error="connection", message=text, end_ns=MS)
    ok = _raw(0, 0.0, [10, 20], [1, 1], 2)
    ok.resent = "ClientOSError: [Errno 104] Connection reset by peer"
    m, info, samples, _ = compute_level([ok, bad], LevelContext(t0_ns=0, concurrency=1))
    assert info["errors"] == {"connection": 1}  # grouped by type
    assert info["error_examples"] == {"connection": text}
    assert samples[1].error == f"connection: {text}"  # each request keeps the text
    assert samples[0].error is None
    assert info["resent_requests"] == 1
    assert info["resent_example"] == ok.resent
    assert m["completed"] == 1 and m["failed"] == 1


def test_answers_that_end_their_turn_despite_ignore_eos_are_said() -> None:
    def answers(*reasons: str | None) -> list[RawResult]:
        out = []
        for i, reason in enumerate(reasons):
            raw = _raw(i, 0.0, [10, 20], [1, 1], 2)
            raw.finish_reason = reason
            out.append(raw)
        return out

    # honoured: every answer ran to max_tokens
    _, info, _, warnings = compute_level(
        answers("length", "length"), LevelContext(t0_ns=0, ignore_eos=(True, True))
    )
    assert info["finish_reasons"] == {"length": 2}
    assert not any("ignore_eos" in w for w in warnings)
    # sent, but one answer ended at the model's end of turn all the same
    _, info, _, warnings = compute_level(
        answers("length", "stop", None), LevelContext(t0_ns=0, ignore_eos=(True, True))
    )
    assert info["finish_reasons"] == {"length": 1, "stop": 1, "none": 1}
    [said] = [w for w in warnings if "ignore_eos" in w]
    assert said.startswith("1 of 3 answers ended at the model's end of turn"), said
    # asked, but the engine has no ignore_eos: not sent, and the lengths are the model's
    _, _, _, warnings = compute_level(
        answers("stop", "stop"), LevelContext(t0_ns=0, ignore_eos=(True, False))
    )
    [said] = [w for w in warnings if "ignore_eos" in w]
    assert "does not support it (not sent): 2 of 2 answers ended" in said, said
    # not asked: a model that ends its turn is no news
    _, _, _, warnings = compute_level(answers("stop"), LevelContext(t0_ns=0))
    assert not any("ignore_eos" in w for w in warnings)
