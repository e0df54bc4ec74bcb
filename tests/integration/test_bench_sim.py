"""The load generator against the simulated engine's ground truth (docs/sim.md):
known TTFT, decode step, tokens per chunk, speculative acceptance, errors, counters.

Every sim is started on a free loopback port and killed by PID (``running_sim``);
every run is bounded by a request count."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from helpers.sim_truth import (
    RESOLUTION_S,
    after_written,
    before_emitted,
    generations,
    median,
)
from servesweep.bench.load import LoadOptions, run_workload_sync
from servesweep.bench.specdecode import parse_counters
from servesweep.bench.standalone import BenchServer, bench_workload, format_results, run_standalone
from servesweep.bench.target import Target
from servesweep.fakegpu.__main__ import main as fakegpu_main
from servesweep.models import LevelResult
from servesweep.servers.gpu import open_probe
from servesweep.sim.testing import SimRun, running_sim
from servesweep.spec.schema import workload_spec

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
    results = run_workload_sync(target(run), workload_spec(name="w", **spec))
    assert len(results) == 1
    return results[0]


def counters(run: SimRun, *names: str) -> dict[str, float]:
    return parse_counters(run.request("/metrics").body.decode(), names)


def _chunk_times(r: LevelResult) -> list[list[float]]:
    """Per request (in send order): when each content chunk arrived, on the monotonic
    clock of the sim's truth (s)."""
    t0 = r.info["t0_monotonic_ns"] / 1e9
    out = []
    for s in sorted(r.samples, key=lambda s: s.sent_at):
        assert s.first_token_at is not None
        times = [t0 + s.first_token_at]
        for gap in s.chunk_gaps:
            times.append(times[-1] + gap)
        out.append(times)
    return out


def _generator_margin(r: LevelResult) -> float:
    """How late the generator may stamp a chunk: 1 ms plus the largest lag its own
    event-loop monitor reported for the level, plus what that monitor cannot see (a
    stall shorter than its 5 ms interval, the 1 ms it subtracts for epoll)."""
    return 0.001 + r.info["loop_lag_ms"]["max"] / 1000 + 0.005 + 0.001


def test_concurrency_1_timing_matches_the_sims_truth(tmp_path: Path) -> None:
    spec = {"concurrency": [1], "requests": 16, "max_tokens": 12, "ignore_eos": True}
    with sim(tmp_path, "--ttft-ms", "30", "--step-ms", "8", "--batch-slowdown", "0") as run:
        r = bench(run, **spec)
        truth = generations(run)
    m = r.metrics
    assert m["completed"] == 16 and m["failed"] == 0
    assert m["completion_tokens_mean"] == 12 and m["tokens_per_chunk_mean"] == 1.0
    assert all(s.chunk_tokens == (1,) * 12 and len(s.chunk_gaps) == 11 for s in r.samples)
    assert r.info["tokens_per_chunk_source"] == {"continuous_usage": 16}
    # one request at a time: the i-th sent is the sim's i-th generation
    gens = [truth[i] for i in sorted(truth)]
    samples = sorted(r.samples, key=lambda s: s.sent_at)
    assert len(gens) == 16
    t0 = r.info["t0_monotonic_ns"] / 1e9
    margin = _generator_margin(r)
    late: list[float] = []
    ttft_error: list[float] = []
    for times, sample, g in zip(_chunk_times(r), samples, gens, strict=True):
        assert g.due[0] - g.arrival == pytest.approx(0.030, abs=RESOLUTION_S)
        # never stamped before the sim sent the chunk, never later than the margin
        assert max(before_emitted(times, g)) <= RESOLUTION_S
        after = after_written(times, g)
        assert max(after) <= margin, (max(after), margin)
        late += after
        # TTFT: the sim's own (emission of the first chunk - arrival) plus the trips
        assert t0 + sample.sent_at <= g.arrival + RESOLUTION_S
        assert sample.ttft is not None
        ttft_error.append(sample.ttft - (g.emitted[0] - g.arrival))
    # on an idle machine the generator stamps within 1 ms of the sim's write; under
    # load, within the lag it measured itself (its median, for the median)
    assert median(late) <= 0.001 + r.info["loop_lag_ms"]["median"] / 1000
    # its statistics are the sim's true ones, off by no more than its stamping error
    spread = max(late) - min(late)
    true_tpot = [(g.written[-1] - g.written[0]) / 11 * 1000 for g in gens]
    assert abs(m["tpot_median_ms"] - median(true_tpot)) <= spread / 11 * 1000 + 1e-6
    true_gaps = [(b - a) * 1000 for g in gens for a, b in itertools.pairwise(g.written)]
    assert abs(m["chunk_gap_median_ms"] - median(true_gaps)) <= spread * 1000 + 1e-6
    assert m["itl_median_ms"] == pytest.approx(m["chunk_gap_median_ms"])  # one token a chunk
    # TTFT adds only the request's trip into the sim (which the time to first byte
    # bounds, request by request) and the stamping delay
    ttfb = r.info["ttfb_ms"]["median"] / 1000
    assert min(ttft_error) >= -RESOLUTION_S
    assert median(ttft_error) <= ttfb + margin
    assert m["concurrency_mean"] > 0.95
    # (on a busy machine the generator may rightly find its loop lagged: that is its
    # health, info["generator_health"], not a warning)
    assert not r.warnings, r.warnings


def test_concurrency_64_timing_matches_the_sims_truth(tmp_path: Path) -> None:
    with sim(
        tmp_path, "--ttft-ms", "30", "--step-ms", "20", "--batch-slowdown", "0",
        "--eos-range", "4:24",
    ) as run:  # fmt: skip
        r = bench(run, concurrency=[64], requests=256, max_tokens=64)
        truth = generations(run)
    m = r.metrics
    assert m["completed"] == 256 and len(truth) == 256
    gens = list(truth.values())
    # the sim's schedule: 30 ms to the first token, 20 ms steps
    assert all(g.due[0] - g.arrival == pytest.approx(0.030, abs=RESOLUTION_S) for g in gens)
    assert all(g.steps == pytest.approx([0.020] * len(g.steps), abs=RESOLUTION_S) for g in gens)
    # 64 streams at once cannot be paired with their generations one by one, but each
    # measured TPOT is its generation's true TPOT plus at most the stamping error over
    # (tokens - 1), so the medians of the two sets differ by no more than that
    margin = _generator_margin(r)
    true_tpot = [(g.written[-1] - g.written[0]) / (len(g.written) - 1) for g in gens]
    n_min = min(len(g.written) for g in gens)
    assert n_min >= 4
    assert abs(m["tpot_median_ms"] / 1000 - median(true_tpot)) <= margin / (n_min - 1)
    true_gaps = [b - a for g in gens for a, b in itertools.pairwise(g.written)]
    assert abs(m["chunk_gap_median_ms"] / 1000 - median(true_gaps)) <= margin
    # TTFT: each measured one is its generation's (first emission - arrival) plus the
    # request's trip into the sim and the stamping delay; the trip is shorter than the
    # request's time to first byte, itself at most the largest one measured
    true_ttft = [g.emitted[0] - g.arrival for g in gens]
    assert median(true_ttft) <= m["ttft_median_ms"] / 1000
    largest_ttfb = r.info["ttfb_ms"]["max"] / 1000
    assert m["ttft_median_ms"] / 1000 - largest_ttfb <= median(true_ttft) + margin
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
        gens = list(generations(run).values())
    m = r.metrics
    assert r.info["acceptance_source"] == "engine_counters"
    assert abs(m["acceptance_length"] - 2.848) <= 0.3
    # every decode chunk carries 1 + accepted tokens: the chunk estimate agrees
    assert abs(r.info["acceptance_estimate_from_chunks"] - m["acceptance_length"]) <= 0.15
    # the sim steps every 5 ms x 1.790; the measured gaps are the sim's true gaps, each
    # off by no more than the generator's stamping error (a stalled generator reads
    # several chunks at once: their gaps shrink to 0 and the next one grows)
    assert all(g.steps == pytest.approx([0.005 * 1.790] * len(g.steps), abs=2e-6) for g in gens)
    true_gaps = [b - a for g in gens for a, b in itertools.pairwise(g.written)]
    error = _generator_margin(r) + max(x for g in gens for x in g.writing)
    assert abs(m["chunk_gap_median_ms"] / 1000 - median(true_gaps)) <= error
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
        first = generations(run)
        timed = bench(run, concurrency=[2], duration=0.6, max_tokens=6, ignore_eos=True)
        every = generations(run)
    m = plain.metrics
    assert m["completed"] == 4 and m["completion_tokens_mean"] == 6
    assert "ttft_median_ms" not in m and "itl_median_ms" not in m
    # the sim's true E2E (arrival to the last token, 5 + 5 x 5 ms by its schedule) plus
    # the request's and the response's trips: each bounded by the lateness the sim
    # itself showed and by the generator's own margin
    gens = list(first.values())
    assert all(g.due[-1] - g.arrival == pytest.approx(0.030, abs=2e-6) for g in gens)
    true_e2e = [g.written[-1] - g.arrival for g in gens]
    sim_lag = 0.001 + max(x for g in gens for x in g.lateness)
    assert median(true_e2e) <= m["e2e_median_ms"] / 1000
    assert m["e2e_median_ms"] / 1000 <= median(true_e2e) + 2 * sim_lag + _generator_margin(plain)
    # a duration bounds the level: none sent after the deadline, every one sent finished
    # (the sim generated exactly as many), the level ends with the last of them
    n = timed.metrics["completed"]
    assert n == len(every) - len(first) >= 2
    assert max(s.sent_at for s in timed.samples) <= 0.6
    longest = max(s.e2e or 0 for s in timed.samples)
    assert timed.metrics["duration_s"] <= 0.6 + longest + 1e-6


def test_open_loop_achieves_the_rate(tmp_path: Path) -> None:
    with sim(tmp_path, "--ttft-ms", "5", "--step-ms", "2") as run:
        r = bench(run, rate=[40.0], arrival="poisson", duration=2.5, max_tokens=8, seed=3)
    m = r.metrics
    assert m["completed"] == 100
    assert r.level == "r40"
    assert all(s.scheduled_at is not None for s in r.samples)
    _check_the_rate(r, 40.0, 100)


def _check_the_rate(r: LevelResult, rate: float, n: int) -> None:
    """The arrivals span exactly n / rate seconds as planned, so the achieved rate is
    off only by how late the last request left: at most the largest schedule lag the
    generator measured (and judged its health by it when it was large)."""
    m = r.metrics
    planned_span = n / rate
    late = r.info["schedule_lag_ms"]["max"] / 1000 + 0.0005  # rounded to the microsecond
    assert n / (planned_span + late) <= m["achieved_rate"] <= n / planned_span * 1.000001
    if m["schedule_lag_p99_ms"] > 5.0:
        assert r.info["generator_health"]["state"] != "ok", r.info["generator_health"]


def test_workers_split_and_merge(tmp_path: Path) -> None:
    with sim(tmp_path, "--ttft-ms", "5", "--step-ms", "5", "--batch-slowdown", "0") as run:
        (r,) = run_workload_sync(
            target(run),
            workload_spec(name="w", concurrency=[4], requests=20, max_tokens=8, ignore_eos=True),
            LoadOptions(workers=2),
        )
        (o,) = run_workload_sync(
            target(run),
            workload_spec(name="w", rate=[50.0], arrival="constant", requests=40, max_tokens=4),
            LoadOptions(workers=2),
        )
        truth = generations(run)
    assert sorted(s.index for s in r.samples) == list(range(20))
    assert r.metrics["completed"] == 20 and r.info["workers"] == 2
    # four in flight, two per process; a generator too slow to keep them says so
    assert r.metrics["concurrency_mean"] > 3.5 or any("really in flight" in w for w in r.warnings)
    # the merged samples measure the sim's true TPOT (5 ms steps), off by no more than
    # the stamping error of the slower worker over the 7 steps of a request
    closed = [g for i, g in sorted(truth.items()) if i < 20]
    true_tpot = [(g.written[-1] - g.written[0]) / 7 for g in closed]
    assert all(g.steps == pytest.approx([0.005] * 7, abs=2e-6) for g in closed)
    error = _generator_margin(r) / 7
    assert abs(r.metrics["tpot_median_ms"] / 1000 - median(true_tpot)) <= error
    # open loop: arrivals dealt out in turn, one schedule on the shared clock
    assert sorted(s.index for s in o.samples) == list(range(40))
    _check_the_rate(o, 50.0, 40)
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
                workload_spec(
                    name="w", concurrency=[2], requests=4, max_tokens=20, ignore_eos=True
                ),
                LoadOptions(probe=probe, gpus=[0, 1]),
            )
    finally:
        probe.close()
    assert r.metrics["gpu_mem_used_max_mib"] == pytest.approx(3 * 1024, rel=0.01)
    assert set(r.info["gpu"]) == {"0", "1"}
    assert all(g["samples"] >= 2 for g in r.info["gpu"].values())


def test_standalone_bench_finds_the_model(tmp_path: Path) -> None:
    with sim(tmp_path, "--ttft-ms", "2", "--step-ms", "2") as run:
        results = run_standalone(
            BenchServer(f"http://127.0.0.1:{run.port}/v1"),
            bench_workload(concurrency=[1, 2], requests=4, max_tokens=8),
        )
    assert [r.level for r in results] == ["c1", "c2"]
    assert all(r.metrics["completed"] == 4 for r in results)
    console = Console(width=250, record=True)
    console.print(format_results(results))
    assert "c2" in console.export_text()
