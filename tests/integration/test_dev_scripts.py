"""dev/test.sh's verdict, with its tools replaced by stubs that exit as told: pytest runs
in two phases (every module but the exclusive ones on two workers, then the exclusive
ones in one process), both get the arguments, the first failing phase's status is the
run's, and a run whose phases all collect no tests is a failure unless it is declared
empty; one phase collecting nothing beside one that ran tests is not."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PHASE_1 = "-m (unit or integration) and not exclusive"
PHASE_2 = "-m (unit or integration) and exclusive"


def _stub(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run_test_sh(
    tmp_path: Path,
    first: int,
    second: int | None = None,
    *,
    args: tuple[str, ...] = ("-k", "nothing_matches"),
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """dev/test.sh in a copy of the repository's layout whose set-up, ruff and mypy
    succeed and whose pytest exits with ``first`` in the first phase (or in the only
    run) and ``second`` (default ``first``) in the second."""
    second = first if second is None else second
    (tmp_path / "dev").mkdir()
    shutil.copy(ROOT / "dev" / "test.sh", tmp_path / "dev" / "test.sh")
    _stub(tmp_path / "dev" / "setup.sh", "exit 0")
    for tool in ("ruff", "mypy"):
        _stub(tmp_path / ".venv" / "bin" / tool, "exit 0")
    _stub(
        tmp_path / ".venv" / "bin" / "pytest",
        f'echo "pytest $*"\ncase "$*" in *"and exclusive"*) exit {second} ;; esac\nexit {first}',
    )
    full_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SERVESWEEP_ALLOW_NO_TESTS", "SERVESWEEP_TEST_WORKERS")
    }
    return subprocess.run(
        ["bash", str(tmp_path / "dev" / "test.sh"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**full_env, **env},
        check=False,
    )


def _runs(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith("pytest ")]


def test_two_phases_each_get_the_arguments(tmp_path: Path) -> None:
    done = _run_test_sh(tmp_path, 0)
    assert done.returncode == 0, done.stderr
    first, second = _runs(done)
    assert PHASE_1 in first and "-n 2 --dist loadgroup" in first, first
    assert PHASE_2 in second and " -n " not in second, second
    assert first.endswith("-k nothing_matches") and second.endswith("-k nothing_matches")
    assert "--durations=25" in first and "--durations=25" in second


def test_no_tests_collected_fails(tmp_path: Path) -> None:
    done = _run_test_sh(tmp_path, 5)
    assert done.returncode == 5, done.stderr
    assert len(_runs(done)) == 2
    assert "collected no tests" in done.stderr and "SERVESWEEP_ALLOW_NO_TESTS=1" in done.stderr


def test_a_declared_empty_run_passes(tmp_path: Path) -> None:
    done = _run_test_sh(tmp_path, 5, SERVESWEEP_ALLOW_NO_TESTS="1")
    assert done.returncode == 0, done.stderr
    assert "accepted" in done.stderr


@pytest.mark.parametrize(("first", "second"), [(0, 5), (5, 0)])
def test_one_phase_empty_beside_one_that_ran_passes(
    tmp_path: Path, first: int, second: int
) -> None:
    done = _run_test_sh(tmp_path, first, second)
    assert done.returncode == 0, done.stderr
    assert "collected no tests:" not in done.stderr


@pytest.mark.parametrize(
    ("first", "second", "verdict"),
    [(1, 0, 1), (0, 1, 1), (5, 1, 1), (1, 5, 1), (2, 1, 2), (0, 4, 4)],
)
def test_a_failing_phase_fails_the_run(
    tmp_path: Path, first: int, second: int, verdict: int
) -> None:
    done = _run_test_sh(tmp_path, first, second)
    assert done.returncode == verdict, done.stderr
    assert len(_runs(done)) == 2  # the second phase runs after a failed first


@pytest.mark.parametrize("code", [0, 1, 2])
def test_other_pytest_verdicts_pass_through(tmp_path: Path, code: int) -> None:
    assert _run_test_sh(tmp_path, code, SERVESWEEP_ALLOW_NO_TESTS="1").returncode == code


def test_no_workers_runs_everything_in_one_process(tmp_path: Path) -> None:
    done = _run_test_sh(tmp_path, 0, 1, SERVESWEEP_TEST_WORKERS="0")
    assert done.returncode == 0, done.stderr
    [only] = _runs(done)
    assert "-m unit or integration" in only and " -n " not in only, only


def test_more_workers_for_the_first_phase(tmp_path: Path) -> None:
    first, second = _runs(_run_test_sh(tmp_path, 0, SERVESWEEP_TEST_WORKERS="4"))
    assert "-n 4 --dist loadgroup" in first and " -n " not in second


def test_a_marker_expression_of_ones_own_is_one_run_with_it(tmp_path: Path) -> None:
    done = _run_test_sh(tmp_path, 0, 1, args=("-m", "unit", "-k", "catalog"))
    assert done.returncode == 0, done.stderr
    [only] = _runs(done)
    assert only.endswith("-m unit -k catalog") and " -n " not in only, only
