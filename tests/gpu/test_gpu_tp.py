"""Multi-GPU validation with a tensor-parallel-like server (issue 8).

``tests/gpu/server/tp_server.py`` runs one worker per GPU joined by NCCL (NVLink
multicast off), each holding most of its GPU plus pinned host memory. Three
configs are swept by servesweep (every trial ``ok``, release time per GPU from an
NVML monitor), the same restarts are done naively (stop, fixed short sleep,
start) and counted, and the orphan case is run across all GPUs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.gpu.gpu_helpers import (
    SERVER_DIR,
    GiB,
    GpuMonitor,
    ProcessKeeper,
    child_env,
    events,
    free_port,
    gpu_count,
    leftover_env,
    per_gpu_release,
    record_summary,
    report_json,
    require_gpus,
    results_dir,
    run_sweep,
    total_gib,
    trial_digest,
    wait_for_line,
    write_sweep,
)

from servesweep.servers import procs

HOLD_FRACTIONS = (0.55, 0.65, 0.75)
PINNED_GIB = (4, 8, 12)
_OOM = re.compile(r"out of memory|OutOfMemoryError|CUDA error", re.IGNORECASE)
_PORT = re.compile(r"address already in use|Errno 98", re.IGNORECASE)


def _configs(total: float) -> list[dict[str, Any]]:
    return [
        {"hold-gib": round(total * f), "pinned-gib": p, "layers": 2 + 2 * i, "batch": 4 * (i + 1)}
        for i, (f, p) in enumerate(zip(HOLD_FRACTIONS, PINNED_GIB, strict=True))
    ]


def _gpus() -> list[int]:
    require_gpus(2)
    return list(range(gpu_count()))


def test_tp_sweep_every_trial_ok_release_per_gpu(keeper: ProcessKeeper, tmp_path: Path) -> None:
    gpus = _gpus()
    total = min(total_gib(g) for g in gpus)
    out = results_dir("tp_sweep", tmp_path)
    configs = _configs(total)
    sweep = write_sweep(
        out / "sweep.yaml",
        name="tp-sweep",
        script="tp_server.py",
        gpus=gpus,
        args={"tp": len(gpus), "hidden": 2048, "heads": 16},
        points=configs,
    )
    with GpuMonitor(gpus) as monitor:
        run = run_sweep(sweep, keeper, "tp-sweep", timeout=420)
    monitor.save(out / "monitor.json")
    report = report_json(sweep, keeper)
    trials = [trial_digest(t) for t in report["trials"]]
    release = per_gpu_release(report, monitor)
    record_summary(
        "tp_sweep",
        {
            "gpus": gpus,
            "gpu_total_gib": total,
            "configs": configs,
            "exit_code": run.returncode,
            "seconds": run.seconds,
            "trials": trials,
            "release_per_gpu": release,
        },
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{json.dumps(trials, indent=1)}"
    assert [t["outcome"] for t in trials] == ["ok"] * len(configs)
    assert len(release) == len(configs) - 1
    for row in release:
        assert set(row["from_stop_s"]) == {str(g) for g in gpus}
        assert all(v is not None for v in row["from_stop_s"].values()), row


def _wait_up(proc: subprocess.Popen[Any], log: Path, timeout: float) -> str:
    """``ready`` once the log says it listens, else ``exited``/``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "Uvicorn running on" in log.read_text(errors="replace"):
            return "ready"
        if proc.poll() is not None:
            return "exited"
        time.sleep(0.05)
    return "timeout"


def _generate(port: int) -> int:
    body = json.dumps({"model": "tiny-random-lm", "prompt": "hello there", "max_tokens": 8})
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        data = json.loads(resp.read())
    return int(data["usage"]["completion_tokens"])


def _naive_round(
    keeper: ProcessKeeper,
    out: Path,
    gpus: list[int],
    configs: list[dict[str, Any]],
    sleep_s: float,
    monitor: GpuMonitor,
    baseline: dict[int, int],
) -> list[dict[str, Any]]:
    """Start each config in turn like a shell script would: ``kill $PID; sleep S``."""
    port = free_port()
    rows: list[dict[str, Any]] = []
    prev: subprocess.Popen[Any] | None = None
    for i, cfg in enumerate(configs):
        t_stop = None
        if prev is not None:
            t_stop = time.time()
            prev.send_signal(signal.SIGTERM)
            time.sleep(sleep_s)
        log = out / f"naive-sleep{sleep_s:g}-{i}.log"
        argv = [sys.executable, str(SERVER_DIR / "tp_server.py"), "--port", str(port)]
        argv += ["--tp", str(len(gpus)), "--hidden", "2048", "--heads", "16"]
        for key, value in cfg.items():
            argv += [f"--{key}", str(value)]
        env = child_env({"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))})
        t_start = time.time()
        old_alive = prev is not None and prev.poll() is None
        proc = keeper.popen(argv, log, env=env)
        state = _wait_up(proc, log, 300)
        text = log.read_text(errors="replace")
        tokens = None
        if state == "ready":
            try:
                tokens = _generate(port)
            except OSError as exc:
                state = f"serve_error: {exc}"
        release = {}
        if t_stop is not None:
            for g in gpus:
                # released before the new instance was up (else: it never was)
                at = monitor.released_at(g, t_stop, baseline[g] + GiB, before=time.time())
                release[str(g)] = None if at is None else round(at - t_stop, 3)
        rows.append(
            {
                "sleep_s": sleep_s,
                "index": i,
                "config": cfg,
                "outcome": state,
                "exit_code": proc.poll(),
                "oom": bool(_OOM.search(text)),
                "port_in_use": bool(_PORT.search(text)),
                "tokens": tokens,
                "old_front_alive_at_start": old_alive,
                "start_to_ready_s": round(time.time() - t_start, 3) if state == "ready" else None,
                "release_from_stop_s": release,
                "log": log.name,
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
        try:
            prev.wait(60)
        except subprocess.TimeoutExpired:
            prev.kill()
    return rows


def test_tp_naive_restarts_side_by_side(keeper: ProcessKeeper, tmp_path: Path) -> None:
    """Not a pass/fail of servesweep: records how often naive restarts collide."""
    gpus = _gpus()
    total = min(total_gib(g) for g in gpus)
    out = results_dir("tp_naive", tmp_path)
    configs = _configs(total)
    sleeps = [float(s) for s in os.environ.get("GPU_TEST_NAIVE_SLEEPS", "0,0.5,2").split(",")]
    from servesweep.servers.gpu.nvml import NvmlProbe

    probe = NvmlProbe()
    try:
        baseline = {s.index: s.used_bytes for s in probe.snapshot(gpus)}
    finally:
        probe.close()
    rows: list[dict[str, Any]] = []
    with GpuMonitor(gpus) as monitor:
        for sleep_s in sleeps:
            rows += _naive_round(keeper, out, gpus, configs, sleep_s, monitor, baseline)
    monitor.save(out / "monitor.json")
    restarts = [r for r in rows if r["index"] > 0]
    collided = [r for r in restarts if r["outcome"] != "ready" or r["tokens"] is None]
    record_summary(
        "tp_naive",
        {
            "gpus": gpus,
            "sleeps": sleeps,
            "restarts": len(restarts),
            "collided": len(collided),
            "ooms": sum(1 for r in restarts if r["oom"]),
            "port_in_use": sum(1 for r in restarts if r["port_in_use"]),
            "rows": rows,
        },
    )
    # the first start of each round had idle GPUs: it must work, or the test is broken
    firsts = [r for r in rows if r["index"] == 0]
    assert all(r["outcome"] == "ready" and r["tokens"] for r in firsts), firsts


_STARTED = re.compile(r"started worker (\d+): pid (\d+)")


def test_tp_orphans_on_every_gpu_are_cleaned(keeper: ProcessKeeper, tmp_path: Path) -> None:
    """Kill only the front process: its workers (own sessions) keep their memory on
    every GPU; ``servesweep run`` of the sweep that owns them (their instance tag)
    finds them all and ends them before it starts anything."""
    gpus = _gpus()
    total = min(total_gib(g) for g in gpus)
    out = results_dir("tp_orphan", tmp_path)
    hold = round(total * 0.6)
    log = out / "leftover.log"
    argv = [sys.executable, str(SERVER_DIR / "tp_server.py"), "--port", str(free_port())]
    argv += ["--tp", str(len(gpus)), "--hold-gib", str(hold), "--pinned-gib", "4"]
    argv += ["--heads", "16", "--hidden", "2048", "--orphan-workers"]
    env = leftover_env(
        "tp-orphan-3-0badcafe",
        out / "servesweep.db",
        {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))},
    )
    front = keeper.popen(argv, log, env=env)
    wait_for_line(log, "Uvicorn running on", 300, front)
    workers = {int(r): int(p) for r, p in _STARTED.findall(log.read_text())}
    keeper.pids.update(workers.values())
    assert sorted(workers) == list(range(len(gpus))), workers
    front.send_signal(signal.SIGKILL)
    front.wait(10)
    killed_at = time.time()
    time.sleep(2.0)
    from servesweep.servers.gpu.nvml import NvmlProbe

    probe = NvmlProbe()
    try:
        states = {s.index: s for s in probe.snapshot(gpus)}
    finally:
        probe.close()
    held = {
        str(gpus[rank]): {h.pid: h.used_bytes / GiB for h in states[gpus[rank]].holders}.get(pid, 0)
        for rank, pid in workers.items()
    }
    sweep = write_sweep(
        out / "sweep.yaml",
        name="tp-orphan",
        script="tp_server.py",
        gpus=gpus,
        args={"tp": len(gpus), "pinned-gib": 4, "layers": 2, "heads": 16, "hidden": 2048},
        points=[{"hold-gib": hold}],
        workload={"name": "chat", "concurrency": [1], "requests": 8, "max_tokens": 16},
    )
    with GpuMonitor(gpus) as monitor:
        run = run_sweep(sweep, keeper, "tp-orphan", timeout=300)
    monitor.save(out / "monitor.json")
    report = report_json(sweep, keeper)
    trial = report["trials"][0]
    start = trial["phase_started"].get("start")
    per_gpu: dict[str, dict[str, Any]] = {}
    for rank, pid in workers.items():
        gpu = gpus[rank]
        seen = [s.t for s in monitor.samples if s.gpu == gpu and pid in s.pids]
        per_gpu[str(gpu)] = {
            "pid": pid,
            "held_gib_2s_after_front_sigkill": held[str(gpu)],
            "last_seen_before_start_s": (start - max(seen)) if seen and start else None,
            "gone": procs.is_gone(pid),
        }
    record_summary(
        "tp_orphan",
        {
            "front_killed_at": killed_at,
            "orphans": per_gpu,
            "exit_code": run.returncode,
            "seconds": run.seconds,
            "trials": [trial_digest(t) for t in report["trials"]],
            "events": [e for e in events(sweep) if e["event"] in ("warning", "trial_finished")],
        },
    )
    for gpu_key, row in per_gpu.items():
        assert row["held_gib_2s_after_front_sigkill"] >= hold, (gpu_key, row)
        assert row["gone"], (gpu_key, row)
        if row["last_seen_before_start_s"] is not None:
            assert row["last_seen_before_start_s"] > 0, (gpu_key, row)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    assert trial["outcome"] == "ok", trial
