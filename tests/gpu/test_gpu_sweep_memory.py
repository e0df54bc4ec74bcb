"""The memory gate's calibration inside ``servesweep run`` on a real GPU (issue 27):
llama.cpp's CUDA llama-server swept over ``ctx-size``, ``parallel`` and batch sizes on
one GPU, ``log-verbosity: 4`` so that it prints its buffer sizes.

Each launched trial's ``memory`` record (the JSON report) carries the engine's buffer
report and ``device_used``: what the slot's NVML samples saw the server hold above the
GPU's idle level, from its start on. Checked: every trial has a device figure at
least its buffer report; every trial after the first was predicted calibrated, and
its predicted per-GPU total is within the larger of 2 % and 256 MiB of its own
``device_used`` (the first trial's NVML figure less its report is the overhead the
later predictions add, instead of the assumed 512 MiB).

``LLAMA_SERVER_BIN`` names the CUDA build (``LLAMA_SERVER_CUDA_ARCH=90
dev/install-llama-server.sh``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.gpu.gpu_helpers import (
    GiB,
    MiB,
    ProcessKeeper,
    free_port,
    record_summary,
    report_json,
    require_gpus,
    results_dir,
    run_sweep,
)

pytest.importorskip("gguf", reason="gguf is not installed (it writes the test's GGUF model)")

from helpers.gguf_model import TinyLlamaShape, write_tiny_gguf

SHAPE = TinyLlamaShape(
    n_embd=1024, n_layer=32, n_head=8, n_head_kv=8, n_ff=2048, context_length=1 << 20
)
POINTS: list[dict[str, Any]] = [
    {"ctx-size": 4096, "parallel": 1, "batch-size": 2048, "ubatch-size": 512},
    {"ctx-size": 32768, "parallel": 2, "batch-size": 1024, "ubatch-size": 256},
    {"ctx-size": 65536, "parallel": 4, "batch-size": 2048, "ubatch-size": 512},
    {"ctx-size": 65536, "parallel": 1, "batch-size": 4096, "ubatch-size": 4096},
    {"ctx-size": 131072, "parallel": 4, "batch-size": 512, "ubatch-size": 128},
]


def _binary() -> str:
    path = os.environ.get("LLAMA_SERVER_BIN", "")
    if not path or not Path(path).is_file():
        pytest.skip("LLAMA_SERVER_BIN does not name a llama-server binary")
    return path


def _sweep(out: Path, binary: str, model: Path) -> Path:
    spec: dict[str, Any] = {
        "name": "gpu-sweep-memory",
        "store": str(out / "servesweep.db"),
        "server": {
            "engine": "llama-server",
            "executable": [binary],
            "model": str(model),
            "port": free_port(),
            "gpus": [0],
            "gpu_backend": "nvml",
            "args": {"-ngl": 99, "flash-attn": "on", "log-verbosity": 4, "alias": "mem"},
            "timeouts": {"stop": "30s", "kill": "10s", "release": "120s", "ready": "300s"},
            "log_dir": str(out / "runs"),
        },
        "params": {"points": POINTS},
        "workloads": [
            {
                "name": "chat",
                "dataset": "builtin:chat",
                "concurrency": [1, 4],
                "requests": 8,
                "max_tokens": 32,
            }
        ],
    }
    path = out / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def test_a_sweep_calibrates_its_predictions_with_nvml(
    keeper: ProcessKeeper, tmp_path: Path
) -> None:
    binary = _binary()
    require_gpus(1)
    out = results_dir("sweep_memory", tmp_path)
    model = write_tiny_gguf(tmp_path / "mem.gguf", shape=SHAPE)
    sweep = _sweep(out, binary, model)
    run = run_sweep(sweep, keeper, "gpu-sweep-memory")
    report = report_json(sweep, keeper)
    rows = []
    for trial in report["trials"]:
        memory = trial.get("memory") or {}
        predicted, measured = memory.get("predicted") or {}, memory.get("measured") or {}
        used = measured.get("device_used", 0)
        total = predicted.get("per_gpu_bytes", 0)
        rows.append(
            {
                "params": trial["params"],
                "outcome": trial["outcome"],
                "calibrated": predicted.get("calibrated"),
                "predicted_gib": round(total / GiB, 3),
                "reported_gib": round(measured.get("per_gpu_bytes", 0) / GiB, 3),
                "device_used_gib": round(used / GiB, 3),
                "error": round(total / used - 1, 4) if used else None,
            }
        )
    record_summary("sweep_memory", {"seconds": run.seconds, "rows": rows})
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{json.dumps(rows, indent=1)}"
    assert [r["outcome"] for r in rows] == ["ok"] * len(POINTS), rows
    for trial in report["trials"]:
        measured = trial["memory"]["measured"]
        assert measured["device_used"] >= measured["per_gpu_bytes"] > 0, trial["memory"]
    for trial in report["trials"][1:]:
        predicted, measured = trial["memory"]["predicted"], trial["memory"]["measured"]
        assert predicted["calibrated"] >= 1, trial["memory"]
        used = measured["device_used"]
        allowed = max(0.02 * used, 256 * MiB)
        assert abs(predicted["per_gpu_bytes"] - used) <= allowed, (trial["params"], rows)
