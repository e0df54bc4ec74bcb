"""The decisions and the reports of stored sweeps stay what they were: three results
databases of real sweeps of the simulated engine (``tests/helpers/replay_stores.py``
made them: a winner, a tie and the confirm phase's round, configurations screened out, a
predicted OOM skipped, an OOM at load) are read again, and ``best --json`` and
``report --format json`` must say exactly what they said when the stores were made."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.helpers.replay_stores import DATA, SWEEPS

from servesweep.cli.main import main

pytestmark = pytest.mark.unit

_COMMANDS = {"best": ("best", "--json"), "report": ("report", "--format", "json")}


def _without_version(doc: Any) -> Any:
    """The report names the servesweep that rendered it: not a decision."""
    if isinstance(doc, dict):
        doc.pop("version", None)
    return doc


@pytest.mark.parametrize("kind", sorted(_COMMANDS))
@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_a_stored_sweep_replays_to_the_same_output(
    name: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / f"{name}.db"
    shutil.copyfile(DATA / f"{name}.db", db)  # the kept file is never opened
    command, *options = _COMMANDS[kind]
    with pytest.raises(SystemExit) as done:
        main([command, str(db), *options])
    assert done.value.code in (0, None)
    golden = json.loads((DATA / f"{name}.{kind}.json").read_text())
    assert _without_version(json.loads(capsys.readouterr().out)) == _without_version(golden)
