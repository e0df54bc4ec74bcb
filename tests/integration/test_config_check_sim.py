"""Does the server run what was asked, through a real sweep: the simulated engine cuts
a ``--max-model-len`` longer than its model's 4096 tokens without a word and says so in
``/v1/models``, as vLLM does; the trial is marked ``config_mismatch`` and the run, the
status, ``best`` and the report say it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.integration.sweep_helpers import kill_tagged, run_cli, write_sweep

from servesweep.store import open_store

pytestmark = pytest.mark.integration

SAID = "max-model-len asked 8192, the engine runs 4096 (/v1/models max_model_len)"


def test_a_silently_cut_context_length_is_a_config_mismatch(tmp_path: Path) -> None:
    sweep = write_sweep(
        tmp_path,
        name="asked",
        grid={"max-model-len": [2048, 8192]},
        workloads=[{"name": "chat", "concurrency": [1], "requests": 4, "max_tokens": 8}],
    )
    try:
        done = run_cli("run", str(sweep), timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"the server does not run what was asked: {SAID}" in done.stdout + done.stderr
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            data = store.load_sweep_data(with_samples=False)
        by_len = {t.params["max-model-len"]: t for t in data.trials}
        (stored,) = data.mismatches
        assert stored["trial"] == by_len[8192].id
        assert (stored["param"], stored["asked"], stored["engine"]) == ("max-model-len", 8192, 4096)
        status = run_cli("status", str(sweep))
        assert status.returncode == 0, status.stderr
        (line,) = [row for row in status.stdout.splitlines() if "max-model-len=8192" in row]
        assert f"config_mismatch: {SAID}" in line
        decision = json.loads(run_cli("best", str(sweep), "--json").stdout)
        marked = {c["params"]["max-model-len"]: c["config_mismatch"] for c in decision["ranking"]}
        assert marked[2048] == []
        assert marked[8192] == [
            {
                "param": "max-model-len",
                "asked": 8192,
                "engine": 4096,
                "source": "/v1/models max_model_len",
            }
        ]
        assert any(f"does not run what was asked: {SAID}" in n for n in decision["notes"])
        page = run_cli("report", str(sweep), "--format", "html").stdout
        assert f"config_mismatch: {SAID}" in page
    finally:
        kill_tagged("asked", tmp_path)
