"""The load generator against the simulated engine's ground truth (docs/sim.md):
known TTFT, decode step, tokens per chunk, speculative acceptance, errors, counters.

Every sim is started on a free loopback port and killed by PID (``running_sim``);
every run is bounded by a request count."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from servesweep.bench.load import run_workload_sync
from servesweep.bench.specdecode import parse_counters
from servesweep.bench.standalone import format_results, run_standalone
from servesweep.bench.target import Target
from servesweep.models import LevelResult
from servesweep.servers.gpu import open_probe
from servesweep.sim.fakegpu.__main__ import main as fakegpu_main
from servesweep.sim.testing import SimRun, running_sim
from servesweep.spec.schema import WorkloadSpec

COUNTERS = {
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
}


@contextmanager
def sim(tmp_path: Path, *args: str) -> Iterator[SimRun]:
    with running_sim(["--load-time", "0", *args], tmp_path) as run:
        run.wait_ready()
        yield run


def target(run: SimRun, **kw: Any) -> Target:
    return Target(
        base_url=f"http://127.0.0.1:{run.port}",
        model="sim-model",
        tokenize_path="/tokenize",
        spec_decode_counters=COUNTERS,
        timeout_s=60,
        **kw,
    )


def bench(run: SimRun, **spec: Any) -> LevelResult:
    results = run_workload_sync(target(run), WorkloadSpec(name="w", **spec))
    assert len(results) == 1
    return results[0]


def counters(run: SimRun, *names: str) -> dict[str, float]:
    return parse_counters(run.request("/metrics").body.decode(), names)


def test_concurrency_1_timing_within_1ms(tmp_path: Path) -> None:
    spec = {"concurrency": [1], "requests": 16, "max_tokens": 12, "ignore_eos": True}
    with sim(tmp_path, "--ttft-ms", "30", "--step-ms", "8", "--batch-slowdown", "0") as run:
        r = bench(run, **spec)
    m = r.metrics
    # The sim counts TTFT from the moment its handler starts and sends the role-only
    # chunk at once: time to first byte is the request's trip into the sim (HTTP in
    # both processes), what follows is the simulated TTFT, which counting the
    # role-only chunk would hide.
    ttfb = r.info["ttfb_ms"]["median"]
    assert ttfb < 5
    assert abs(m["ttft_median_ms"] - ttfb - 30.0) <= 1.0
    assert 29.0 <= m["ttft_median_ms"] <= 31.0 + ttfb
    assert abs(m["tpot_median_ms"] - 8.0) <= 1.0
    assert abs(m["itl_median_ms"] - 8.0) <= 1.0
    assert abs(m["chunk_gap_median_ms"] - 8.0) <= 1.0
    assert m["completed"] == 16 and m["failed"] == 0
    assert m["completion_tokens_mean"] == 12 and m["tokens_per_chunk_mean"] == 1.0
    assert all(s.chunk_tokens == (1,) * 12 and len(s.chunk_gaps) == 11 for s in r.samples)
    assert m["concurrency_mean"] > 0.95
    assert r.info["tokens_per_chunk_source"] == {"continuous_usage": 16}
    # on a busy machine the generator may rightly warn that its loop lagged; nothing else
    assert all("event loop lagged" in w for w in r.warnings)


def test_concurrency_64_timing_within_5ms(tmp_path: Path) -> None:
    with sim(
        tmp_path, "--ttft-ms", "30", "--step-ms", "20", "--batch-slowdown", "0",
        "--eos-range", "4:24",
    ) as run:  # fmt: skip
        r = bench(run, concurrency=[64], requests=256, max_tokens=64)
    m = r.metrics
    assert m["completed"] == 256
    assert abs(m["tpot_median_ms"] - 20.0) <= 5.0
    assert abs(m["itl_median_ms"] - 20.0) <= 5.0
    # TTFT counts from the sim's handler start, when it sends the role-only chunk;
    # with 64 requests arriving at once, that start waits for the sim's HTTP handling
    assert abs(m["ttft_median_ms"] - r.info["ttfb_ms"]["median"] - 30.0) <= 5.0
    assert m["concurrency_mean"] >= 0.95 * 64


def test_speculative_decoding_chunks_and_acceptance(tmp_path: Path) -> None:
    # budget 8, top-k 4, window 2048: E[L] = 2.848 tokens per step, step x 1.790
    with sim(
        tmp_path, "--ttft-ms", "10", "--step-ms", "5", "--batch-slowdown", "0",
        "--budget", "8", "--topk", "4", "--window", "2048",
    ) as run:  # fmt: skip
        r = bench(
            run,
            endpoint="completions",
            concurrency=[4],
            requests=16,
            max_tokens=96,
            ignore_eos=True,
        )
    m = r.metrics
    assert r.info["acceptance_source"] == "engine_counters"
    assert abs(m["acceptance_length"] - 2.848) <= 0.3
    # every decode chunk carries 1 + accepted tokens: the chunk estimate agrees
    assert abs(r.info["acceptance_estimate_from_chunks"] - m["acceptance_length"]) <= 0.15
    assert abs(m["chunk_gap_median_ms"] - 5 * 1.790) <= 1.0
    assert m["tokens_per_chunk_mean"] > 2.0
    # per-token ITL: each chunk's gap is spread over its tokens
    gaps = sum(sum(s.chunk_gaps) for s in r.samples)
    tokens = sum(sum(s.chunk_tokens[1:]) for s in r.samples)
    assert m["itl_mean_ms"] == pytest.approx(gaps / tokens * 1000)
    assert m["itl_mean_ms"] < m["chunk_gap_mean_ms"] / 2
    assert all(sum(s.chunk_tokens) == 96 == s.completion_tokens for s in r.samples)
    detail = r.info["spec_decode"]
    assert detail["draft_tokens"] == 8 * detail["drafts"]
    json.dumps(r.info)  # the store keeps info as JSON


def test_errors_counted_and_usage_matches_server_counters(tmp_path: Path) -> None:
    names = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
    with sim(tmp_path, "--ttft-ms", "1", "--step-ms", "1", "--error-rate", "0.3") as run:
        before = counters(run, *names)
        r = bench(run, concurrency=[4], requests=40, max_tokens=32)
        after = counters(run, *names)
    m = r.metrics
    ok = [s for s in r.samples if s.ok]
    assert m["completed"] + m["failed"] == 40 and 0 < m["failed"] < 40
    assert r.info["errors"] == {"http_500": m["failed"]}
    assert m["error_rate"] == pytest.approx(m["failed"] / 40)
    generated = after[names[0]] - before[names[0]]
    assert sum(s.completion_tokens or 0 for s in ok) == generated
    assert m["completion_tokens_mean"] == pytest.approx(generated / len(ok))
    assert r.info["completion_tokens_source"] == "usage"


def test_non_streaming_and_duration_bound(tmp_path: Path) -> None:
    with sim(tmp_path, "--ttft-ms", "5", "--step-ms", "5", "--batch-slowdown", "0") as run:
        plain = bench(run, stream=False, concurrency=[2], requests=4, max_tokens=6, ignore_eos=True)
        timed = bench(run, concurrency=[2], duration=0.6, max_tokens=6, ignore_eos=True)
    m = plain.metrics
    assert m["completed"] == 4 and m["completion_tokens_mean"] == 6
    assert abs(m["e2e_median_ms"] - (5 + 5 * 5)) <= 5.0
    assert "ttft_median_ms" not in m and "itl_median_ms" not in m
    # about 0.6 s / 30 ms per request x 2 slots; none started after the deadline
    n = timed.metrics["completed"]
    assert 20 <= n <= 42
    assert max(s.sent_at for s in timed.samples) <= 0.6
    assert timed.metrics["duration_s"] < 0.6 + 0.2


def test_open_loop_achieves_the_rate(tmp_path: Path) -> None:
    with sim(tmp_path, "--ttft-ms", "5", "--step-ms", "2") as run:
        r = bench(run, rate=[40.0], arrival="poisson", duration=2.5, max_tokens=8, seed=3)
    m = r.metrics
    assert m["completed"] == 100
    assert m["achieved_rate"] == pytest.approx(40.0, rel=0.02)
    assert m["schedule_lag_p99_ms"] < 20
    assert r.level == "r40"
    assert all(s.scheduled_at is not None for s in r.samples)


def test_workers_split_and_merge(tmp_path: Path) -> None:
    with sim(tmp_path, "--ttft-ms", "5", "--step-ms", "5", "--batch-slowdown", "0") as run:
        (r,) = run_workload_sync(
            target(run),
            WorkloadSpec(name="w", concurrency=[4], requests=20, max_tokens=8, ignore_eos=True),
            workers=2,
        )
        (o,) = run_workload_sync(
            target(run),
            WorkloadSpec(name="w", rate=[50.0], arrival="constant", requests=40, max_tokens=4),
            workers=2,
        )
    assert sorted(s.index for s in r.samples) == list(range(20))
    assert r.metrics["completed"] == 20 and r.info["workers"] == 2
    assert r.metrics["concurrency_mean"] > 3.5
    assert abs(r.metrics["tpot_median_ms"] - 5.0) <= 1.5
    # open loop: arrivals dealt out in turn, one schedule on the shared clock
    assert sorted(s.index for s in o.samples) == list(range(40))
    assert o.metrics["achieved_rate"] == pytest.approx(50.0, rel=0.02)
    planned = sorted(s.scheduled_at or 0 for s in o.samples)
    assert planned == pytest.approx([(i + 1) / 50 for i in range(40)], abs=1e-6)


def test_crash_mid_level_is_data(tmp_path: Path) -> None:
    with sim(tmp_path, "--ttft-ms", "5", "--step-ms", "20", "--crash-after", "3") as run:
        r = bench(run, concurrency=[2], requests=8, max_tokens=16, ignore_eos=True)
    assert r.metrics["failed"] >= 5
    assert set(r.info["errors"]) <= {"connection", "incomplete", "empty"}


def test_warmup_excluded_and_synthetic_prompts_calibrated(tmp_path: Path) -> None:
    name = "vllm:prompt_tokens_total"
    with sim(tmp_path, "--ttft-ms", "1", "--step-ms", "1") as run:
        before = counters(run, name)[name]
        r = bench(
            run, endpoint="completions", dataset="synthetic", input_tokens=120,
            concurrency=[2], requests=6, warmup=3, max_tokens=4,
        )  # fmt: skip
        after = counters(run, name)[name]
    assert len(r.samples) == 6
    assert r.info["calibration"]["source"] == "tokenize"
    assert all(abs((s.prompt_tokens or 0) - 120) <= 6 for s in r.samples)
    assert after - before == pytest.approx(sum(s.prompt_tokens or 0 for s in r.samples) / 6 * 9)


def test_gpu_telemetry_through_the_fake_gpus(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus"
    assert fakegpu_main(["init", str(gpus), "--count", "2", "--memory", "8GiB"]) == 0
    probe = open_probe("fake", str(gpus))
    try:
        with running_sim(
            ["--load-time", "0", "--gpus", "0,1", "--mem-per-gpu", "3GiB", "--step-ms", "20"],
            tmp_path,
            fake_gpus=gpus,
        ) as run:
            run.wait_ready()
            (r,) = run_workload_sync(
                target(run),
                WorkloadSpec(name="w", concurrency=[2], requests=4, max_tokens=20, ignore_eos=True),
                probe=probe,
                gpus=[0, 1],
            )
    finally:
        probe.close()
    assert r.metrics["gpu_mem_used_max_mib"] == pytest.approx(3 * 1024, rel=0.01)
    assert set(r.info["gpu"]) == {"0", "1"}
    assert all(g["samples"] >= 2 for g in r.info["gpu"].values())


def test_standalone_bench_finds_the_model(tmp_path: Path) -> None:
    with sim(tmp_path, "--ttft-ms", "2", "--step-ms", "2") as run:
        results = run_standalone(
            f"http://127.0.0.1:{run.port}/v1", concurrency=[1, 2], requests=4, max_tokens=8
        )
    assert [r.level for r in results] == ["c1", "c2"]
    assert all(r.metrics["completed"] == 4 for r in results)
    console = Console(width=250, record=True)
    console.print(format_results(results))
    assert "c2" in console.export_text()
