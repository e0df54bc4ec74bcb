"""``servesweep stop``: what ``apply`` left running, or what a killed run left, is
stopped and shown by ``status``; another results database's server is never touched."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from tests.integration.sweep_helpers import (
    background_run,
    kill_tagged,
    run_cli,
    tagged_processes,
    wait_for_event,
    write_sweep,
)

from servesweep.store import open_store

pytestmark = pytest.mark.integration


def _servers(prefix: str, within: Path) -> list[int]:
    return [
        p.pid for p in tagged_processes(prefix, within) if "servesweep.sim" in " ".join(p.cmdline())
    ]


def test_stop_ends_what_apply_left_and_not_another_databases(tmp_path: Path) -> None:
    mine_dir, other_dir = tmp_path / "mine", tmp_path / "other"
    mine_dir.mkdir()
    other_dir.mkdir()
    mine = write_sweep(mine_dir, name="stopme", grid={"budget": [4, 8]})
    # the same sweep name in another folder: another results database
    other = write_sweep(other_dir, name="stopme", grid={"budget": [4, 8]})
    try:
        for sweep_file in (mine, other):
            applied = run_cli("apply", str(sweep_file), "--set", "budget=4", timeout=60)
            assert applied.returncode == 0, applied.stderr
        (server,) = _servers("stopme", mine_dir)
        (foreign,) = _servers("stopme", other_dir)

        shown = run_cli("status", str(mine))
        assert shown.returncode == 0, shown.stderr
        assert f"pid {server} on" in shown.stdout and "— running" in shown.stdout
        assert f"servesweep stop {mine}" in shown.stdout

        stopped = run_cli("stop", str(mine), timeout=60)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert f"stopped pid {server}" in stopped.stdout
        assert _servers("stopme", mine_dir) == []
        assert _servers("stopme", other_dir) == [foreign], "another database's server runs on"
        with open_store(mine_dir / "servesweep.db", readonly=True) as store:
            assert store.live_instances() == []
            (fact,) = store.events(1, "stopped_leftover")
            assert fact["reason"] == "stopped by servesweep stop"

        after = run_cli("status", str(mine))
        assert "instances recorded as running" not in after.stdout
        again = run_cli("stop", str(mine), timeout=60)
        assert again.returncode == 0
        assert "nothing to stop" in again.stdout
    finally:
        kill_tagged("stopme", tmp_path)


def test_stop_ends_what_a_killed_run_left_and_waits_for_a_live_run(tmp_path: Path) -> None:
    # a long load: the run is still loading when it is refused, then killed
    sweep_file = write_sweep(
        tmp_path, name="stopdead", grid={"budget": [2]}, args={"load-time": 8.0}
    )
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep_file, events=events) as proc:
            wait_for_event(events, lambda e: e["event"] == "phase" and e["phase"] == "load")
            refused = run_cli("stop", str(sweep_file), timeout=30)
            assert refused.returncode == 1, refused.stdout + refused.stderr
            assert "is in use by servesweep pid" in refused.stderr
            assert _servers("stopdead", tmp_path), "a live run's server is left to it"
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        (server,) = _servers("stopdead", tmp_path)
        shown = run_cli("status", str(sweep_file)).stdout
        assert "the run that ran it has ended: run the same command again" in shown
        assert f"pid {server} on" in shown and "— running" in shown
        stopped = run_cli("stop", str(sweep_file), timeout=60)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert f"stopped pid {server}" in stopped.stdout
        assert tagged_processes("stopdead", tmp_path) == []
    finally:
        kill_tagged("stopdead", tmp_path)
