"""The CLI's contract: exit codes, one-line errors without tracebacks, plan output."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesweep import __version__
from servesweep.cli.main import main

MALFORMED = Path(__file__).parent / "malformed"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    out, err = capsys.readouterr()
    code = exit_info.value.code
    assert isinstance(code, int)
    return code, out, err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--version")
    assert code == 0
    assert __version__ in out


@pytest.mark.parametrize("command", ["run", "plan"])
@pytest.mark.parametrize("path", sorted(MALFORMED.glob("*.yaml"))[:12], ids=lambda p: p.stem)
def test_malformed_sweep_file_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], command: str, path: Path
) -> None:
    code, out, err = _run(capsys, command, str(path))
    assert code == 2
    assert "Traceback" not in err + out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("servesweep: ")
    assert path.name in lines[0]


def test_missing_sweep_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, "run", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert "nope.yaml" in err
    assert len(err.strip().splitlines()) == 1


def test_unknown_option_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "run", "--no-such-flag", "x.yaml")
    assert code == 2
    assert "no-such-flag" in err


def test_plan_prints_trials_and_restarts(capsys: pytest.CaptureFixture[str]) -> None:
    quickstart = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
    code, out, _ = _run(capsys, "plan", str(quickstart))
    assert code == 0
    assert "7 trials" in out
    assert "budget=16 topk=4" in out
    assert "server starts: 7" in out


def test_status_without_database(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, "status", str(tmp_path / "none.db"))
    assert code == 2
    assert "no such sweep file or results database" in err


def test_wait_gpus_bad_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(
        capsys, "wait-gpus", "--gpus", "3-1", "--backend", "fake", "--fake-gpus", "/x"
    )
    assert code == 2
    assert "not a GPU list" in err


def test_apply_needs_exactly_one_choice(capsys: pytest.CaptureFixture[str]) -> None:
    quickstart = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
    code, _, err = _run(capsys, "apply", str(quickstart))
    assert code == 2
    assert "exactly one of --trial" in err
