"""The GPU test servers themselves on real GPUs: they load, hold what they are told,
generate, and give everything back on SIGTERM (also the device smoke test)."""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.gpu.gpu_helpers import (
    SERVER_DIR,
    GiB,
    ProcessKeeper,
    child_env,
    free_port,
    record_summary,
    require_gpus,
    results_dir,
    wait_for_line,
)

from servesweep.servers.gpu.nvml import NvmlProbe


def _post(port: int, path: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        data: bytes = resp.read()
    return data


def _check_generates(port: int) -> None:
    data = json.loads(_post(port, "/v1/completions", {"prompt": "a b c", "max_tokens": 6}))
    assert data["usage"]["completion_tokens"] == 6, data
    stream = _post(
        port,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
    ).decode()
    chunks = [line[6:] for line in stream.splitlines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    usage = json.loads(chunks[-2])["usage"]
    assert usage["completion_tokens"] == 5, usage


def _holders(gpus: list[int]) -> dict[int, dict[int, int]]:
    probe = NvmlProbe()
    try:
        return {s.index: {h.pid: h.used_bytes for h in s.holders} for s in probe.snapshot(gpus)}
    finally:
        probe.close()


def _used(gpus: list[int]) -> dict[int, int]:
    probe = NvmlProbe()
    try:
        return {s.index: s.used_bytes for s in probe.snapshot(gpus)}
    finally:
        probe.close()


def _run_server(
    keeper: ProcessKeeper, out: Path, script: str, gpus: list[int], flags: list[str]
) -> dict[str, Any]:
    """Start, check holders and generation, SIGTERM, time the release per GPU."""
    baseline = _used(gpus)
    port = free_port()
    log = out / f"{script}.log"
    t0 = time.monotonic()
    argv = [sys.executable, str(SERVER_DIR / script), "--port", str(port), *flags]
    env = child_env({"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))})
    proc = keeper.popen(argv, log, env=env)
    wait_for_line(log, "Uvicorn running on", 300, proc)
    ready_s = time.monotonic() - t0
    _check_generates(port)
    holders = _holders(gpus)
    t_stop = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(60)
    exit_s = time.monotonic() - t_stop
    release: dict[str, float | None] = {}
    pending = set(gpus)
    while pending and time.monotonic() - t_stop < 60:
        for gpu, used in _used(list(pending)).items():
            if used <= baseline[gpu] + GiB // 2:
                release[str(gpu)] = round(time.monotonic() - t_stop, 3)
                pending.discard(gpu)
        time.sleep(0.01)
    for gpu in pending:
        release[str(gpu)] = None
    return {
        "ready_s": round(ready_s, 3),
        "exit_code": code,
        "exit_after_sigterm_s": round(exit_s, 3),
        "release_after_sigterm_s": release,
        "holders": {str(g): {str(p): u / GiB for p, u in h.items()} for g, h in holders.items()},
        "pids": {"front": proc.pid},
    }


def test_gpu_server_loads_holds_generates_releases(keeper: ProcessKeeper, tmp_path: Path) -> None:
    gpus = require_gpus(1)[:1]
    out = results_dir("servers_gpu", tmp_path)
    flags = ["--hold-gib", "8", "--front-hold-gib", "1", "--pinned-gib", "2", "--layers", "2"]
    row = _run_server(keeper, out, "gpu_server.py", gpus, flags)
    record_summary("servers_gpu", row)
    held = row["holders"]["0"]
    front = str(row["pids"]["front"])
    assert front in held and held[front] >= 1, held
    workers = [p for p in held if p != front]
    assert len(workers) == 1 and held[workers[0]] >= 8, held
    assert row["exit_code"] == 0
    assert all(v is not None for v in row["release_after_sigterm_s"].values()), row


def test_tp_server_loads_on_every_gpu(keeper: ProcessKeeper, tmp_path: Path) -> None:
    gpus = require_gpus(2)
    out = results_dir("servers_tp", tmp_path)
    flags = ["--tp", str(len(gpus)), "--hold-gib", "8", "--pinned-gib", "2", "--heads", "16"]
    row = _run_server(keeper, out, "tp_server.py", gpus, flags)
    log = (out / "tp_server.py.log").read_text(errors="replace")
    record_summary("servers_tp", row)
    assert "nccl communicator of" in log, log[-2000:]
    for gpu in gpus:
        held = row["holders"][str(gpu)]
        assert any(u >= 8 for u in held.values()), (gpu, held)
    assert row["exit_code"] == 0
    assert all(v is not None for v in row["release_after_sigterm_s"].values()), row
