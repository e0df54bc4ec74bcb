"""Spec-decode counters, arrival schedules, GPU telemetry, the result table."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

import pytest
from rich.console import Console

from servesweep.bench.plan import arrival_offsets
from servesweep.bench.specdecode import (
    acceptance_from_counters,
    estimate_from_chunks,
    parse_counters,
    parse_per_position,
)
from servesweep.bench.standalone import (
    BenchServer,
    bench_workload,
    format_results,
    results_as_dicts,
    run_standalone,
)
from servesweep.bench.telemetry import GpuSampler, summarize_gpu
from servesweep.errors import ConfigError, GpuProbeError
from servesweep.models import GpuState, LevelResult

PROM = """\
# HELP vllm:spec_decode_num_drafts_total Number of drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} 100.0
vllm:spec_decode_num_drafts_total{model_name="m",engine="1"} 50.0
vllm:spec_decode_num_accepted_tokens_total{model_name="m",engine="0"} 210
vllm:spec_decode_num_accepted_tokens_created 1.7e9
vllm:other 3
"""
COUNTERS = {
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
}


def test_counters_are_summed_over_label_sets() -> None:
    got = parse_counters(PROM, list(COUNTERS.values()))
    assert got == {
        "vllm:spec_decode_num_drafts_total": 150.0,
        "vllm:spec_decode_num_accepted_tokens_total": 210.0,
    }


def test_acceptance_length_is_one_plus_accepted_per_draft() -> None:
    before = {COUNTERS["drafts"]: 50.0, COUNTERS["accepted"]: 10.0}
    after = {COUNTERS["drafts"]: 150.0, COUNTERS["accepted"]: 210.0}
    acc, detail = acceptance_from_counters(COUNTERS, before, after)
    assert acc == pytest.approx(3.0)
    assert detail == {"accepted_tokens": 200.0, "drafts": 100.0, "source": "engine_counters"}
    assert acceptance_from_counters(COUNTERS, after, after)[0] is None  # no draft in the level
    assert acceptance_from_counters({}, before, after) == (None, {})
    missing = acceptance_from_counters(COUNTERS, {}, {})
    assert missing[0] is None and missing[1]["counters_missing"]


PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def test_accepted_tokens_per_draft_position() -> None:
    text = (
        f'{PER_POS}{{engine="0",model_name="m",position="0"}} 40.0\n'
        f'{PER_POS}{{engine="0",model_name="m",position="1"}} 25.0\n'
        f'{PER_POS}{{engine="1",model_name="m",position="1"}} 5.0\n'
        f'{PER_POS}{{engine="0",model_name="m",position="2"}} 12.0\n'
        f"{PER_POS}_created 1.7e9\n"
        f'{PER_POS}{{engine="0",model_name="m"}} 99\n'
    )
    after = parse_per_position(text, PER_POS)
    assert after == {f"{PER_POS}#0": 40.0, f"{PER_POS}#1": 30.0, f"{PER_POS}#2": 12.0}
    counters = {**COUNTERS, "accepted_per_pos": PER_POS}
    after |= {COUNTERS["drafts"]: 60.0, COUNTERS["accepted"]: 82.0}
    before = {COUNTERS["drafts"]: 10.0, COUNTERS["accepted"]: 2.0, f"{PER_POS}#0": 2.0}
    acc, detail = acceptance_from_counters(counters, before, after)
    assert acc == pytest.approx(1 + 80 / 50)
    assert detail["accepted_per_position"] == [38.0, 30.0, 12.0]
    assert detail["acceptance_rate_per_position"] == [0.76, 0.6, 0.24]
    assert sum(detail["accepted_per_position"]) == detail["accepted_tokens"]


def test_engine_acceptance_gauge_is_averaged_over_engines() -> None:
    text = 'sglang:spec_accept_length{engine="0"} 3.0\nsglang:spec_accept_length{engine="1"} 2.0\n'
    gauges = parse_counters(text, ["sglang:spec_accept_length"], mean=True)
    acc, detail = acceptance_from_counters(
        {"accept_length": "sglang:spec_accept_length"}, {}, gauges
    )
    assert acc == pytest.approx(2.5) and detail["source"] == "engine_gauge"


def test_chunk_estimate_skips_first_and_last_chunk() -> None:
    assert estimate_from_chunks([[1, 3, 3, 1], [1, 2, 2]]) == pytest.approx(8 / 3)
    assert estimate_from_chunks([[1, 2]]) is None


@pytest.mark.parametrize("arrival", ["constant", "poisson", "gamma"])
def test_arrivals_hit_the_rate_exactly_and_are_seeded(arrival: str) -> None:
    offsets = arrival_offsets(200, 50.0, arrival, 0.5, seed=7)
    assert len(offsets) == 200
    assert offsets[-1] == pytest.approx(4e9, rel=1e-6)  # 200 requests at 50 req/s: 4 s
    assert offsets == sorted(offsets)
    assert offsets == arrival_offsets(200, 50.0, arrival, 0.5, seed=7)
    gaps = [b - a for a, b in zip([0, *offsets], offsets, strict=False)]
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    expected = {"constant": 0.0, "poisson": 1.0, "gamma": 2**0.5}[arrival]  # cv = 1/sqrt(shape)
    assert cv == pytest.approx(expected, abs=0.3)


class _Probe:
    name = "fake"

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    def snapshot(self, gpus: Sequence[int] | None = None) -> list[GpuState]:
        self.calls += 1
        if self.fail:
            raise GpuProbeError("nvml gone")
        used = (1000 + 10 * self.calls) * 2**20
        return [
            GpuState(
                index=g,
                name="H",
                total_bytes=2**35,
                used_bytes=used,
                utilization_pct=50.0 + g,
                power_w=300.0,
            )
            for g in (gpus or [0])
        ]

    def describe(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        pass


def test_gpu_sampler_and_summary() -> None:
    sampler = GpuSampler(_Probe(), [0, 1], interval_s=0.01)
    sampler.start()
    sampler.stop()
    assert sampler.samples and {s[1] for s in sampler.samples} == {0, 1}
    metrics, info = summarize_gpu(sampler.samples)
    assert metrics["gpu_util_mean_pct"] == pytest.approx(50.5)
    assert metrics["gpu_power_mean_w"] == pytest.approx(300.0)
    assert metrics["gpu_mem_used_max_mib"] == max(s[2] for s in sampler.samples)
    assert info["1"]["util_max_pct"] == 51.0
    failing = GpuSampler(_Probe(fail=True), [0])
    failing.sample_once()
    assert failing.errors == ["nvml gone"] and not failing.samples


def test_result_table_and_json() -> None:
    r = LevelResult(
        workload="bench",
        level="c4",
        repeat=0,
        metrics={
            "completed": 8,
            "failed": 1,
            "request_throughput": 2.5,
            "ttft_median_ms": 31.2,
            "acceptance_length": 2.8,
        },
        warnings=("slow generator",),
        info={"acceptance_source": "engine_counters", "errors": {"http_500": 1}},
    )
    console = Console(width=250, record=True)
    console.print(format_results([r]))
    text = console.export_text()
    assert "31.2/-" in text and "8/1" in text
    assert "slow generator" in text and "1 x http_500" in text
    # the acceptance column says what it is and where the number came from
    assert "accept len" in text and "2.80 counters" in text
    assert "accept len: speculative decoding's mean acceptance length" in text
    estimated = dataclasses.replace(
        r, info={"acceptance_source": "tokens_per_chunk_estimate"}, warnings=()
    )
    console = Console(width=250, record=True)
    console.print(format_results([estimated]))
    assert "2.80 chunk est." in console.export_text()
    plain = dataclasses.replace(r, metrics={"completed": 8}, warnings=(), info={})
    console = Console(width=250, record=True)
    console.print(format_results([plain]))
    assert "accept len:" not in console.export_text()  # no note without the number
    assert results_as_dicts([r])[0]["metrics"]["completed"] == 8


def test_standalone_option_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="not an http"):
        run_standalone(BenchServer("localhost:8000", model="m"), bench_workload())
    monkeypatch.delenv("SERVESWEEP_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="SERVESWEEP_TEST_KEY is not set"):
        server = BenchServer("http://127.0.0.1:1", model="m", api_key_env="SERVESWEEP_TEST_KEY")
        run_standalone(server, bench_workload())
    with pytest.raises(ConfigError, match="concurrency"):
        run_standalone(
            BenchServer("http://127.0.0.1:1", model="m"), bench_workload(concurrency=[0])
        )
