"""Command templates end to end: a placeholder that cannot be filled stops `plan` and
`run` before anything is created; the documented launch-time placeholders fill."""

from __future__ import annotations

import sys
from pathlib import Path

from sweep_helpers import report_json, run_cli, write_sweep

SIM = f"exec {sys.executable} -m servesweep.sim"


def _generic(tmp_path: Path, name: str, command: str) -> Path:
    return write_sweep(
        tmp_path,
        name=name,
        grid={"budget": [2, 4]},
        args={"mem-per-gpu": None, "release-delay": None},
        workloads=[{"name": "chat", "concurrency": [1], "requests": 4, "max_tokens": 8}],
        server_extra={
            "engine": "generic",
            "command": command,
            "gpus": [],
            "gpu_backend": "none",
            "fake_gpu_dir": None,
            "fake_gpus": None,
        },
    )


def test_an_unknown_param_placeholder_stops_plan_and_run_before_anything_starts(
    tmp_path: Path,
) -> None:
    sweep = _generic(tmp_path, "tplbad", f"{SIM} --port {{port}} --b {{param.bugdet}} {{args}}")
    for command in ("plan", "run"):
        done = run_cli(command, str(sweep))
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        [line] = done.stderr.strip().splitlines()
        assert line.startswith(f"error: {sweep}:") or f"{sweep}:" in line, line
        assert "server.command" in line and "{param.bugdet}" in line, line
        assert "no param 'bugdet' is set" in line, line
    assert not (tmp_path / "servesweep.db").exists(), "run created the results database"


def test_trial_and_log_placeholders_fill_when_each_trial_starts(tmp_path: Path) -> None:
    # The engine's own output goes next to the trial's log ({log}.engine); the served
    # model is named after the trial ({trial}).
    command = (
        f"{SIM} --host {{host}} --port {{port}} --model m-{{trial}} {{args}} > {{log}}.engine 2>&1"
    )
    sweep = _generic(tmp_path, "tplok", command)
    done = run_cli("run", str(sweep), "--quiet", timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    trials = report_json(sweep)["trials"]
    assert [t["outcome"] for t in trials] == ["ok", "ok"]
    engine_logs = sorted(tmp_path.glob("runs/**/*.engine"))
    assert len(engine_logs) == 2, engine_logs
    for trial in trials:
        key = f"tplok-{trial['id']}"
        assert f"--model m-{key}" in trial["launch_command"], trial["launch_command"]
        assert any(f"m-{key}" in log.read_text() for log in engine_logs), key
