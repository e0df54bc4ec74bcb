"""The memory prediction of a draft model against llama-server's own report, on real
models: Qwen2.5-Coder-1.5B-Instruct with Qwen2.5-Coder-0.5B-Instruct as its draft
(the CPU build). llama-server loads the draft with a context of its own (as many
cells as the target's); its model and KV buffer lines after the second model's
``loaded meta data`` are the draft's (servers/memory/calibrate.py). On this CPU both
models' Q4_K block weights are also held repacked (``CPU_REPACK``). The prediction
before any trial ran is within the tolerance of the existing memory test
(tests/integration/test_memory_llama_server.py) for the target's weights and KV cache
and for the draft, with and without a ``spec-type``, at two context sizes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.integration.sweep_helpers import report_json, run_cli

from helpers.llama_server import cached_llama_server, llama_server_sweep
from servesweep.sim.testing import free_port

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 0.10


def _model(name: str) -> Path:
    done = subprocess.run(
        [str(REPO / "dev" / "fetch-models.sh"), "--path", name],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    path = Path(done.stdout.strip())
    if done.returncode != 0 or not path.is_file():
        pytest.skip(f"{name} is not fetched here (run dev/fetch-models.sh {name})")
    return path


@pytest.mark.timeout(900)
def test_draft_weights_and_kv_cache_within_10_percent_of_llama_server(tmp_path: Path) -> None:
    target, draft = _model("qwen2.5-coder-1.5b"), _model("qwen2.5-coder-0.5b")
    points: list[dict[str, Any]] = [
        # the draft loaded, drafting nothing (spec-type none: said, so not refused)
        {"ctx-size": 1024, "spec-draft-model": str(draft), "spec-type": "none"},
        {
            "ctx-size": 4096,
            "spec-draft-model": str(draft),
            "spec-type": "draft-simple",
            "spec-draft-n-max": 8,
        },
    ]
    sweep = llama_server_sweep(
        tmp_path / "sweep.yaml",
        name="memory-draft",
        binary=cached_llama_server(),
        model=target,
        port=free_port(),
        points=points,
        workloads=[{"name": "chat", "concurrency": [1], "requests": 1, "max_tokens": 4}],
        # llama-server prints its buffer sizes at -lv 4
        server_extra={
            "args": {
                "threads": 2,
                "n-gpu-layers": 0,
                "parallel": 1,
                "alias": "qwen",
                "log-verbosity": 4,
            },
            "timeouts": {"stop": "10s", "ready": "180s", "request": "120s"},
        },
    )
    planned = run_cli("plan", str(sweep), "--json")
    assert planned.returncode == 0, planned.stderr
    before = [t["predicted_memory"] for t in json.loads(planned.stdout)["trials"]]
    done = run_cli("run", str(sweep), "--quiet", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = report_json(sweep)["trials"]
    assert [r["outcome"] for r in rows] == ["ok", "ok"], [r["failure"] for r in rows]
    for row, plan in zip(rows, before, strict=True):
        measured = row["memory"]["measured"]
        assert plan["verdict"] == "fits" and measured["device"] == "CPU", row["memory"]
        for part in ("weights", "kv_cache", "draft"):
            error = abs(plan[part] - measured[part]) / measured[part]
            assert error <= TOLERANCE, (row["params"], part, plan[part], measured[part])
    # the draft's context grows with ctx-size as the target's does
    small, large = (r["memory"]["measured"] for r in rows)
    assert large["draft"] > small["draft"] and large["kv_cache"] == 4 * small["kv_cache"]
