"""A sweep whose server program does not exist: each trial fails ``start_crash``
(``executable_not_found``) with its evidence, the sweep goes on, and nothing claims
to stop servers that never ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.integration.sweep_helpers import run_cli, write_sweep

pytestmark = pytest.mark.integration


def test_a_missing_program_is_a_failed_start_not_an_interruption(tmp_path: Path) -> None:
    sweep_file = write_sweep(
        tmp_path,
        name="noprog",
        grid={"budget": [2, 4]},
        server_extra={"executable": ["/opt/nope/bin/python", "-m", "servesweep.sim"]},
    )
    done = run_cli("run", str(sweep_file), "--quiet", timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "stopping the running instances" not in done.stderr
    assert "interrupted" not in done.stdout + done.stderr
    status = json.loads(run_cli("status", str(sweep_file), "--json").stdout)
    assert [t["outcome"] for t in status["trials"]] == ["failed", "failed"]
    for trial in status["trials"]:
        assert trial["failure_class"] == "start_crash"
        assert "(executable_not_found)" in trial["message"]
        assert "'/opt/nope/bin/python' does not exist" in trial["message"]
