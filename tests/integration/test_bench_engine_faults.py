"""The load generator against servers that misbehave the way real engines do: one
that closes its connection after every streamed answer although it promised
keep-alive (llama.cpp's llama-server), one that cuts streams short, one whose
usage cannot be true, one that stalls, one that dies in the middle of a level.

Every server is a process on 127.0.0.1 (``tests/helpers/stub_engine.py`` or the
simulated engine), killed by PID; every level is bounded by a request count and
every command by a timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.integration.sweep_helpers import run_cli

from servesweep.bench.load import run_workload_sync
from servesweep.bench.plan import END_GRACE_MIN_S
from servesweep.bench.target import Target
from servesweep.models import LevelResult
from servesweep.sim.testing import running_sim
from servesweep.spec.schema import workload_spec

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def stub_engine(*args: str) -> Iterator[int]:
    """Start ``tests/helpers/stub_engine.py`` with ``args``; yield its port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.stub_engine", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "port N" once it listens; EOF if it died
        assert line.startswith("port "), f"stub engine did not start: {line!r}"
        yield int(line.split()[1])
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def bench(port: int, timeout_s: float = 60.0, **spec: Any) -> list[LevelResult]:
    target = Target(
        base_url=f"http://127.0.0.1:{port}", model="stub", metrics_path=None, timeout_s=timeout_s
    )
    return run_workload_sync(target, workload_spec(name="w", **spec))


def failed_texts(r: LevelResult) -> list[str]:
    return [s.error or "" for s in r.samples if not s.ok]


@pytest.mark.parametrize("close", ["now", "20"])
def test_a_server_that_closes_after_every_stream_loses_no_request(close: str) -> None:
    # llama-server: keep-alive promised, connection closed after each streamed answer
    # ("now"), or a little later ("20" ms: the close arrives after the next request
    # went out on the connection, which must then be sent once more)
    with stub_engine("--close-after-stream", close, "--gap-ms", "1") as port:
        results = bench(port, concurrency=[1, 2], requests=8, max_tokens=6)
    for r in results:
        assert (r.metrics["completed"], r.metrics["failed"]) == (8, 0), (r.level, r.info)
        assert all(s.completion_tokens == 6 for s in r.samples)
    if close == "20":
        resent = [r.info.get("resent_requests", 0) for r in results]
        assert all(n >= 1 for n in resent), resent
        assert "Server disconnected" in results[0].info["resent_example"] or (
            "Connection reset" in results[0].info["resent_example"]
        )


def test_a_stream_cut_short_is_a_failed_request() -> None:
    # the body ends cleanly after 3 of 8 tokens: no finish_reason, no [DONE]
    with stub_engine("--truncate-after", "3", "--close-after-stream", "keep") as port:
        (r,) = bench(port, concurrency=[2], requests=4, max_tokens=8)
    assert r.metrics["completed"] == 0 and r.metrics["failed"] == 4
    assert r.info["errors"] == {"incomplete": 4}
    assert all("cut short" in text for text in failed_texts(r))
    assert all(len(s.chunk_tokens) == 3 for s in r.samples)  # what arrived is kept


@pytest.mark.parametrize("usage", ["negative", "float", "short", "decreasing"])
def test_a_usage_that_cannot_be_true_is_replaced_by_the_client_count(usage: str) -> None:
    with stub_engine("--usage", usage, "--close-after-stream", "keep") as port:
        (r,) = bench(port, concurrency=[2], requests=4, max_tokens=5)
    m = r.metrics
    assert m["completed"] == 4
    assert m["completion_tokens_mean"] == 5  # five chunks of one token each
    assert m["input_throughput"] >= 0 and "prompt_tokens_mean" not in m
    assert r.info["usage_rejected"] == 4
    assert any("cannot be true" in w for w in r.warnings), r.warnings


def test_duration_ends_a_level_whose_server_stalls() -> None:
    # every second generation stops after 2 tokens and keeps its connection open
    args = ("--stall-after", "2", "--stall-every", "2", "--close-after-stream", "keep")
    with stub_engine(*args) as port:
        start = time.monotonic()
        (r,) = bench(port, timeout_s=600, concurrency=[2], duration=1.0, max_tokens=4)
        took = time.monotonic() - start
    # the requests in flight at the end got the grace (the least one: every request
    # that finished was fast), then were counted as timeouts
    assert took < 1.0 + END_GRACE_MIN_S + 10, took
    assert r.info["cut_at_duration"] >= 1
    assert r.info["errors"]["timeout"] == r.info["cut_at_duration"]
    assert any("after the level's duration" in text for text in failed_texts(r))
    assert r.metrics["completed"] >= 1
    assert any("still in flight" in w for w in r.warnings)


def test_bench_command_bounds_requests_to_a_stalled_server() -> None:
    with stub_engine("--stall-after", "1", "--close-after-stream", "keep") as port:
        url = f"http://127.0.0.1:{port}"
        start = time.monotonic()
        done = run_cli(
            "bench", "--url", url, "--model", "stub", "--concurrency", "2", "--requests", "2",
            "--max-tokens", "4", "--request-timeout", "1s", "--json", timeout=60,
        )  # fmt: skip
        assert time.monotonic() - start < 30
        assert done.returncode == 0, done.stderr
        (level,) = json.loads(done.stdout)
        assert level["info"]["errors"] == {"timeout": 2}
        assert "within the request timeout (1 s)" in level["info"]["error_examples"]["timeout"]
        # --duration ends the level although every request stalls (600 s timeout)
        start = time.monotonic()
        done = run_cli(
            "bench", "--url", url, "--model", "stub", "--concurrency", "2", "--requests", "50",
            "--max-tokens", "4", "--duration", "1s", "--json", timeout=60,
        )  # fmt: skip
        assert time.monotonic() - start < 1 + END_GRACE_MIN_S + 20
        assert done.returncode == 0, done.stderr
        (level,) = json.loads(done.stdout)
        assert level["info"]["errors"] == {"timeout": 2} and level["info"]["cut_at_duration"] == 2
        bad = run_cli("bench", "--url", url, "--request-timeout", "soon")
        assert bad.returncode == 2 and "--request-timeout" in bad.stderr


def test_bench_command_prints_each_warning_once() -> None:
    with stub_engine("--usage", "none", "--close-after-stream", "keep") as port:
        done = run_cli(
            "bench", "--url", f"http://127.0.0.1:{port}", "--model", "stub",
            "--requests", "2", "--max-tokens", "4",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (done.stdout + done.stderr).count("the server sent no usage") == 1, done.stdout


def test_a_server_that_dies_mid_level_leaves_what_was_measured(tmp_path: Path) -> None:
    with running_sim(["--load-time", "0", "--step-ms", "2", "--crash-after", "3"], tmp_path) as run:
        run.wait_ready()
        target = Target(base_url=f"http://127.0.0.1:{run.port}", model="sim-model", timeout_s=60)
        spec = workload_spec(name="w", concurrency=[1, 2], requests=8, max_tokens=8)
        results = run_workload_sync(target, spec)
        assert run.wait_exit(timeout=30) != 0
    first, second = results  # no level is lost
    assert len(first.samples) == len(second.samples) == 8
    assert 1 <= first.metrics["completed"] <= 3  # the requests before the crash are kept
    assert first.metrics["failed"] == 8 - first.metrics["completed"]
    assert sum(1 for s in first.samples if s.ok) == first.metrics["completed"]
    assert second.metrics["failed"] == 8 and second.info["errors"] == {"connection": 8}
    texts: Sequence[str] = failed_texts(first) + failed_texts(second)
    assert all(":" in text and len(text) > len("connection: ") for text in texts), texts
