"""Two sweep files in one folder share ``servesweep.db``: each sweep numbers its own
trials from 1 wherever a person reads or types them, and ``status`` without an
argument lists the sweeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.integration.sweep_helpers import kill_tagged, run_cli, write_sweep

pytestmark = pytest.mark.integration


def test_each_sweep_of_a_shared_database_numbers_its_trials_from_one(tmp_path: Path) -> None:
    first = write_sweep(tmp_path, name="numa", grid={"budget": [2]})
    first = first.rename(tmp_path / "a.yaml")
    second = write_sweep(tmp_path, name="numb", grid={"budget": [4, 8]})
    try:
        done = run_cli("run", str(first), "--quiet", timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        events = tmp_path / "events.jsonl"
        # --trial 2: the second trial of this sweep (the database's third)
        done = run_cli("run", str(second), "--trial", "2", "--events", str(events), timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "[1/1] trial 2: budget=8" in done.stdout
        started = [
            e for e in map(json.loads, events.read_text().splitlines())
            if e["event"] == "trial_started"
        ]  # fmt: skip
        assert [(e["number"], e["trial"], e["params"]) for e in started] == [(2, 3, {"budget": 8})]
        table = run_cli("report", str(second)).stdout
        rows = [ln for ln in table.splitlines() if ln.startswith("│ #")]
        assert rows[0].split()[1] == "#1" and "pending" in rows[0]
        assert rows[1].split()[1] == "#2" and " ok " in rows[1]
        status = run_cli("status", cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert lines[:3] == [
            "2 sweeps in servesweep.db:",
            "  #1  numa: 1/1 trials done",
            "  #2  numb: 1/2 trials done",
        ]
        assert "showing the latest, numb" in lines[3]
        mine = json.loads(run_cli("status", str(second), "--json").stdout)
        assert [(t["trial"], t["id"]) for t in mine["trials"]] == [(1, 2), (2, 3)]
        assert mine["sweeps"] == []
    finally:
        kill_tagged("numa", tmp_path)
        kill_tagged("numb", tmp_path)
