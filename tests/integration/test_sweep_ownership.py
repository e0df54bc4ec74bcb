"""Two sweeps never touch each other's servers, even with the same name.

Two copies of one sweep file in two directories (two results databases) run at the
same time. Sharing a lease directory, the later run is refused at once
(test_sweep_leases.py); here they do not (as from two containers with their own
/tmp), so the later run gets as far as the earlier run's server on its port or GPUs:
it is refused before anything starts (the port) or reports ``gpu_busy``, naming
that run's results database, and never signals it; the earlier run finishes every
trial as if alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.integration.sweep_helpers import (
    background_run,
    kill_tagged,
    report_json,
    run_cli,
    wait_for_event,
    write_sweep,
)

from servesweep.sim.testing import free_port

# a long benchmark keeps the earlier run's server up while the later run tries
_LONG_CHAT = [
    {"name": "chat", "concurrency": [1], "requests": 800, "max_tokens": 16, "ignore_eos": True}
]


def _elsewhere(tmp_path: Path) -> dict[str, str]:
    """The environment of a run that does not share the earlier run's leases."""
    return {**os.environ, "SERVESWEEP_LEASE_DIR": str(tmp_path / "other-leases")}


def _earlier_run_untouched(first: Path, out: str) -> None:
    data = report_json(first)
    rows: list[dict[str, Any]] = data["trials"]
    assert [r["outcome"] for r in rows] == ["ok"], out
    for row in rows:
        assert "signal" not in json.dumps(row.get("failure") or ""), row


def test_same_name_same_port_the_later_run_is_refused_naming_the_earlier(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    port = free_port()
    first = write_sweep(
        a, name="twin", grid={"budget": [2]}, workloads=_LONG_CHAT, server_extra={"port": port}
    )
    second = write_sweep(b, name="twin", grid={"budget": [8]}, server_extra={"port": port})
    events = a / "events.jsonl"
    try:
        with background_run(first, events=events) as proc:
            wait_for_event(
                events, lambda e: e["event"] == "phase" and e["phase"] == "bench", timeout=120
            )
            later = run_cli("run", str(second), "--quiet", timeout=180, env=_elsewhere(tmp_path))
            assert later.returncode == 2, later.stdout + later.stderr
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, out + err
        _earlier_run_untouched(first, out + err)
        (trial,) = report_json(second)["trials"]
        assert trial["outcome"] == "pending", trial  # refused before anything started
        (message,) = later.stderr.strip().splitlines()
        # the owner is named: the other run's results database, and that it runs
        assert f"port {port} is in use by pid" in message, message
        assert str(a / "servesweep.db") in message, message
        assert "another sweep" in message and "alive" in message, message
    finally:
        kill_tagged("twin", tmp_path)


def test_same_name_same_gpus_the_later_run_gets_gpu_busy(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    first = write_sweep(a, name="twin", grid={"budget": [2]}, workloads=_LONG_CHAT)
    shared_gpus = str(a / "gpus")
    second = write_sweep(
        b,
        name="twin",
        grid={"budget": [8]},
        server_extra={
            "fake_gpu_dir": shared_gpus,
            "timeouts": {"stop": "5s", "release": "3s", "ready": "30s"},
        },
    )
    events = a / "events.jsonl"
    try:
        with background_run(first, events=events) as proc:
            wait_for_event(
                events, lambda e: e["event"] == "phase" and e["phase"] == "bench", timeout=120
            )
            later = run_cli("run", str(second), "--quiet", timeout=180, env=_elsewhere(tmp_path))
            assert later.returncode == 1, later.stdout + later.stderr
            assert "gpu_busy" in later.stderr, later.stderr
            assert str(a / "servesweep.db") in later.stderr, later.stderr
            # refused before any slot opened: nothing of its own to stop, so no word of it
            assert "stopping the running" not in later.stderr, later.stderr
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, out + err
        _earlier_run_untouched(first, out + err)
    finally:
        kill_tagged("twin", tmp_path)
