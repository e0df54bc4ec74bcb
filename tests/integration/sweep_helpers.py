"""Helpers for the end-to-end sweep tests: write a sweep file for the simulated
engine, run ``servesweep`` as a real process, find and kill what it left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil
import yaml

from servesweep.sim.testing import free_port

SERVESWEEP = [sys.executable, "-m", "servesweep.cli.main"]


def write_sweep(
    directory: Path,
    *,
    name: str = "itest",
    grid: Mapping[str, list[Any]] | None = None,
    args: Mapping[str, Any] | None = None,
    workloads: list[dict[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
    server_extra: Mapping[str, Any] | None = None,
) -> Path:
    """A sweep file of the simulated engine on two fake GPUs (60 of 80 GiB each, so
    two instances never fit), fast loads and releases, its own free port; levels the
    load generator could not time count for best (``include_unreliable``)."""
    spec: dict[str, Any] = {
        "name": name,
        "store": "servesweep.db",
        "server": {
            "engine": "sim",
            "port": free_port(),
            "gpus": [0, 1],
            "gpu_backend": "fake",
            "fake_gpu_dir": "gpus",
            "fake_gpus": {"count": 2, "memory": "80GiB"},
            "args": {
                "mem-per-gpu": "60GiB",
                "load-time": 0.6,
                "release-delay": 0.5,
                "ttft-ms": 10,
                "step-ms": 2,
                **(args or {}),
            },
            "timeouts": {"stop": "5s", "release": "20s", "ready": "30s"},
            **(server_extra or {}),
        },
        "params": {"grid": dict(grid or {"budget": [2, 4, 8]})},
        "workloads": workloads
        or [
            {
                "name": "chat",
                "concurrency": [1, 4],
                "requests": 8,
                "max_tokens": 16,
                "ignore_eos": True,
            }
        ],
        # The simulator streams a token every 2 ms; on a loaded 2-core machine the load
        # generator's event loop lags past that and the level is stored unreliable
        # (bench.health), which would leave out of best what these tests check the
        # mechanics of. The tests of that rule set it back (``extra``).
        "include_unreliable": True,
        **(extra or {}),
    }
    path = directory / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_cli(
    *args: str,
    timeout: float = 120,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``servesweep ARGS`` in this environment (or ``env``), without colours."""
    return subprocess.run(
        [*SERVESWEEP, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**(os.environ if env is None else env), "NO_COLOR": "1"},
        check=False,
    )


DEFAULT_LEVELS = (("chat", "c1", 0), ("chat", "c4", 0))
"""The levels of ``write_sweep``'s default workload."""


def report_json(sweep_file: Path) -> dict[str, Any]:
    done = run_cli("report", str(sweep_file), "--format", "json")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def assert_measured_once(
    sweep_file: Path, trials: int, levels: tuple[tuple[str, str, int], ...] = DEFAULT_LEVELS
) -> dict[str, Any]:
    """Every trial ok, with exactly one result per workload level and repeat (a killed
    attempt's partial results are not mixed in); returns the JSON report."""
    data = report_json(sweep_file)
    rows = data["trials"]
    assert isinstance(rows, list)
    assert len(rows) == trials
    for row in rows:
        assert row["outcome"] == "ok", row
        got = sorted((r["workload"], r["level"], r["repeat"]) for r in row["results"])
        assert got == sorted(levels), row
    return data


def tagged_processes(prefix: str, within: Path) -> list[psutil.Process]:
    """Live processes that servesweep started for a sweep of this test: instance tag
    ``prefix-*`` and fake GPUs under the test's own directory ``within`` (so a test
    never touches another run's servers)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.Error, OSError):
            continue
        tag = env.get("SERVESWEEP_INSTANCE", "")
        gpus = env.get("SERVESWEEP_FAKE_GPUS", "")
        if tag.startswith(prefix + "-") and gpus.startswith(str(within)):
            found.append(proc)
    return found


def kill_tagged(prefix: str, within: Path) -> None:
    for proc in tagged_processes(prefix, within):
        with suppress(psutil.Error):
            proc.kill()


@contextmanager
def background_run(
    sweep_file: Path, *extra: str, events: Path | None = None
) -> Iterator[subprocess.Popen[str]]:
    """``servesweep run`` in the background; killed by PID (with its instances) at exit."""
    args = [*SERVESWEEP, "run", str(sweep_file), "--quiet", *extra]
    if events is not None:
        args += ["--events", str(events)]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def wait_for_event(events: Path, predicate: Any, timeout: float = 60) -> dict[str, Any]:
    """Poll a ``--events`` file until a line satisfies ``predicate``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if events.exists():
            for line in events.read_text().splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if predicate(event):
                    return dict(event)
        time.sleep(0.05)
    raise AssertionError(f"no matching event in {events} within {timeout}s")


def sigint(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
