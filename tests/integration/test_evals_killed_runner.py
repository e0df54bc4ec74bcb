"""No sandboxed process outlives a servesweep killed with SIGKILL: a real process
runs an eval workload against the simulated engine, whose answer is a program
deaf to SIGTERM, SIGHUP and SIGINT that leaves a deaf daemon (double fork, new
session); servesweep is SIGKILLed while both run, and every process of the run
must be gone, by PID, within a bounded wait.

Each backend that can start here: bwrap; unshare, chosen by ``auto`` on a PATH
without bwrap (the machine of a new GPU box); and ``none`` (``sandbox:
host-filesystem``), which promises less: the processes it started die with
servesweep, a daemon they left may not (docs/evals.md)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servesweep.sim.testing import SimRun, running_sim

HOSTILE = Path(__file__).parent / "hostile"
FAST = ["--load-time", "0", "--ttft-ms", "1", "--step-ms", "0.05", "--batch-slowdown", "0"]
GONE_WITHIN_S = 10.0
CHILD = """
import asyncio, sys
from servesweep.bench.evals import run_eval_workload
from servesweep.bench.target import Target
from servesweep.spec.schema import EvalSpec, workload_spec

port, suite, sandbox = sys.argv[1:4]
spec = EvalSpec(suite=suite, timeout=300, sandbox=sandbox)
target = Target(base_url=f"http://127.0.0.1:{port}", model="sim-model", timeout_s=60)
asyncio.run(run_eval_workload(target, workload_spec(name="deaf", eval=spec)))
"""


def _stat(pid: int) -> tuple[int, int, str] | None:
    """``(parent pid, start time, name)`` of a live process, else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[0] == b"Z":
        return None
    name = stat[stat.index(b"(") + 1 : stat.rfind(b")")].decode(errors="replace")
    return int(fields[1]), int(fields[19]), name


def _table() -> dict[int, tuple[int, int, str]]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (info := _stat(int(entry))) is not None:
            found[int(entry)] = info
    return found


def _with_marker(marker: str) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.add(int(entry))
    return found


def _run_processes(root: int, marker: str) -> dict[int, tuple[int, str]]:
    """The run's processes now: ``root``'s descendants and the daemon (found by its
    marker, wherever it was reparented), as ``pid -> (start time, name)``."""
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    todo, found = [root], set()
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    found |= _with_marker(marker)
    return {pid: (table[pid][1], table[pid][2]) for pid in found if pid in table and pid != root}


def _alive(processes: dict[int, tuple[int, str]]) -> dict[int, tuple[int, str]]:
    return {
        pid: (start, name)
        for pid, (start, name) in processes.items()
        if (info := _stat(pid)) is not None and info[1] == start
    }


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimRun, Path, str]]:
    folder = tmp_path_factory.mktemp("killed-runner")
    marker = "servesweep-deaf-" + secrets.token_hex(6)
    program = (HOSTILE / "deaf_daemon.py").read_text().replace("__MARKER__", marker)
    task = {
        "task_id": "deaf/0",
        "prompt": 'def attack():\n    """Return the word."""\n',
        "entry_point": "attack",
        "test": "def check(candidate):\n    assert candidate() == 'word'\n",
        "reference": program,
    }
    suite = folder / "deaf.jsonl"
    suite.write_text(json.dumps(task) + "\n")
    with running_sim([*FAST, "--oracle", str(suite)], folder) as run:
        run.wait_ready()
        yield run, suite, marker


@pytest.mark.parametrize(
    ("backend", "tool"), [("bwrap", "bwrap"), ("unshare", "unshare"), ("none", None)]
)
def test_sigkill_of_servesweep_takes_the_run_with_it(
    backend: str, tool: str | None, sim: tuple[SimRun, Path, str], tmp_path: Path
) -> None:
    run, suite, marker = sim
    env = dict(os.environ)
    sandbox = {"bwrap": "bwrap", "unshare": "auto", "none": "host-filesystem"}[backend]
    if backend == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    if backend != "bwrap" and os.geteuid() != 0:
        pytest.skip(f"the {backend} backend runs generated code as a fresh uid only as root")
    if backend == "unshare":
        # A machine without bubblewrap: `auto` must take unshare.
        if shutil.which("unshare") is None:
            pytest.skip("util-linux unshare is not installed")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "unshare").symlink_to(str(shutil.which("unshare")))
        env["PATH"] = str(bin_dir)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(run.port), str(suite), sandbox],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    processes: dict[int, tuple[int, str]] = {}
    try:
        deadline = time.monotonic() + 60
        while not _with_marker(marker) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _with_marker(marker):
            child.kill()
            _, err = child.communicate()
            pytest.fail(f"the daemon never started: {err.decode(errors='replace')[-2000:]}")
        processes = _run_processes(child.pid, marker)
        daemons = _with_marker(marker) & set(processes)
        names = {name for _, name in processes.values()}
        if tool is not None:
            assert tool in names, f"not run by {tool}: {sorted(names)}"
        child.send_signal(signal.SIGKILL)
        child.wait()
        end = time.monotonic() + GONE_WITHIN_S
        while _alive(processes) and time.monotonic() < end:
            time.sleep(0.05)
        left = _alive(processes)
        if backend == "none":
            # It promises only that the processes it started die with servesweep (the
            # daemon may live on; any sandbox start here that finds the dead run's
            # cgroups kills it, so whether it is still there is not checked).
            assert daemons and set(left) <= daemons, (left, daemons)
        else:
            assert left == {}, f"{len(left)} processes of the run outlived servesweep: {left}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        assert child.stderr is not None
        child.stderr.close()
        for pid in _alive(processes):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
