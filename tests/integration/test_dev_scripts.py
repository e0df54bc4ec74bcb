"""dev/test.sh's verdict, with its tools replaced by stubs that exit as told: a pytest run
that collects no tests is a failure unless the run is declared empty."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _stub(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run_test_sh(tmp_path: Path, pytest_exit: int, **env: str) -> subprocess.CompletedProcess[str]:
    """dev/test.sh in a copy of the repository's layout whose set-up, ruff and mypy
    succeed and whose pytest exits with ``pytest_exit``."""
    (tmp_path / "dev").mkdir()
    shutil.copy(ROOT / "dev" / "test.sh", tmp_path / "dev" / "test.sh")
    _stub(tmp_path / "dev" / "setup.sh", "exit 0")
    for tool in ("ruff", "mypy"):
        _stub(tmp_path / ".venv" / "bin" / tool, "exit 0")
    _stub(tmp_path / ".venv" / "bin" / "pytest", f'echo "pytest $*"; exit {pytest_exit}')
    full_env = {k: v for k, v in os.environ.items() if k != "SERVESWEEP_ALLOW_NO_TESTS"}
    return subprocess.run(
        ["bash", str(tmp_path / "dev" / "test.sh"), "-k", "nothing_matches"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**full_env, **env},
        check=False,
    )


def test_no_tests_collected_fails(tmp_path: Path) -> None:
    done = _run_test_sh(tmp_path, 5)
    assert done.returncode == 5, done.stderr
    assert "-k nothing_matches" in done.stdout  # the arguments reached pytest
    assert "collected no tests" in done.stderr and "SERVESWEEP_ALLOW_NO_TESTS=1" in done.stderr


def test_a_declared_empty_run_passes(tmp_path: Path) -> None:
    done = _run_test_sh(tmp_path, 5, SERVESWEEP_ALLOW_NO_TESTS="1")
    assert done.returncode == 0, done.stderr
    assert "accepted" in done.stderr


@pytest.mark.parametrize("code", [0, 1, 2])
def test_other_pytest_verdicts_pass_through(tmp_path: Path, code: int) -> None:
    assert _run_test_sh(tmp_path, code, SERVESWEEP_ALLOW_NO_TESTS="1").returncode == code
