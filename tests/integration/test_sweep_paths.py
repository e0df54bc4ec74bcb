"""Paths in a sweep file are relative to the sweep file in every command, run from
another directory: doctor finds the fake GPUs, run writes its database and logs and
reads its dataset beside the sweep file. Every server is killed by PID (its tag)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.sweep_helpers import kill_tagged, run_cli, write_sweep

REPO = Path(__file__).resolve().parents[2]


def test_doctor_of_the_quickstart_from_the_repository_root(tmp_path: Path) -> None:
    # a copy, so that the fake GPUs it creates land in the test's own directory
    (tmp_path / "examples").mkdir()
    quickstart = tmp_path / "examples" / "quickstart.yaml"
    quickstart.write_text((REPO / "examples" / "quickstart.yaml").read_text())
    done = run_cli("doctor", "examples/quickstart.yaml", "--json", cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["gpus"]["environment"]["fake_dir"] == str(
        (tmp_path / "examples" / ".quickstart" / "gpus").resolve()
    )
    assert len(report["gpus"]["devices"]) == 2
    assert not (tmp_path / ".quickstart").exists()


def test_run_reads_and_writes_beside_the_sweep_file(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "prompts.jsonl").write_text('{"prompt": "hello from the project"}\n')
    sweep = write_sweep(
        project,
        name="paths",
        grid={"budget": [2]},
        server_extra={"log_dir": "logs"},
        workloads=[
            {"name": "chat", "dataset": "prompts.jsonl", "requests": 2, "max_tokens": 4},
        ],
    )
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    try:
        done = run_cli("run", "../project/sweep.yaml", "--quiet", cwd=cwd, timeout=120)
        assert done.returncode == 0, done.stderr + done.stdout
        report = run_cli("report", str(sweep), "--format", "json", cwd=cwd)
    finally:
        kill_tagged("paths", tmp_path)
    assert report.returncode == 0, report.stderr
    assert (project / "servesweep.db").exists() and (project / "gpus" / "gpus.json").exists()
    assert list((project / "logs").rglob("server.log"))
    assert list(cwd.iterdir()) == []  # nothing written where the command ran
    (trial,) = json.loads(report.stdout)["trials"]
    assert trial["outcome"] == "ok"
