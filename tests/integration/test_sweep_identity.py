"""Resume never mixes configurations: results measured under other settings are not
taken for the new ones, and a running server is adopted only when it runs exactly
the launch a pending trial needs."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from tests.integration.sweep_helpers import (
    kill_tagged,
    report_json,
    run_cli,
    tagged_processes,
    write_sweep,
)


def _edit(sweep_file: Path, change: dict[str, object]) -> None:
    spec = yaml.safe_load(sweep_file.read_text())
    for dotted, value in change.items():
        *path, last = dotted.split("/")
        node = spec
        for key in path:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value
    sweep_file.write_text(yaml.safe_dump(spec, sort_keys=False))


def test_editing_what_a_trial_measures_is_refused_with_the_choices(tmp_path: Path) -> None:
    sweep_file = write_sweep(tmp_path, name="edit", grid={"budget": [2, 4]})
    try:
        first = run_cli("run", str(sweep_file), "--quiet", timeout=180)
        assert first.returncode == 0, first.stderr
        before = report_json(sweep_file)

        _edit(sweep_file, {"server/args/step-ms": 3})
        again = run_cli("run", str(sweep_file), "--quiet", timeout=60)
        assert again.returncode == 2, again.stdout + again.stderr
        line = again.stderr.strip()
        assert "\n" not in line and "Traceback" not in line
        assert "server.args (step-ms: 2 -> 3)" in line
        for choice in ("--fresh", "new name", "--keep-results"):
            assert choice in line

        _edit(sweep_file, {"server/args/step-ms": 2, "workloads/0/max_tokens": 32})
        again = run_cli("run", str(sweep_file), "--quiet", timeout=60)
        assert again.returncode == 2
        assert "workload 'chat' (max_tokens)" in again.stderr

        kept = run_cli("run", str(sweep_file), "--quiet", "--keep-results", timeout=60)
        assert kept.returncode == 0, kept.stderr
        after = report_json(sweep_file)
        assert [t["results"] for t in after["trials"]] == [t["results"] for t in before["trials"]]

        fresh = run_cli("run", str(sweep_file), "--quiet", "--fresh", timeout=180)
        assert fresh.returncode == 0, fresh.stderr
        measured = report_json(sweep_file)
        assert measured["sweep"]["id"] != before["sweep"]["id"]
        assert all(t["outcome"] == "ok" for t in measured["trials"])
    finally:
        kill_tagged("edit", tmp_path)


def test_applied_server_shows_in_status_and_is_adopted_by_its_trial(tmp_path: Path) -> None:
    sweep_file = write_sweep(tmp_path, name="appl", grid={"budget": [2, 4]})
    try:
        applied = run_cli("apply", str(sweep_file), "--set", "budget=4", timeout=60)
        assert applied.returncode == 0, applied.stderr
        status = run_cli("status", str(sweep_file), "--json", timeout=30)
        assert status.returncode == 0, status.stderr
        (instance,) = json.loads(status.stdout)["instances"]
        assert instance["params"] == {"budget": 4} and instance["running"] is True
        plain = run_cli("status", str(sweep_file), timeout=30)
        assert "instances recorded as running" in plain.stdout
        *_, shown, hint = plain.stdout.splitlines()
        assert "running" in shown and hint.startswith("  stop them: servesweep stop ")

        done = run_cli("run", str(sweep_file), "--quiet", timeout=120)
        assert done.returncode == 0, done.stderr
        by_budget = {t["params"]["budget"]: t for t in report_json(sweep_file)["trials"]}
        # budget=4 is the plan's second trial: it ran first, on the applied server
        assert by_budget[4]["adopted"] is True
        assert "start" not in by_budget[4]["phase_seconds"]
        assert by_budget[2]["adopted"] is False
        assert by_budget[4]["started_at"] < by_budget[2]["started_at"]
    finally:
        kill_tagged("appl", tmp_path)


def test_applied_server_of_another_launch_is_stopped_and_said_so(tmp_path: Path) -> None:
    sweep_file = write_sweep(tmp_path, name="appl2", grid={"budget": [2, 4]})
    try:
        applied = run_cli("apply", str(sweep_file), "--set", "budget=99", timeout=60)
        assert applied.returncode == 0, applied.stderr
        (server,) = [
            p
            for p in tagged_processes("appl2", tmp_path)
            if "servesweep.sim" in " ".join(p.cmdline())
        ]
        done = run_cli("run", str(sweep_file), timeout=120)
        assert done.returncode == 0, done.stderr
        assert "stopping the instance of trial 3 (budget=99)" in done.stdout + done.stderr
        assert not server.is_running()
        trials = report_json(sweep_file)["trials"]
        assert all(t["outcome"] == "ok" and not t["adopted"] for t in trials if t["in_plan"])
    finally:
        kill_tagged("appl2", tmp_path)


def test_nothing_to_run_leaves_an_applied_server_alone(tmp_path: Path) -> None:
    sweep_file = write_sweep(tmp_path, name="appl3", grid={"budget": [2]})
    try:
        assert run_cli("run", str(sweep_file), "--quiet", timeout=120).returncode == 0
        applied = run_cli("apply", str(sweep_file), "--best", timeout=60)
        assert applied.returncode == 0, applied.stderr
        (server,) = [
            p
            for p in tagged_processes("appl3", tmp_path)
            if "servesweep.sim" in " ".join(p.cmdline())
        ]
        again = run_cli("run", str(sweep_file), "--quiet", timeout=60)
        assert again.returncode == 0, again.stderr
        assert server.is_running(), "a run with nothing to do touches no server"
    finally:
        kill_tagged("appl3", tmp_path)
