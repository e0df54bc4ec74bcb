"""The memory prediction against a real GPU (issue 27): llama.cpp's CUDA llama-server
over ``ctx-size``, ``parallel`` and batch sizes on one GPU.

A random-weight GGUF (32 layers of 1024, 8 KV heads of 128: 1.3 GiB of f32 weights,
128 KiB of f16 KV cache per token) is served with every layer on GPU 0, one
configuration after another (totals from 2.5 to 18 GiB); each serves a prompt of a
micro-batch and then ``parallel`` requests at once while NVML is read. Checked:

- weights and KV cache, predicted before any calibration, within 10 % of what
  llama-server reports (``model`` and ``KV buffer size`` on CUDA0, ``-lv 4``);
- after the first configuration has calibrated the predictor (servesweep's
  ``Calibrator``, given NVML's figure for what no buffer report shows), the predicted
  per-GPU total of every configuration within the larger of 2 % and 256 MiB of the
  most NVML saw the GPU hold above its idle level while the server served.

``LLAMA_SERVER_BIN`` names the CUDA build (``LLAMA_SERVER_CUDA_ARCH=90
dev/install-llama-server.sh``); ``bench/memory_accuracy_gpu.py`` measures more shapes.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tests.gpu.gpu_helpers import (
    GiB,
    GpuMonitor,
    MiB,
    ProcessKeeper,
    free_port,
    record_summary,
    require_gpus,
    results_dir,
)

from servesweep.servers.gpu.nvml import NvmlProbe
from servesweep.servers.memory import MemoryModel, capacity_of
from servesweep.servers.memory.calibrate import Calibrator, parse_memory_log
from servesweep.servers.memory.prediction import margin_for
from servesweep.spec.schema import SweepSpec

pytest.importorskip("gguf", reason="gguf is not installed (it writes the test's GGUF model)")

from helpers.gguf_model import TinyLlamaShape, write_tiny_gguf

SHAPE = TinyLlamaShape(
    n_embd=1024, n_layer=32, n_head=8, n_head_kv=8, n_ff=2048, context_length=1 << 20
)
POINTS: list[dict[str, Any]] = [
    {"ctx-size": 4096, "parallel": 1, "batch-size": 2048, "ubatch-size": 512},  # calibrates
    {"ctx-size": 32768, "parallel": 2, "batch-size": 1024, "ubatch-size": 256},
    {"ctx-size": 65536, "parallel": 4, "batch-size": 2048, "ubatch-size": 512},
    {"ctx-size": 65536, "parallel": 1, "batch-size": 4096, "ubatch-size": 4096},
    {"ctx-size": 131072, "parallel": 4, "batch-size": 512, "ubatch-size": 128},
    {"ctx-size": 16384, "parallel": 2, "batch-size": 2048, "ubatch-size": 512, "flash-attn": "off"},
]


def _binary() -> str:
    path = os.environ.get("LLAMA_SERVER_BIN", "")
    if not path or not Path(path).is_file():
        pytest.skip("LLAMA_SERVER_BIN does not name a llama-server binary")
    return path


def _post(port: int, prompt: str, max_tokens: int) -> None:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()


def _idle_used(probe: NvmlProbe) -> int:
    return probe.snapshot([0])[0].used_bytes


def _serve(
    keeper: ProcessKeeper, binary: str, model: Path, point: dict[str, Any], log: Path
) -> tuple[int, list[str]]:
    """Start, serve, stop one configuration: (most NVML saw above idle, its log)."""
    probe = NvmlProbe()
    try:
        idle = _idle_used(probe)
        port = free_port()
        argv = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
        argv += ["-ngl", "99", "-lv", "4"]
        for key, value in point.items():
            argv += [f"--{key}", str(value)]
        with GpuMonitor([0]) as monitor:
            t0 = time.time()
            proc = keeper.popen(argv, log)
            deadline = time.monotonic() + 120
            while "listening on http" not in log.read_text(errors="replace"):
                assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                assert time.monotonic() < deadline, "llama-server did not listen in 120 s"
                time.sleep(0.05)
            seq = int(point["ctx-size"]) // int(point["parallel"])
            _post(port, "hello " * max(16, min(int(point["ubatch-size"]), seq // 2 - 32)), 8)
            n = int(point["parallel"])
            with ThreadPoolExecutor(n) as pool:
                list(pool.map(lambda _: _post(port, "write a short list", 16), range(n)))
            time.sleep(0.3)  # the monitor's next samples
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            t1 = time.time()
        for _ in range(200):  # the next configuration starts from an idle GPU
            if _idle_used(probe) <= idle + 64 * MiB:
                break
            time.sleep(0.05)
    finally:
        probe.close()
    return max(monitor.max_used(0, t0, t1) - idle, 0), log.read_text(errors="replace").splitlines()


def test_memory_prediction_within_the_margin_of_nvml(keeper: ProcessKeeper, tmp_path: Path) -> None:
    binary = _binary()
    require_gpus(1)
    out = results_dir("memory_prediction", tmp_path)
    model = write_tiny_gguf(tmp_path / "kv-heavy.gguf", shape=SHAPE)
    spec = SweepSpec.model_validate(
        {
            "name": "gpu-memory",
            "server": {
                "engine": "llama-server",
                "model": str(model),
                "gpus": [0],
                "gpu_backend": "nvml",
                "args": {"n-gpu-layers": 99, "log-verbosity": 4},
            },
            "workloads": [{"name": "chat"}],
        }
    )
    capacity = capacity_of(spec.server)
    assert capacity.bytes and capacity.source == "NVML", capacity
    uncalibrated = MemoryModel.of_sweep(spec, capacity)
    memory = MemoryModel.of_sweep(spec, capacity)
    calibrator = Calibrator("llama-server")
    rows: list[dict[str, Any]] = []
    for i, point in enumerate(POINTS):
        nvml, lines = _serve(keeper, binary, model, point, out / f"server-{i}.log")
        reported = parse_memory_log("llama-server", lines)
        assert reported is not None and reported.device == "CUDA0", lines[-40:]
        reported = replace(reported, device_used=nvml)
        first = uncalibrated.predict(point)
        if i == 0:
            memory.learn(calibrator.add(first, reported, uncalibrated.calibration))
        rows.append(
            {
                "point": point,
                "nvml": nvml,
                "reported": reported.to_json(),
                "uncalibrated": first.to_json(),
                "calibrated": memory.predict(point).to_json(),
            }
        )
    (out / "rows.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    failures = []
    for row in rows:
        rep, first, cal, nvml = row["reported"], row["uncalibrated"], row["calibrated"], row["nvml"]
        for part in ("weights", "kv_cache"):
            if abs(first[part] / rep[part] - 1) > 0.10:
                failures.append(f"{row['point']}: {part} {first[part]} against {rep[part]}")
        off = cal["per_gpu_bytes"] - nvml
        row["total_error"] = off / nvml
        if abs(off) > margin_for(nvml):
            failures.append(
                f"{row['point']}: total {cal['per_gpu_bytes'] / MiB:.0f} MiB against NVML's "
                f"{nvml / MiB:.0f} MiB ({off / MiB:+.0f} MiB, margin {margin_for(nvml) / MiB:.0f})"
            )
    record_summary(
        "memory_prediction",
        {
            "overhead_mib": memory.calibration.overhead / MiB,
            "rows": [
                {
                    "point": r["point"],
                    "nvml_gib": round(r["nvml"] / GiB, 3),
                    "total_error": round(r["total_error"], 5),
                }
                for r in rows
            ],
        },
    )
    assert not failures, failures
