"""Token timing of the simulated engine, measured by a streaming client on loopback.

Each request is checked against the sim's own ground truth (the ``generation`` lines
of its truth file): the deadlines follow the timing model exactly, no chunk is
emitted before its deadline, and the client sees every chunk after the sim emitted it
and within a margin derived from the lag the client's event loop measured meanwhile
(1 ms on an idle machine). A loaded machine widens that margin; it cannot make a
check pass or fail by chance.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from helpers.sim_truth import (
    LAG_INTERVAL_S,
    RESOLUTION_S,
    Generation,
    after_written,
    before_emitted,
    generations,
    lag_margin,
    median,
)
from servesweep.bench.telemetry import LoopLagMonitor
from servesweep.sim.specdecode import SpecModel
from servesweep.sim.testing import SimRun, start_sim
from servesweep.sim.tokenizer import count_tokens


@pytest.fixture
def sims() -> Iterator[list[SimRun]]:
    started: list[SimRun] = []
    try:
        yield started
    finally:
        for run in started:
            run.close()


@dataclass(frozen=True)
class Stream:
    index: int
    """The sim's index of the generation (``x-sim-request``)."""
    start: float
    """time.monotonic() just before the request was sent."""
    arrivals: list[float]
    """time.monotonic() when each content chunk arrived."""
    tokens: list[int]


async def _stream(
    session: aiohttp.ClientSession, port: int, max_tokens: int, prompt: str = "time me"
) -> Stream:
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    start = time.monotonic()
    arrivals: list[float] = []
    tokens: list[int] = []
    async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as resp:
        assert resp.status == 200
        index = int(resp.headers["x-sim-request"])
        async for raw in resp.content:
            now = time.monotonic()
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"]:
                arrivals.append(now)
                tokens.append(count_tokens(chunk["choices"][0]["text"]))
    return Stream(index, start, arrivals, tokens)


@dataclass(frozen=True)
class Run:
    streams: list[Stream]
    lags: list[float]
    """The client's event-loop lag samples (s) while the streams ran."""


async def _run(
    port: int, concurrency: int, max_tokens: int, rounds: int, prompt: str = "time me"
) -> Run:
    monitor = LoopLagMonitor(LAG_INTERVAL_S)
    async with aiohttp.ClientSession() as session:
        monitor.start()
        out: list[Stream] = []
        try:
            for _ in range(rounds):
                out += await asyncio.gather(
                    *(_stream(session, port, max_tokens, prompt) for _ in range(concurrency))
                )
        finally:
            await monitor.stop()
    return Run(out, [ns / 1e9 for ns in monitor.lags_ns])


def _check_against_truth(run: SimRun, result: Run) -> dict[int, Generation]:
    """Every stream matches its generation: same chunks, none emitted before its
    deadline, each seen by the client after the sim started to write it and, after
    the write returned, within the margin of the client's own measured lag."""
    truth = generations(run)
    margin = lag_margin(result.lags)
    for stream in result.streams:
        g = truth[stream.index]
        assert stream.tokens == list(g.tokens)
        assert min(g.lateness) >= -RESOLUTION_S, "a chunk left before its deadline"
        early = before_emitted(stream.arrivals, g)
        assert max(early) <= RESOLUTION_S, "the client stamped a chunk before it was sent"
        late = after_written(stream.arrivals, g)
        assert max(late) <= margin, (max(late), margin)
        assert stream.start <= g.arrival + RESOLUTION_S
    return truth


def test_ttft_and_itl_at_concurrency_1(tmp_path: Path, sims: list[SimRun]) -> None:
    run = start_sim(["--load-time", "0", "--ttft-ms", "30", "--step-ms", "8"], tmp_path)
    sims.append(run)
    run.wait_ready()
    result = asyncio.run(_run(run.port, 1, 25, rounds=6))
    truth = _check_against_truth(run, result)
    for stream in result.streams:
        g = truth[stream.index]
        assert stream.tokens == [1] * 25
        # the schedule: first token 30 ms after arrival, then one chunk every 8 ms
        assert g.due[0] - g.arrival == pytest.approx(0.030, abs=RESOLUTION_S)
        assert g.steps == pytest.approx([0.008] * 24, abs=RESOLUTION_S)
        # the client's TTFT is the sim's plus the trip of the request and of the chunk
        assert stream.arrivals[0] - stream.start >= g.emitted[0] - g.arrival
    # the sim keeps its deadlines (on an idle machine within ~0.1 ms): late by no
    # more than the machine's scheduling lag the client measured meanwhile
    lateness = [x for s in result.streams for x in truth[s.index].lateness]
    assert median(lateness) <= lag_margin(result.lags)


def test_batch_slowdown_with_concurrency(tmp_path: Path, sims: list[SimRun]) -> None:
    args = ["--load-time", "0", "--ttft-ms", "5", "--step-ms", "10", "--batch-slowdown", "0.5"]
    run = start_sim(args, tmp_path)
    sims.append(run)
    run.wait_ready()
    result = asyncio.run(_run(run.port, 4, 20, rounds=1))
    truth = _check_against_truth(run, result)
    # a step lasts 10 ms * (1 + 0.5 * (running - 1)): with 4 running, 25 ms
    allowed = [0.010 * (1 + 0.5 * (n - 1)) for n in (1, 2, 3, 4)]
    steps = [s for g in truth.values() for s in g.steps]
    assert all(min(abs(s - a) for a in allowed) <= RESOLUTION_S for s in steps), steps
    middle = [s for g in truth.values() for s in g.steps[2:-2]]
    assert median(middle) == pytest.approx(0.025, abs=RESOLUTION_S)


def test_spec_decode_tokens_per_chunk_and_step_time(tmp_path: Path, sims: list[SimRun]) -> None:
    spec = SpecModel(budget=12, topk=3, window=2048)
    args = ["--load-time", "0", "--ttft-ms", "5", "--step-ms", "4", "--seed", "1"]
    args += ["--budget", "12", "--topk", "3", "--window", "2048"]
    run = start_sim(args, tmp_path)
    sims.append(run)
    run.wait_ready()
    result = asyncio.run(_run(run.port, 1, 400, rounds=2))
    truth = _check_against_truth(run, result)
    per_chunk = [t for s in result.streams for t in s.tokens[1:-1]]  # no prefill, no cut
    assert max(per_chunk) > 1
    assert sum(per_chunk) / len(per_chunk) == pytest.approx(spec.expected_tokens_per_step, rel=0.12)
    steps = [s for g in truth.values() for s in g.steps]
    assert steps == pytest.approx([0.004 * spec.step_factor] * len(steps), abs=RESOLUTION_S)


def test_prefill_adds_prompt_tokens_over_speed(tmp_path: Path, sims: list[SimRun]) -> None:
    args = ["--load-time", "0", "--ttft-ms", "10", "--step-ms", "1", "--prefill-tok-s", "1000"]
    run = start_sim(args, tmp_path)
    sims.append(run)
    run.wait_ready()
    short = asyncio.run(_run(run.port, 1, 2, rounds=3, prompt="a"))
    long = asyncio.run(_run(run.port, 1, 2, rounds=3, prompt="word " * 100))
    truth = _check_against_truth(run, short) | _check_against_truth(run, long)
    for result, ttft in ((short, 0.010 + 1 / 1000), (long, 0.010 + 100 / 1000)):
        for stream in result.streams:
            g = truth[stream.index]
            assert g.due[0] - g.arrival == pytest.approx(ttft, abs=RESOLUTION_S)
            assert stream.arrivals[0] - stream.start >= ttft - RESOLUTION_S


def test_max_num_seqs_queues_requests(tmp_path: Path, sims: list[SimRun]) -> None:
    args = ["--load-time", "0", "--ttft-ms", "10", "--step-ms", "10", "--batch-slowdown", "0"]
    run = start_sim([*args, "--max-num-seqs", "2"], tmp_path)
    sims.append(run)
    run.wait_ready()
    result = asyncio.run(_run(run.port, 4, 30, rounds=2))
    truth = _check_against_truth(run, result)
    spans = [(g.admitted, g.emitted[-1]) for g in truth.values()]
    # never more than two generations at once
    for start, _ in spans:
        assert sum(1 for a, b in spans if a <= start < b) <= 2
    queued = [g for g in truth.values() if g.admitted != g.arrival]
    assert queued, "four requests at once, two slots: some must have waited"
    for g in queued:
        # admitted when another generation ended; TTFT counts from admission
        assert any(0 <= g.admitted - b <= lag_margin(result.lags) for _, b in spans)
        assert g.due[0] - g.admitted == pytest.approx(0.010, abs=RESOLUTION_S)
    for g in truth.values():
        if g not in queued:
            assert g.due[0] - g.arrival == pytest.approx(0.010, abs=RESOLUTION_S)
