"""bench/client_capacity.py still runs end to end (tiny settings: this checks the
script, not the figures in docs/benchmarks.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "client_capacity.py"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin")
def test_capacity_script_prints_its_table() -> None:
    cores = sorted(os.sched_getaffinity(0))
    out = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--client-cores", str(cores[0]),
            "--server-cores", str(cores[1]), "--seconds", "0.5", "--rounds", "1",
            "--ttft-requests", "10", "--skip-httpx", "--workers", "1",
            "--concurrency", "8", "--rate", "50", "--open-seconds", "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| servesweep, 1 worker process(es), c=8 |" in out.stdout
    assert "| servesweep, c=1 |" in out.stdout
    assert "servesweep open loop, Poisson 50 req/s" in out.stdout
