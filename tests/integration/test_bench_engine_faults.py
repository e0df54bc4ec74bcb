"""The load generator against servers that misbehave the way real engines do: one
that cuts streams short, one whose usage cannot be true.

Every server is a process on 127.0.0.1 (``tests/helpers/stub_engine.py`` or the
simulated engine), killed by PID; every level is bounded by a request count and
every command by a timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from servesweep.bench.load import run_workload_sync
from servesweep.bench.target import Target
from servesweep.models import LevelResult
from servesweep.spec.schema import WorkloadSpec

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
    return run_workload_sync(target, WorkloadSpec(name="w", **spec))


def test_a_stream_cut_short_is_a_failed_request() -> None:
    # the body ends cleanly after 3 of 8 tokens: no finish_reason, no [DONE]
    with stub_engine("--truncate-after", "3", "--close-after-stream", "keep") as port:
        (r,) = bench(port, concurrency=[2], requests=4, max_tokens=8)
    assert r.metrics["completed"] == 0 and r.metrics["failed"] == 4
    assert r.info["errors"] == {"incomplete": 4}
    assert "cut short" in r.info["error_examples"]["incomplete"]
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
