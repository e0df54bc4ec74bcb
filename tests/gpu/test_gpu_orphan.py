"""Orphaned GPU workers on one GPU (issue 6).

The worker of ``gpu_server.py --orphan-worker`` lives in its own session: when the
front process is SIGKILLed it survives and keeps its GPU memory. servesweep must
find it (it carries our instance tag) and end it before the next start, which
could not fit beside it.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tests.gpu.gpu_helpers import (
    SERVER_DIR,
    GiB,
    GpuMonitor,
    ProcessKeeper,
    events,
    free_port,
    leftover_env,
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
from servesweep.servers.gpu.nvml import NvmlProbe
from servesweep.store import open_store

_ORPHAN = re.compile(
    r"\[worker 0 pid (\d+)\] the front process is gone: orphaned.*\(at ([0-9.]+)\)"
)
_FRONT = re.compile(r"\[front pid (\d+)\]")


def _last_seen(monitor: GpuMonitor, gpu: int, pid: int) -> float | None:
    seen = [s.t for s in monitor.samples if s.gpu == gpu and pid in s.pids]
    return max(seen) if seen else None


def test_orphan_of_crashed_instance_is_cleaned_before_next_start(
    keeper: ProcessKeeper, tmp_path: Path
) -> None:
    gpus = require_gpus(1)[:1]
    gpu = gpus[0]
    total = total_gib(gpu)
    out = results_dir("orphan_crash", tmp_path)
    hold = round(total * 0.6)
    sweep = write_sweep(
        out / "sweep.yaml",
        name="orphan-crash",
        script="gpu_server.py",
        gpus=gpus,
        args={"pinned-gib": 2, "front-hold-gib": 1, "layers": 2},
        points=[
            # trial 1: the front SIGKILLs itself during the benchmark; its worker stays
            {"hold-gib": hold, "orphan-worker": True, "crash-after-requests": 5},
            # trial 2 needs the memory the orphan holds
            {"hold-gib": hold},
        ],
        workload={"name": "chat", "concurrency": [1], "requests": 16, "max_tokens": 16},
    )
    with GpuMonitor(gpus) as monitor:
        run = run_sweep(sweep, keeper, "orphan-crash")
    monitor.save(out / "monitor.json")
    report = report_json(sweep, keeper)
    first, second = report["trials"]
    log1 = Path(first["log_path"]).read_text(errors="replace")
    orphan = _ORPHAN.search(log1)
    front = _FRONT.search(log1)
    assert orphan and front, f"no orphan line in {first['log_path']}:\n{log1[-3000:]}"
    orphan_pid, front_pid = int(orphan.group(1)), int(front.group(1))
    orphaned_at = float(orphan.group(2))
    keeper.pids.add(orphan_pid)
    # the worker outlived its front, still holding GPU memory (servesweep's stop
    # may already be tearing it down: the full amount is shown by the next test)...
    alone = [
        s for s in monitor.samples if s.gpu == gpu and orphan_pid in s.pids and s.t >= orphaned_at
    ]
    last = _last_seen(monitor, gpu, orphan_pid)
    start2 = second["phase_started"].get("start")
    summary: dict[str, Any] = {
        "exit_code": run.returncode,
        "trials": [trial_digest(t) for t in report["trials"]],
        "orphan_pid": orphan_pid,
        "front_pid": front_pid,
        "orphan_alone_samples": len(alone),
        "orphan_max_used_gib": max((s.used for s in alone), default=0) / GiB,
        "orphan_gone_before_start2_s": None if last is None or start2 is None else start2 - last,
        "events": [e for e in events(sweep) if e["event"] in ("warning", "trial_finished")],
    }
    record_summary("orphan_crash", summary)
    assert first["outcome"] == "failed", first
    assert alone, "the orphaned worker was never seen holding GPU memory without its front"
    assert max(s.used for s in alone) > GiB
    # ...servesweep ended it before the next start, which then fit
    assert procs.is_gone(orphan_pid), f"orphan pid {orphan_pid} is still alive"
    assert last is not None and start2 is not None and last < start2
    assert second["outcome"] == "ok", second
    # and the store keeps the evidence: the stop before trial 2 signalled the orphan
    with open_store(sweep.parent / "servesweep.db", readonly=True) as store:
        facts = store.events(1, "stopped") + store.events(1, "released")
    ended = {pid for e in facts for pid in [*e.get("signalled", []), *e.get("killed", [])]} | {
        int(c.split()[1]) for e in facts for c in e.get("cleaned", [])
    }
    assert orphan_pid in ended, facts


def test_leftover_orphan_of_an_earlier_run_is_cleaned_before_the_sweep(
    keeper: ProcessKeeper, tmp_path: Path
) -> None:
    """As after a servesweep that was killed itself: an orphaned worker of an earlier
    run of this results database holds the GPU; the next ``servesweep run`` ends it
    first."""
    gpus = require_gpus(1)[:1]
    gpu = gpus[0]
    total = total_gib(gpu)
    out = results_dir("orphan_leftover", tmp_path)
    hold = round(total * 0.6)
    log = out / "leftover.log"
    port = free_port()
    front = keeper.popen(
        [
            sys.executable,
            str(SERVER_DIR / "gpu_server.py"),
            "--port",
            str(port),
            "--hold-gib",
            str(hold),
            "--front-hold-gib",
            "1",
            "--orphan-worker",
        ],
        log,
        # an earlier run of the same results database left it: ours to end
        env=leftover_env("orphan-left-7-0badcafe", out / "servesweep.db"),
    )
    wait_for_line(log, "Uvicorn running on", 300, front)
    started = wait_for_line(log, r"started worker 0: pid \d+", 5, front)
    worker_pid = int(started.split("started worker 0: pid ")[1].split()[0])
    keeper.pids.add(worker_pid)
    front.send_signal(signal.SIGKILL)
    front.wait(10)
    wait_for_line(log, "orphaned, keeping", 30, None)
    time.sleep(1.0)
    probe = NvmlProbe()
    try:
        state = probe.snapshot([gpu])[0]
    finally:
        probe.close()
    held = {h.pid: h.used_bytes for h in state.holders}
    assert worker_pid in held, f"orphan {worker_pid} not listed by NVML: {held}"
    assert held[worker_pid] >= hold * GiB
    sweep = write_sweep(
        out / "sweep.yaml",
        name="orphan-left",
        script="gpu_server.py",
        gpus=gpus,
        args={"pinned-gib": 2, "front-hold-gib": 1, "layers": 2},
        points=[{"hold-gib": hold}],
        workload={"name": "chat", "concurrency": [1], "requests": 8, "max_tokens": 16},
    )
    run = run_sweep(sweep, keeper, "orphan-left")
    report = report_json(sweep, keeper)
    record_summary(
        "orphan_leftover",
        {
            "orphan_pid": worker_pid,
            "orphan_used_gib": held[worker_pid] / GiB,
            "exit_code": run.returncode,
            "trials": [trial_digest(t) for t in report["trials"]],
            "stderr_tail": run.stderr[-2000:],
        },
    )
    assert procs.is_gone(worker_pid), f"orphan pid {worker_pid} is still alive"
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    assert report["trials"][0]["outcome"] == "ok"
