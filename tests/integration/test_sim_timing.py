"""Token timing of the simulated engine, measured by a streaming client on loopback."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

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


async def _stream(
    session: aiohttp.ClientSession, port: int, max_tokens: int
) -> tuple[float, list[float], list[int]]:
    """TTFT (s), arrival times of content chunks (s), tokens per chunk."""
    body = {"prompt": "time me", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    arrivals: list[float] = []
    tokens: list[int] = []
    async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as resp:
        assert resp.status == 200
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            if chunk["choices"]:
                arrivals.append(now)
                tokens.append(count_tokens(chunk["choices"][0]["text"]))
    return arrivals[0] - start, arrivals, tokens


Stream = tuple[float, list[float], list[int]]


async def _run(port: int, concurrency: int, max_tokens: int, rounds: int) -> list[Stream]:
    async with aiohttp.ClientSession() as session:
        out: list[Stream] = []
        for _ in range(rounds):
            out += await asyncio.gather(
                *(_stream(session, port, max_tokens) for _ in range(concurrency))
            )
        return out


def _itls(arrivals: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(arrivals)]


def test_ttft_and_itl_at_concurrency_1(tmp_path: Path, sims: list[SimRun]) -> None:
    run = start_sim(["--load-time", "0", "--ttft-ms", "30", "--step-ms", "8"], tmp_path)
    sims.append(run)
    run.wait_ready()
    results = asyncio.run(_run(run.port, 1, 25, rounds=6))[1:]  # first one warms up
    ttfts = [r[0] * 1000 for r in results]
    itls = [i * 1000 for r in results for i in _itls(r[1])]
    tpots = [(r[1][-1] - r[1][0]) * 1000 / (len(r[1]) - 1) for r in results]
    assert all(tokens == [1] * 25 for _, _, tokens in results)
    # Never early; the upper bounds leave headroom for a loaded 2-core machine (on an
    # idle one the TTFT overhead is ~0.8 ms, ITL and TPOT within 0.01 ms).
    assert 30.0 <= statistics.median(ttfts) <= 34.0
    assert statistics.median(itls) == pytest.approx(8, abs=1.0)
    assert statistics.median(tpots) == pytest.approx(8, abs=0.5)


def test_batch_slowdown_with_concurrency(tmp_path: Path, sims: list[SimRun]) -> None:
    args = ["--load-time", "0", "--ttft-ms", "5", "--step-ms", "10", "--batch-slowdown", "0.5"]
    run = start_sim(args, tmp_path)
    sims.append(run)
    run.wait_ready()
    results = asyncio.run(_run(run.port, 4, 20, rounds=1))
    # With 4 running requests a step lasts 10 ms * (1 + 0.5 * 3) = 25 ms.
    middle = [i * 1000 for r in results for i in _itls(r[1])[2:-2]]
    assert statistics.median(middle) == pytest.approx(25, rel=0.15)


def test_spec_decode_tokens_per_chunk_and_step_time(tmp_path: Path, sims: list[SimRun]) -> None:
    spec = SpecModel(budget=12, topk=3, window=2048)
    args = ["--load-time", "0", "--ttft-ms", "5", "--step-ms", "4", "--seed", "1"]
    args += ["--budget", "12", "--topk", "3", "--window", "2048"]
    run = start_sim(args, tmp_path)
    sims.append(run)
    run.wait_ready()
    results = asyncio.run(_run(run.port, 1, 400, rounds=2))
    per_chunk = [t for r in results for t in r[2][1:-1]]  # skip prefill and truncated last
    assert max(per_chunk) > 1
    assert statistics.mean(per_chunk) == pytest.approx(spec.expected_tokens_per_step, rel=0.12)
    itls = [i * 1000 for r in results for i in _itls(r[1])]
    assert statistics.median(itls) == pytest.approx(4 * spec.step_factor, abs=1.0)


async def _ttft(port: int, prompt: str) -> float:
    body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as session:
        start = time.perf_counter()
        async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as resp:
            async for raw in resp.content:
                if raw.startswith(b'data: {"id"'):
                    return time.perf_counter() - start
    raise AssertionError("no chunk")


def test_prefill_adds_prompt_tokens_over_speed(tmp_path: Path, sims: list[SimRun]) -> None:
    args = ["--load-time", "0", "--ttft-ms", "10", "--step-ms", "1", "--prefill-tok-s", "1000"]
    run = start_sim(args, tmp_path)
    sims.append(run)
    run.wait_ready()
    short = min(asyncio.run(_ttft(run.port, "a")) for _ in range(5)) * 1000
    long = min(asyncio.run(_ttft(run.port, "word " * 100)) for _ in range(5)) * 1000
    assert 11 <= short <= 15  # 10 ms + 1 token / 1000 tok/s
    assert 110 <= long <= 114  # 10 ms + 100 tokens / 1000 tok/s


def test_max_num_seqs_queues_requests(tmp_path: Path, sims: list[SimRun]) -> None:
    args = ["--load-time", "0", "--ttft-ms", "10", "--step-ms", "10", "--batch-slowdown", "0"]
    run = start_sim([*args, "--max-num-seqs", "2"], tmp_path)
    sims.append(run)
    run.wait_ready()
    results = asyncio.run(_run(run.port, 4, 10, rounds=2))[4:]  # the first round warms up
    ttfts = sorted(r[0] * 1000 for r in results)
    # Two start at once; two wait for a slot: 10 ms TTFT + 9 steps of 10 ms, then theirs.
    assert ttfts[1] < 40
    assert 110 <= ttfts[2] <= 135
