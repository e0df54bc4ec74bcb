"""A servesweep killed (SIGKILL) in the middle of an eval leaves its run folder
(the program and its hidden tests) and its cgroups behind; the next sandbox to
start removes them, and nothing of a run whose owner is alive."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from servesweep.bench.evals import Sandbox, SandboxLimits, leftovers
from servesweep.bench.evals.cgroups import find_hierarchies

CHILD = """
import asyncio
from servesweep.bench.evals import Sandbox, SandboxLimits

box = Sandbox(SandboxLimits(timeout_s=300), backend="bwrap")
program = "import time\\ntime.sleep(300)  # LEFTOVER-MARK\\ndef f(x):\\n    return 4\\n"
asyncio.run(box.run(program, "def check(candidate):\\n    assert candidate(2) == 4\\n", "f"))
"""


def _prefix(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    start = int(stat[stat.rfind(b")") + 2 :].split()[19])
    namespace = os.stat("/proc/self/ns/pid").st_ino
    return f"{leftovers.PREFIX}{namespace}-{pid}-{start}-"


def _cgroups_of(prefix: str) -> list[Path]:
    hierarchies, _ = find_hierarchies()
    return [p for h in hierarchies if h.base.is_dir() for p in h.base.glob(f"{prefix}*")]


def _running_folder(prefix: str) -> Path | None:
    """The run folder of the sleeping program, once its candidate has started."""
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            job = (folder / "candidate" / "job.json").read_text()
        except OSError:
            continue
        if "LEFTOVER-MARK" in job:
            return folder
    return None


def test_the_next_start_removes_what_a_killed_servesweep_left() -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    try:
        prefix = _prefix(child.pid)
        deadline = time.monotonic() + 120
        folder = _running_folder(prefix)
        while folder is None and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            folder = _running_folder(prefix)
        assert folder is not None, "the run never started"
    finally:
        child.kill()
        child.wait()
    assert folder.exists(), "the killed run's folder (program and tests) is left behind"
    live = Path(tempfile.mkdtemp(prefix=leftovers.owner_prefix()))  # ours: alive
    box = Sandbox(SandboxLimits(timeout_s=30), backend="bwrap")
    try:
        asyncio.run(box.start())
    finally:
        box.close()
    try:
        assert not folder.exists(), "the next start did not remove the dead run's folder"
        assert _cgroups_of(prefix) == [], "the dead run's cgroups are left"
        assert live.exists(), "a live run's folder was removed"
    finally:
        shutil.rmtree(live, ignore_errors=True)
