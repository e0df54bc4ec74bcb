"""Secrets reach the server by name (`server.env_passthrough`) and nowhere else: the
server sees the value, while the sweep file, the results database, the server logs,
the events, every report format and the systemd drop-in never contain it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml
from launcher_services import SANDBOX_HOME, Sandbox
from tests.integration.sweep_helpers import run_cli

from servesweep.sim.testing import free_port

SECRET_NAME = "SERVESWEEP_TEST_SECRET"
SECRET = "hf_s3cr3t-" + os.urandom(8).hex()


def _sweep(folder: Path, seen: Path, server: dict[str, Any] | None = None) -> Path:
    # the server writes what it received where only the test looks, then serves
    command = (
        f'printf %s "${SECRET_NAME}" > {seen} && exec {sys.executable} -m servesweep.sim '
        "--host {host} --port {port} {args}"
    )
    spec = {
        "name": "secrets",
        "store": str(folder / "servesweep.db"),
        "server": {
            "engine": "generic",
            "command": command,
            "port": free_port(),
            "gpu_backend": "none",
            "env_passthrough": [SECRET_NAME, "SERVESWEEP_TEST_UNSET"],
            "args": {"load-time": 0.1, "ttft-ms": 5, "step-ms": 1},
            "timeouts": {"stop": "5s", "ready": "60s"},
            "log_dir": str(folder / "runs"),
            **(server or {}),
        },
        "params": {"grid": {"budget": [2, 4]}},
        "workloads": [{"name": "chat", "concurrency": [1], "requests": 4, "max_tokens": 8}],
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _run(sweep: Path, *extra: str) -> None:
    env_before = os.environ.get(SECRET_NAME)
    os.environ[SECRET_NAME] = SECRET
    try:
        done = run_cli(
            "run",
            str(sweep),
            "--quiet",
            "--events",
            str(sweep.parent / "ev.jsonl"),
            *extra,
            timeout=300,
        )
    finally:
        if env_before is None:
            os.environ.pop(SECRET_NAME, None)
        else:
            os.environ[SECRET_NAME] = env_before
    assert done.returncode == 0, done.stdout + done.stderr
    assert SECRET not in done.stdout + done.stderr


def _assert_nowhere(folder: Path, seen: Path) -> None:
    for fmt in ("json", "csv", "markdown", "html", "table"):
        out = folder / f"report.{fmt}"
        done = run_cli("report", str(folder / "sweep.yaml"), "--format", fmt, "--out", str(out))
        assert done.returncode == 0, done.stderr
    files = [p for p in folder.rglob("*") if p.is_file() and p != seen]
    assert any(p.name == "servesweep.db" for p in files)
    assert any(p.name == "ev.jsonl" for p in files)
    assert any(p.suffix == ".log" for p in files), "the server logs were written"
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path


def test_secret_reaches_the_server_only_subprocess(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    sweep = _sweep(tmp_path, seen)
    assert SECRET not in sweep.read_text()
    _run(sweep)
    assert seen.read_text() == SECRET, "the server got the value"
    _assert_nowhere(tmp_path, seen)


SYSTEMCTL_KEEPING_ENV = """#!/bin/bash
# systemctl inside the sandbox, keeping the caller's environment like a plain
# systemctl does (the sandbox's own sdctl starts it with a fresh environment)
. {lib}
pid=$(sb_target_pid) || exit 1
exec nsenter --target "$pid" --mount --uts --ipc --pid --cgroup --root --wd systemctl "$@"
"""

UNIT = """\
[Unit]
Description=servesweep secret test

[Service]
Type=simple
KillMode=control-group
TimeoutStopSec=10
Restart=no
ExecStart=/bin/false
"""


def test_secret_reaches_the_server_only_systemd(systemd_sandbox: Sandbox, tmp_path: Path) -> None:
    unit = "servesweep-secret.service"
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(SYSTEMCTL_KEEPING_ENV.format(lib=SANDBOX_HOME / "lib.sh"))
    systemctl.chmod(0o755)
    seen = systemd_sandbox.scratch / f"seen-{os.getpid()}"
    systemd_sandbox.write_unit(unit, UNIT)
    sweep = _sweep(
        tmp_path,
        seen,
        {
            "launcher": "systemd",
            "systemd": {
                "unit": unit,
                "systemctl": [str(systemctl)],
                "journalctl": [systemd_sandbox.journalctl],
                "unit_dir": str(systemd_sandbox.unit_dir),
            },
        },
    )
    try:
        _run(sweep, "--keep-running")
        assert seen.read_text() == SECRET, "the unit's process got the value"
        dropin = systemd_sandbox.unit_dir / f"{unit}.d" / "servesweep.conf"
        assert dropin.exists() and SECRET not in dropin.read_text()
        assert SECRET_NAME in dropin.read_text(), "the command names the variable"
        manager_env = systemd_sandbox.sdctl("show-environment").stdout
        assert SECRET_NAME not in manager_env, "unset again once the unit started"
        _assert_nowhere(tmp_path, seen)
    finally:
        systemd_sandbox.remove_unit(unit)
        seen.unlink(missing_ok=True)


def test_env_passthrough_names_only_in_the_sweep_file(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, tmp_path / "seen", {"env_passthrough": [f"{SECRET_NAME}=x"]})
    done = run_cli("plan", str(sweep))
    assert done.returncode == 2
    assert "variable names only" in done.stderr and len(done.stderr.strip().splitlines()) == 1
