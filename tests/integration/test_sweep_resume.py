"""A sweep survives its own death: SIGKILL at any phase, rerun, and every trial is
measured exactly once, with no server left behind; SIGINT stops cleanly."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from tests.integration.sweep_helpers import (
    assert_measured_once,
    background_run,
    kill_tagged,
    report_json,
    run_cli,
    tagged_processes,
    wait_for_event,
    write_sweep,
)

from servesweep.models import Outcome
from servesweep.store import open_store


@pytest.mark.parametrize("phase", ["load", "bench"])
def test_sigkill_then_rerun_completes_each_trial_once(tmp_path: Path, phase: str) -> None:
    sweep_file = write_sweep(tmp_path, name=f"kill-{phase}")
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep_file, events=events) as proc:
            wait_for_event(
                events,
                lambda e: e["event"] == "phase" and e.get("trial") == 2 and e["phase"] == phase,
            )
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        # the instance of trial 2 outlived servesweep: the store knows it
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            running = [t for t in store.trials(1) if t.outcome is Outcome.RUNNING]
            assert [t.id for t in running] == [2]
            assert store.live_instances(1), "the killed run's instance is recorded as live"

        if phase == "bench":
            # a rerun of another trial first: the left-behind instance (trial 2's
            # config) is stopped, with the stop kept as evidence
            only3 = run_cli("run", str(sweep_file), "--quiet", "--trial", "3", timeout=180)
            assert only3.returncode == 0, only3.stdout + only3.stderr
            with open_store(tmp_path / "servesweep.db", readonly=True) as store:
                (leftover,) = store.events(1, "stopped_leftover")
                assert leftover["instance_of"] == 2 and leftover["signalled"], leftover
        done = run_cli("run", str(sweep_file), "--quiet", timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        data = assert_measured_once(sweep_file, 3)
        rows = {row["id"]: row for row in data["trials"]}  # type: ignore[union-attr]
        assert rows[1]["attempts"] == 1 and rows[3]["attempts"] == 1
        assert rows[2]["attempts"] == 2, "the interrupted trial ran again"
        # killed while loading: the rerun adopts the instance that already runs
        # trial 2's config instead of restarting it
        assert rows[2]["adopted"] is (phase == "load")
        assert tagged_processes(f"kill-{phase}", tmp_path) == [], "no server left running"
    finally:
        kill_tagged(f"kill-{phase}", tmp_path)


def test_sigint_stops_cleanly_and_marks_interrupted(tmp_path: Path) -> None:
    sweep_file = write_sweep(tmp_path, name="sigint", args={"load-time": 1.5})
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep_file, events=events) as proc:
            wait_for_event(
                events,
                lambda e: e["event"] == "phase" and e.get("trial") == 1 and e["phase"] == "load",
            )
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=30)
            assert proc.returncode == 130, err
            assert "interrupted" in err
            assert (
                "servesweep: interrupted; the running instances were stopped; run the same "
                "command again to continue" in err
            )
            assert "Traceback" not in err
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            trial = store.trial(1)
            assert trial.outcome is Outcome.INTERRUPTED
            assert store.live_instances(1) == []
        assert tagged_processes("sigint", tmp_path) == []
        # the next run picks the interrupted trial up again
        done = run_cli("run", str(sweep_file), "--quiet", timeout=180)
        assert done.returncode == 0, done.stderr
        assert_measured_once(sweep_file, 3)
    finally:
        kill_tagged("sigint", tmp_path)


def test_second_writer_is_refused(tmp_path: Path) -> None:
    sweep_file = write_sweep(tmp_path, name="lock", args={"load-time": 2})
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep_file, events=events) as proc:
            wait_for_event(events, lambda e: e["event"] == "trial_started")
            second = run_cli("run", str(sweep_file), "--quiet", timeout=30)
            assert second.returncode == 1
            assert "is in use by servesweep pid" in second.stderr
            assert str(proc.pid) in second.stderr
            assert "Traceback" not in second.stderr
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=30)
    finally:
        kill_tagged("lock", tmp_path)


def test_apply_then_run_adopts_the_running_instance(tmp_path: Path) -> None:
    sweep_file = write_sweep(tmp_path, name="adopt", grid={"budget": [4, 8]})
    try:
        applied = run_cli("apply", str(sweep_file), "--set", "budget=4", timeout=60)
        assert applied.returncode == 0, applied.stderr
        assert "running budget=4" in applied.stdout
        (server,) = [
            p
            for p in tagged_processes("adopt", tmp_path)
            if "servesweep.sim" in " ".join(p.cmdline())
        ]
        done = run_cli(
            "run", str(sweep_file), "--quiet", "--events", str(tmp_path / "ev.jsonl"), timeout=120
        )
        assert done.returncode == 0, done.stderr
        data = report_json(sweep_file)
        first = data["trials"][0]
        assert first["params"] == {"budget": 4}
        assert first["adopted"] is True
        assert "start" not in first["phase_seconds"], "an adopted instance is not restarted"
        assert data["trials"][1]["adopted"] is False
        assert not server.is_running(), "the adopted instance was stopped before trial 2"
    finally:
        kill_tagged("adopt", tmp_path)
