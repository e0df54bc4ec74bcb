"""Fake GPU holders as real processes: zombies, the hold command, show."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from servesweep.fakegpu import FakeGpuDir

MiB = 2**20


def _hold(gpus: Path, mem: str, delay: float) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "servesweep.fakegpu", "hold", str(gpus)]
    proc = subprocess.Popen(
        [*argv, "--gpus", "0", "--mem", mem, "--release-delay", str(delay)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.startswith("holding"), line
    return proc


def test_zombie_counts_as_exited(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus"
    FakeGpuDir.create(gpus, 1, 1000 * MiB)
    proc = _hold(gpus, "400MiB", 0.3)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        # Not reaped: the holder is a zombie, like a dead server whose parent is busy.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        usage = FakeGpuDir(gpus).usage()[0]
        assert usage.holders == () and usage.used_bytes == 400 * MiB
        time.sleep(0.4)
        assert FakeGpuDir(gpus).usage()[0].used_bytes == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_hold_graceful_exit_and_oom_and_show(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus"
    FakeGpuDir.create(gpus, 1, 1000 * MiB)
    proc = _hold(gpus, "700MiB", 0.5)
    try:
        cli = [sys.executable, "-m", "servesweep.fakegpu"]
        second = subprocess.run(
            [*cli, "hold", str(gpus), "--mem", "400MiB"], capture_output=True, timeout=30
        )
        assert second.returncode == 1
        assert b"torch.OutOfMemoryError: CUDA out of memory" in second.stderr
        shown = subprocess.run([*cli, "show", str(gpus)], capture_output=True, timeout=30)
        assert f"pid {proc.pid} fakegpu-hold (alive)".encode() in shown.stdout
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        (h,) = FakeGpuDir(gpus).holdings()
        assert h.exited_at is not None and not h.alive  # graceful: exited_at written
        assert FakeGpuDir(gpus).usage()[0].used_bytes == 700 * MiB
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
