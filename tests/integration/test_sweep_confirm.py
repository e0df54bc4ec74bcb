"""The confirm phase through a real sweep: two configurations of the simulated engine
that differ only in their seed (the same true performance) tie after the grid, the
confirm phase relaunches both, a run killed during it continues it on rerun, and
``best`` says what it did."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from tests.integration.sweep_helpers import (
    background_run,
    kill_tagged,
    run_cli,
    wait_for_event,
    write_sweep,
)

from servesweep.store import open_store

pytestmark = pytest.mark.integration


def test_tied_configs_are_relaunched_and_a_killed_confirm_continues(tmp_path: Path) -> None:
    sweep = write_sweep(
        tmp_path,
        name="confirm",
        grid={"seed": [1, 2]},
        args={"budget": 8, "topk": 4, "step-ms": 6},
        workloads=[
            {
                "name": "chat",
                "concurrency": [2],
                "requests": 12,
                "max_tokens": 16,
                "ignore_eos": True,
            }
        ],
        extra={"confirm": {"top": 3, "launches": 1, "budget": 2}},
    )
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep, events=events) as proc:
            wait_for_event(
                events, lambda e: e.get("event") == "confirm" and e.get("step") == "round", 120
            )
            proc.send_signal(signal.SIGKILL)  # during the confirm's round
            proc.wait(timeout=30)
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            data = store.load_sweep_data(with_samples=False)
        assert not any(s["step"] == "done" for s in data.confirm)
        assert all(t.outcome.value == "ok" for t in data.trials)  # kept through the kill

        again = run_cli("run", str(sweep), "--quiet", timeout=120)
        assert again.returncode == 0, again.stdout + again.stderr
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            data = store.load_sweep_data(with_samples=False)
        steps = [s["step"] for s in data.confirm]
        assert steps.count("round") == 1 and steps[-1] == "done", steps  # the same round
        for trial in data.trials:
            # a further launch of the same trial, in its first attempt: the intervals
            # combine both launches
            assert trial.attempts == 1 and trial.outcome.value == "ok"
            assert sorted(r.launch for r in data.results[trial.id]) == [0, 1]
            # its GPU time counts its relaunch, not the time between (other trials ran)
            assert trial.started_at is not None and trial.finished_at is not None
            held = trial.finished_at - trial.started_at
            assert held <= 1.25 * sum(trial.phase_seconds.values()) + 2.0, trial

        best = run_cli("best", str(sweep), "--json")
        assert best.returncode == 0, best.stderr
        decision = json.loads(best.stdout)
        confirm = decision["confirm"]
        assert confirm["rounds"] == 1 and confirm["relaunches"] == 2
        assert sorted(confirm["candidates"]) == sorted(t.id for t in data.trials)
        assert confirm["reason"] in ("budget", "separated")
        assert confirm["note"].startswith("confirm: 1 round, 2 relaunches of #")
        if confirm["reason"] == "budget":
            assert "still tied after the budget" in confirm["note"]
        text = run_cli("best", str(sweep)).stdout
        assert "note: confirm: 1 round, 2 relaunches" in text
        # a rerun with nothing left to do changes nothing
        third = run_cli("run", str(sweep), "--quiet", timeout=120)
        assert third.returncode == 0, third.stderr
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            assert len(store.load_sweep_data(with_samples=False).confirm) == len(data.confirm)
    finally:
        kill_tagged("confirm", tmp_path)


def test_equivalent_configs_are_not_relaunched(tmp_path: Path) -> None:
    """The same two configurations, with a threshold (20 %) far wider than their
    difference's interval: equivalent after the grid, so the confirm phase relaunches
    nothing and says so, rather than spending its budget to end "still tied"."""
    sweep = write_sweep(
        tmp_path,
        name="equivalent",
        grid={"seed": [1, 2]},
        args={"budget": 8, "topk": 4, "step-ms": 6},
        workloads=[
            {
                "name": "chat",
                "concurrency": [2],
                "requests": 12,
                "max_tokens": 16,
                "ignore_eos": True,
            }
        ],
        extra={
            "confirm": {"top": 3, "launches": 1, "budget": 4},
            "decision": {"threshold": "20%"},
        },
    )
    try:
        run = run_cli("run", str(sweep), timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "confirm: #" in run.stdout and "equivalent within ±20%" in run.stdout, run.stdout
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            data = store.load_sweep_data(with_samples=False)
        assert [s["step"] for s in data.confirm] == ["done"]
        assert data.confirm[-1]["reason"] == "equivalent"
        for trial in data.trials:
            assert [r.launch for r in data.results[trial.id]] == [0]  # never relaunched
        best = run_cli("best", str(sweep), "--json")
        assert best.returncode == 0, best.stderr
        decision = json.loads(best.stdout)
        assert decision["confirm"]["reason"] == "equivalent"
        assert decision["confirm"]["note"].startswith("confirm: nothing to confirm (#")
        assert decision["confirm"]["note"].endswith("are equivalent within ±20%)")
        assert len(decision["decision"]["equivalent"]) == 1
        assert "are equivalent within ±20% on chat" in decision["decision"]["why"]
    finally:
        kill_tagged("equivalent", tmp_path)
