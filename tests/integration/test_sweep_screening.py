"""Screening through a real sweep of the simulated engine: three configurations, the
first fast and the two others six and eight times slower per token. Each is measured
first on a short level (6 requests of the full level's 24); the slow ones are screened
out (never measured in full), the fast one is measured in full in the same launch; a
run stopped with Ctrl-C after the first decision goes on with the rest; ``best`` names
the fully measured winner and says what screening saved."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml
from tests.integration.sweep_helpers import (
    background_run,
    kill_tagged,
    run_cli,
    wait_for_event,
    write_sweep,
)

from servesweep.models import Outcome
from servesweep.store import open_store

pytestmark = pytest.mark.integration


def test_a_clearly_worse_configuration_is_screened_out_and_the_saving_reported(
    tmp_path: Path,
) -> None:
    sweep = write_sweep(
        tmp_path,
        name="screen",
        grid={"step-ms": [2, 12, 16]},
        workloads=[
            {
                "name": "chat",
                "concurrency": [2],
                "requests": 24,
                "max_tokens": 16,
                "ignore_eos": True,
            }
        ],
        extra={"screening": {"requests": 6}},
    )
    plan = run_cli("plan", str(sweep))
    assert "first screening: chat.c2 with 6 requests (of 24)" in plan.stdout, plan.stdout
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep, events=events) as proc:
            wait_for_event(
                events, lambda e: e.get("event") == "screening" and not e.get("kept"), 120
            )
            # the decision is stored as it is made; the trial's outcome right after it
            wait_for_event(
                events,
                lambda e: e.get("event") == "trial_finished" and e.get("outcome") == "pruned",
                60,
            )
            proc.send_signal(signal.SIGINT)  # Ctrl-C after the first configuration screened out
            proc.wait(timeout=60)
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            data = store.load_sweep_data(with_samples=False)
        by_step = {t.params["step-ms"]: t for t in data.trials}
        assert by_step[2].outcome is Outcome.OK
        assert by_step[12].outcome is Outcome.PRUNED
        assert by_step[16].outcome is not Outcome.OK  # not decided before the stop

        again = run_cli("run", str(sweep), "--quiet", timeout=120)
        assert again.returncode == 0, again.stdout + again.stderr
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            data = store.load_sweep_data(with_samples=False)
        by_step = {t.params["step-ms"]: t for t in data.trials}
        fast = by_step[2]
        # the winner: screened (6 requests, stored apart) and then measured in full (24)
        assert [r.metrics["completed"] for r in data.screening[fast.id]] == [6]
        assert [r.metrics["completed"] for r in data.results[fast.id]] == [24]
        assert all(r.screening for r in data.screening[fast.id])
        assert not any(r.screening for r in data.results[fast.id])
        for slow in (by_step[12], by_step[16]):
            assert slow.outcome is Outcome.PRUNED and slow.evidence is not None
            assert slow.evidence.reason == "screened", slow.evidence
            assert "cannot reach" in slow.evidence.message
            assert data.results[slow.id] == ()  # never measured in full
            assert [r.metrics["completed"] for r in data.screening[slow.id]] == [6]

        best = run_cli("best", str(sweep), "--json")
        assert best.returncode == 0, best.stderr
        decision = json.loads(best.stdout)
        assert decision["best"]["trial"] == fast.id
        screening = decision["screening"]
        assert screening["screened_out"] == [by_step[12].id, by_step[16].id]
        assert screening["measured_in_full"] == [fast.id]
        assert screening["screening_requests"] == 18
        assert screening["full_measurement_requests"] == 24
        assert screening["requests_saved"] == 2 * 24 - 18
        # two slow configurations not measured in full saved more than all screening cost
        assert screening["gpu_seconds_saved"] > 0, screening
        kinds = {e["trial"]: e["kind"] for e in decision["excluded"]}
        assert kinds == {by_step[12].id: "screened", by_step[16].id: "screened"}
        text = run_cli("best", str(sweep)).stdout
        assert "note: screening: 3 configurations on short levels, 2 screened out" in text
        assert "not spent: 30 requests" in text
    finally:
        kill_tagged("screen", tmp_path)


def test_screened_out_configurations_are_measured_in_full_once_screening_is_off(
    tmp_path: Path,
) -> None:
    workloads = [
        {"name": "chat", "concurrency": [2], "requests": 24, "max_tokens": 16, "ignore_eos": True}
    ]
    sweep = write_sweep(
        tmp_path,
        name="unscreen",
        grid={"step-ms": [2, 16]},
        workloads=workloads,
        extra={"screening": {"requests": 6}},
    )
    try:
        first = run_cli("run", str(sweep), "--quiet", timeout=180)
        assert first.returncode == 0, first.stdout + first.stderr
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            outcomes = {t.params["step-ms"]: t.outcome for t in store.trials(1)}
        assert outcomes == {2: Outcome.OK, 16: Outcome.PRUNED}
        # the same sweep file without screening, run again (resume)
        spec = yaml.safe_load(sweep.read_text())
        del spec["screening"]
        sweep.write_text(yaml.safe_dump(spec, sort_keys=False))
        again = run_cli("run", str(sweep), "--quiet", timeout=180)
        assert again.returncode == 0, again.stdout + again.stderr
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            data = store.load_sweep_data(with_samples=False)
        by_step = {t.params["step-ms"]: t for t in data.trials}
        assert by_step[16].outcome is Outcome.OK
        assert [r.metrics["completed"] for r in data.results[by_step[16].id]] == [24]
        # the configuration measured in full before is not measured again
        assert [r.metrics["completed"] for r in data.results[by_step[2].id]] == [24]
    finally:
        kill_tagged("unscreen", tmp_path)
