"""A sweep file edited between runs: ``plan``, ``run``, ``status`` and the reports
agree on the counts and on the number of each trial, and mark the removed ones."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from tests.integration.sweep_helpers import SERVESWEEP, kill_tagged, run_cli, write_sweep

pytestmark = pytest.mark.integration


def _on_a_terminal(args: list[str], cwd: Path) -> str:
    """``servesweep ARGS`` with stdout and stderr on a pseudo-terminal; what it wrote."""
    main, other = pty.openpty()
    proc = subprocess.Popen(
        [*SERVESWEEP, *args], stdout=other, stderr=other, cwd=cwd,
        env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    os.close(other)
    chunks = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert proc.wait(timeout=30) == 0
    return b"".join(chunks).decode(errors="replace")


def test_counts_and_numbers_agree_after_an_edit(tmp_path: Path) -> None:
    sweep_file = write_sweep(tmp_path, name="edit", grid={"budget": [2, 4]})
    try:
        first = run_cli("run", str(sweep_file), "--quiet", timeout=120)
        assert first.returncode == 0, first.stdout + first.stderr
        spec = yaml.safe_load(sweep_file.read_text())
        spec["params"]["grid"]["budget"] = [4, 8]
        sweep_file.write_text(yaml.safe_dump(spec, sort_keys=False))

        planned = run_cli("plan", str(sweep_file))
        assert planned.returncode == 0, planned.stderr
        assert "2 trials x 1 workload = 4 measurements; 1 already done, 1 to run" in planned.stdout
        rows = [ln.split() for ln in planned.stdout.splitlines() if "budget=" in ln]
        assert [(r[0], r[1]) for r in rows] == [("2", "ok"), ("3", "new")]

        events = tmp_path / "events.jsonl"
        second = run_cli("run", str(sweep_file), "--quiet", "--events", str(events))
        assert second.returncode == 0, second.stdout + second.stderr
        started = [
            e for e in map(json.loads, events.read_text().splitlines())
            if e["event"] == "sweep_started" or e["event"] == "trial_started"
        ]  # fmt: skip
        assert (started[0]["trials"], started[0]["done"], started[0]["todo"]) == (2, 1, 1)
        assert [e["trial"] for e in started[1:]] == [3], "the number plan gave it"
        title = second.stdout.splitlines()[0]
        assert title.startswith(
            "sweep edit (#1): 2 trials, 2 ok; 1 more no longer in the sweep file "
            "(marked not in plan)"
        )
        assert any("#1" in ln and "ok, not in plan" in ln for ln in second.stdout.splitlines())
        status = run_cli("status", str(sweep_file))
        assert "2 ok; 1 more no longer in the sweep file" in status.stdout.splitlines()[0]
        # a trial that is not in the sweep: a usage error, not a table and exit 0
        missing = run_cli("run", str(sweep_file), "--trial", "999")
        assert missing.returncode == 2, missing.stdout + missing.stderr
        assert "no trial 999 in sweep 'edit' (its trials: 2, 3;" in missing.stderr
        assert missing.stdout == ""
        # the HTML report on a terminal: a file, and a line that says where
        html = _on_a_terminal(["report", str(sweep_file), "--format", "html"], tmp_path)
        written = tmp_path / "edit-report.html"
        assert f"wrote {written}" in html
        assert "<html" not in html
        assert written.read_text().lstrip().lower().startswith("<!doctype html")
    finally:
        kill_tagged("edit", tmp_path)
