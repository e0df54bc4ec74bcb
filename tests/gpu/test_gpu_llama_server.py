"""llama.cpp's own ``llama-server``, built with CUDA, swept by servesweep on one GPU,
and the same restarts done by a naive stop/sleep/start loop in the same run.

The model is a random-weight llama GGUF written at test time (32 layers, 8 KV heads
of 128: 128 KiB of f16 KV cache per token of context); each configuration's KV cache
(``--ctx-size``, every layer on the GPU) takes more than half of the GPU, so two
instances can never fit at once and every restart depends on the release gate.
Every trial must be ``ok``; release and load times are recorded for the docs.

``LLAMA_SERVER_BIN`` names the binary (``dev/install-llama-server.sh`` with
``LLAMA_SERVER_CUDA_ARCH=90``). ``GPU_LLAMA_REHEARSAL=1`` runs the same test on the
CPU with a small context and no NVML (to rehearse it before a device call).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.gpu.gpu_helpers import (
    GiB,
    GpuMonitor,
    ProcessKeeper,
    free_port,
    per_gpu_release,
    record_summary,
    report_json,
    require_gpus,
    results_dir,
    run_sweep,
    total_gib,
    trial_digest,
)

pytest.importorskip("gguf", reason="gguf is not installed (it writes the test's GGUF model)")

from helpers.gguf_model import TinyLlamaShape, write_tiny_gguf

REHEARSAL = os.environ.get("GPU_LLAMA_REHEARSAL") == "1"
KV_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2
"""layers x (K, V) x KV heads x head size x f16."""
SHAPE = TinyLlamaShape(
    n_embd=1024, n_layer=32, n_head=8, n_head_kv=8, n_ff=2048, context_length=1 << 20
)
REHEARSAL_SHAPE = TinyLlamaShape(n_embd=256, n_layer=4, n_head=4, n_head_kv=2, n_ff=512)
_OOM = re.compile(r"out of memory|failed to allocate|cudaMalloc failed", re.IGNORECASE)


def _binary() -> str:
    path = os.environ.get("LLAMA_SERVER_BIN", "")
    if not path or not Path(path).is_file():
        pytest.skip("LLAMA_SERVER_BIN does not name a llama-server binary")
    return path


def _points(total: float | None) -> list[dict[str, Any]]:
    """Four configurations; on a GPU each one's KV cache is more than half of it."""
    if total is None:  # rehearsal on the CPU
        return [
            {"ctx-size": 2048, "parallel": 2, "batch-size": 512},
            {"ctx-size": 4096, "parallel": 4, "batch-size": 256},
            {"ctx-size": 2048, "parallel": 1, "batch-size": 128},
            {"ctx-size": 4096, "parallel": 2, "batch-size": 512, "ubatch-size": 256},
        ]
    fractions = (0.52, 0.58, 0.64, 0.70)
    points = []
    for i, f in enumerate(fractions):
        ctx = int(total * f * GiB / KV_BYTES_PER_TOKEN) // 4096 * 4096
        points.append(
            {"ctx-size": ctx, "parallel": (4, 8, 4, 2)[i], "batch-size": (2048, 1024, 512, 2048)[i]}
        )
    return points


def _sweep(out: Path, binary: str, model: Path, points: list[dict[str, Any]]) -> Path:
    spec: dict[str, Any] = {
        "name": "gpu-llama-server",
        "store": str(out / "servesweep.db"),
        "server": {
            "engine": "llama-server",
            "executable": [binary],
            "model": str(model),
            "port": free_port(),
            "gpus": [] if REHEARSAL else [0],
            "gpu_backend": "none" if REHEARSAL else "nvml",
            "args": {
                "-ngl": 0 if REHEARSAL else 99,
                "flash-attn": "off" if REHEARSAL else "on",
                "alias": "kv-heavy",
            },
            "timeouts": {"stop": "30s", "kill": "10s", "release": "120s", "ready": "300s"},
            "release": {"tolerance": "1GiB", "settle": "300ms", "foreign_holders": "fail"},
            "log_dir": str(out / "runs"),
        },
        "params": {"points": points},
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


def _argv(binary: str, model: Path, port: int, point: dict[str, Any]) -> list[str]:
    argv = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["-ngl", "0" if REHEARSAL else "99", "--flash-attn", "off" if REHEARSAL else "on"]
    for key, value in point.items():
        argv += [f"--{key}", str(value)]
    return argv


def _health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def _complete(port: int) -> int:
    body = json.dumps({"prompt": "hello there", "max_tokens": 8}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return int(json.loads(resp.read())["usage"]["completion_tokens"])


def _naive_round(
    keeper: ProcessKeeper,
    out: Path,
    binary: str,
    model: Path,
    points: list[dict[str, Any]],
    sleep_s: float,
) -> list[dict[str, Any]]:
    """What a shell script does: ``kill $PID; sleep S; llama-server ... &``, then poll
    ``/health`` until 200 (or the process exits), one completion, next."""
    port = free_port()
    rows: list[dict[str, Any]] = []
    prev: subprocess.Popen[Any] | None = None
    t_round = time.monotonic()
    for i, point in enumerate(points):
        if prev is not None:
            prev.send_signal(signal.SIGTERM)
            time.sleep(sleep_s)
        log = out / f"naive-sleep{sleep_s:g}-{i}.log"
        t0 = time.monotonic()
        proc = keeper.popen(_argv(binary, model, port, point), log)
        state, saw_503 = "timeout", False
        while time.monotonic() - t0 < 300:
            status = _health(port)
            saw_503 |= status == 503
            if status == 200:
                state = "ready"
                break
            if proc.poll() is not None:
                state = "exited"
                break
            time.sleep(0.05)
        tokens = None
        if state == "ready":
            try:
                tokens = _complete(port)
            except OSError as exc:
                state = f"serve_error: {exc}"
        text = log.read_text(errors="replace")
        exit_code = proc.poll()
        rows.append(
            {
                "sleep_s": sleep_s,
                "index": i,
                "point": point,
                "outcome": state,
                "exit_code": exit_code,
                # "ready" while the new process had already died: the old one answered
                "fooled": state == "ready" and exit_code is not None,
                "oom": bool(_OOM.search(text)),
                "bind_failed": "couldn't bind" in text,
                "saw_503": saw_503,
                "tokens": tokens,
                "start_to_ready_s": round(time.monotonic() - t0, 3) if state == "ready" else None,
            }
        )
        if prev is not None:
            try:
                prev.wait(60)
            except subprocess.TimeoutExpired:
                prev.kill()
        prev = proc if proc.poll() is None else None
    if prev is not None:
        prev.send_signal(signal.SIGTERM)
        prev.wait(60)
    for row in rows:
        row["round_s"] = round(time.monotonic() - t_round, 3)
    return rows


def test_llama_server_sweep_on_the_gpu(keeper: ProcessKeeper, tmp_path: Path) -> None:
    binary = _binary()
    total = None if REHEARSAL else total_gib(require_gpus(1)[0])
    out = results_dir("llama_server", tmp_path)
    t0 = time.monotonic()
    # the model stays out of the results folder (1.3 GB of random weights)
    shape = REHEARSAL_SHAPE if REHEARSAL else SHAPE
    model = write_tiny_gguf(tmp_path / "kv-heavy.gguf", shape=shape)
    model_write_s = time.monotonic() - t0
    points = _points(total)
    if total is not None:
        kv_gib = [p["ctx-size"] * KV_BYTES_PER_TOKEN / GiB for p in points]
        assert all(2 * kv > total for kv in kv_gib), (kv_gib, total)
    sweep = _sweep(out, binary, model, points)
    if REHEARSAL:
        run = run_sweep(sweep, keeper, "gpu-llama-server")
        monitor = None
    else:
        with GpuMonitor([0]) as monitor:
            run = run_sweep(sweep, keeper, "gpu-llama-server")
        monitor.save(out / "monitor.json")
    report = report_json(sweep, keeper)
    trials = [trial_digest(t) for t in report["trials"]]
    release = per_gpu_release(report, monitor) if monitor is not None else []
    # the naive loop in the same run: no sleep (one restart), then the incident's 8 s
    naive = _naive_round(keeper, out, binary, model, points[:2], 0.0)
    naive += _naive_round(keeper, out, binary, model, points, 8.0)
    record_summary(
        "llama_server",
        {
            "gpu_total_gib": total,
            "engine_version": report["sweep"]["environment"].get("engine_version"),
            "model_write_s": round(model_write_s, 2),
            "points": points,
            "exit_code": run.returncode,
            "seconds": run.seconds,
            "trials": trials,
            "release_per_gpu": release,
            "naive": naive,
        },
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{json.dumps(trials, indent=1)}"
    assert [t["outcome"] for t in trials] == ["ok"] * len(points)
    for t in trials:
        assert t["phase_seconds"]["load"] > 0
        peak = t["peak_gpu_memory_gib"]
        assert total is None or peak is None or peak > 0.5 * total, t
    for row in release:
        assert row["servesweep_release_s"] is not None
        assert all(v is not None for v in row["from_stop_s"].values()), row
    firsts = [r for r in naive if r["index"] == 0]
    assert all(r["outcome"] == "ready" and r["tokens"] for r in firsts), firsts
