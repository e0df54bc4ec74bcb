"""servesweep's own cost per restart, measured against the simulator's ground truth.

Each restart moves a simulated engine (fake GPUs: two instances never fit together)
from one configuration to the next. The simulator writes ground-truth timestamps
(``--truth``): when the old process exited, when its GPU memory was really released
(after ``--release-delay``), when the new process was ready to serve. The physical
floor of a restart is::

    (old exit - stop call) + (old memory released - old exit) + (new ready - new launch)

and servesweep's overhead is everything beyond it: noticing the exit, the release
gate's polling and settle window, the port check, the readiness gate's detection and
its real generation. The same restarts through a fixed-sleep script (stop, sleep,
start, poll ``/v1/models``) are shown beside it: a short sleep fails (CUDA OOM of
the new instance), a sleep long enough to be safe pays its margin on every restart.

Run:  .venv/bin/python bench/restart_overhead.py [--restarts 4] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servesweep.models import InstanceRecord
from servesweep.servers import procs
from servesweep.servers.engines import get_preset
from servesweep.servers.gpu import open_probe
from servesweep.servers.launchers.subprocess import SubprocessLauncher
from servesweep.servers.lifecycle import ServerLifecycle
from servesweep.sim.testing import free_port, read_truth
from servesweep.spec.schema import ServerSpec

SIM = get_preset("sim")


@dataclass
class Restart:
    mode: str
    outcome: str
    total_s: float
    floor_s: float | None = None
    overhead_s: float | None = None
    stop_s: float | None = None
    release_s: float | None = None
    ready_s: float | None = None
    exit_detect_s: float | None = None
    """stop returned - old process exit (truth)"""
    release_gate_s: float | None = None
    """release gate returned - old memory released (truth); includes the settle window"""
    ready_detect_s: float | None = None
    """readiness gate returned - new engine ready (truth); includes the real generation"""
    start_s: float | None = None
    """new instance launched - release gate returned (port check, fork/exec)"""


def _truth(path: Path, pid: int, event: str) -> float | None:
    times = [e["t"] for e in read_truth(path) if e["event"] == event and e.get("pid") == pid]
    return float(times[-1]) if times else None


def _floor(truth: Path, old_pid: int, stop_call: float, new_pid: int, launch: float) -> float:
    exit_t = _truth(truth, old_pid, "exit")
    released = _truth(truth, old_pid, "memory_released")
    ready = _truth(truth, new_pid, "ready")
    if exit_t is None or released is None or ready is None:
        raise RuntimeError(f"missing ground truth for pids {old_pid}/{new_pid} in {truth}")
    return (exit_t - stop_call) + (released - exit_t) + (ready - launch)


def _sim_params(args: argparse.Namespace, fake: Path, truth: Path, budget: int) -> dict[str, Any]:
    return {
        "fake-gpus": str(fake),
        "gpus": "0",
        "mem-per-gpu": "5GiB",
        "load-time": args.load_time,
        "release-delay": args.release_delay,
        "shutdown-delay": args.shutdown_delay,
        "truth": str(truth),
        "budget": budget,
    }


def run_servesweep(args: argparse.Namespace, work: Path, fake: Path) -> list[Restart]:
    truth = work / "truth-servesweep.jsonl"
    port = free_port()
    spec = ServerSpec.model_validate(
        {
            "engine": "sim",
            "port": port,
            "gpus": [0],
            "gpu_backend": "fake",
            "fake_gpu_dir": str(fake),
            "timeouts": {"stop": 30, "kill": 10, "release": 60, "ready": 60},
        }
    )
    probe = open_probe("fake", str(fake))
    launcher = SubprocessLauncher()
    lc = ServerLifecycle(spec, SIM, launcher, probe)
    lc.prepare([0])
    out: list[Restart] = []
    current: InstanceRecord | None = None
    started: list[InstanceRecord] = []
    try:
        for i in range(args.restarts + 1):
            argv = SIM.build_argv(spec, _sim_params(args, fake, truth, 2 + i))
            t_stop = time.time()
            old_pid = 0
            stop_s = release_s = 0.0
            if current is not None:
                old_pid = current.main_pid or 0
                old_pids = launcher.pids(current) | set(current.pids)
                stop_s = lc.stop(current).seconds
                t_stopped = time.time()
                release_s = lc.release([0], old_pids).seconds
                t_released = time.time()
            current = lc.start(argv, {}, work / f"ss-{i}.log", f"bench-{i}", str(i))
            started.append(current)
            info = lc.wait_ready(current)
            t_ready = time.time()
            if old_pid == 0:
                continue  # the first start is not a restart
            floor = _floor(truth, old_pid, t_stop, current.main_pid or 0, current.started_at or 0)
            total = t_ready - t_stop
            new_pid = current.main_pid or 0
            out.append(
                Restart(
                    "servesweep",
                    "ok",
                    total,
                    floor,
                    total - floor,
                    stop_s,
                    release_s,
                    info.ready_s,
                    exit_detect_s=t_stopped - (_truth(truth, old_pid, "exit") or 0),
                    release_gate_s=t_released - (_truth(truth, old_pid, "memory_released") or 0),
                    ready_detect_s=t_ready - (_truth(truth, new_pid, "ready") or 0),
                    start_s=(current.started_at or 0) - t_released,
                )
            )
    finally:
        for inst in started:
            with contextlib.suppress(Exception):
                launcher.stop(inst, 1.0, 5.0)
        probe.close()
    return out


def _get(port: int, path: str, body: dict[str, Any] | None = None) -> int | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(
            "POST" if data else "GET",
            path,
            data,
            {"Content-Type": "application/json"} if data else {},
        )
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except OSError:
        return None
    finally:
        conn.close()


def run_fixed_sleep(
    args: argparse.Namespace, work: Path, fake: Path, sleep_s: float
) -> list[Restart]:
    """The incident's script: SIGTERM, sleep, start, poll /v1/models every 0.5 s."""
    truth = work / f"truth-sleep-{sleep_s:g}.jsonl"
    port = free_port()
    spec = ServerSpec(engine="sim", port=port)
    out: list[Restart] = []
    children: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, procs.TAG_ENV: f"bench-sleep-{os.getpid()}"}

    def launch(i: int) -> subprocess.Popen[bytes]:
        argv = SIM.build_argv(spec, _sim_params(args, fake, truth, 2 + i))
        with open(work / f"sleep-{sleep_s:g}-{i}.log", "ab") as log:
            child = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        children.append(child)
        return child

    def wait_models(child: subprocess.Popen[bytes], limit: float) -> str:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if child.poll() is not None:
                return f"failed to start (exit {child.returncode})"
            if _get(port, "/v1/models") == 200:
                return "ok"
            time.sleep(0.5)
        return "timeout"

    try:
        current = launch(0)
        if wait_models(current, 60) != "ok":
            raise RuntimeError("the first fixed-sleep instance did not start")
        for i in range(1, args.restarts + 1):
            t_stop = time.time()
            old = current
            old.send_signal(signal.SIGTERM)
            time.sleep(sleep_s)
            current = launch(i)
            launched = time.time()
            outcome = wait_models(current, 60)
            total = time.time() - t_stop
            with contextlib.suppress(subprocess.TimeoutExpired):
                old.wait(timeout=30)
            row = Restart(f"fixed sleep {sleep_s:g}s", outcome, total)
            if outcome == "ok":
                row.floor_s = _floor(truth, old.pid, t_stop, current.pid, launched)
                row.overhead_s = total - row.floor_s
            else:
                log = (work / f"sleep-{sleep_s:g}-{i}.log").read_text(errors="replace")
                if "OutOfMemoryError" in log:
                    row.outcome = "failed to start: CUDA OOM (memory not yet released)"
                time.sleep(args.release_delay + 1.0)  # recover by hand, like the incident
                current = launch(i)
                wait_models(current, 60)
            out.append(row)
    finally:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        procs.signal_all(procs.tagged(env[procs.TAG_ENV]), signal.SIGKILL)
    return out


def _table(rows: list[Restart]) -> str:
    lines = [
        f"{'mode':<22} {'restarts':>8} {'ok':>3} {'total s':>8} {'floor s':>8} "
        f"{'overhead s (mean/max)':>22}  outcome"
    ]
    modes: dict[str, list[Restart]] = {}
    for r in rows:
        modes.setdefault(r.mode, []).append(r)
    for mode, rs in modes.items():
        ok = [r for r in rs if r.overhead_s is not None]
        over = [r.overhead_s for r in ok if r.overhead_s is not None]
        total = statistics.mean(r.total_s for r in rs)
        floor = statistics.mean(r.floor_s for r in ok if r.floor_s is not None) if ok else None
        outcomes = sorted({r.outcome for r in rs})
        lines.append(
            f"{mode:<22} {len(rs):>8} {len(ok):>3} {total:>8.2f} "
            f"{(f'{floor:.2f}' if floor is not None else '-'):>8} "
            f"{(f'{statistics.mean(over):.3f} / {max(over):.3f}' if over else '-'):>22}  "
            + "; ".join(outcomes)
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--restarts", type=int, default=4)
    p.add_argument("--load-time", type=float, default=1.0)
    p.add_argument("--release-delay", type=float, default=2.0)
    p.add_argument("--shutdown-delay", type=float, default=0.5)
    p.add_argument(
        "--sleep",
        type=float,
        nargs="*",
        default=[1.0, 4.0],
        help="fixed sleeps to compare (default: 1 (too short) and 4 (safe))",
    )
    p.add_argument("--json", action="store_true", help="print rows as JSON lines too")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="servesweep-bench-") as tmp:
        work = Path(tmp)
        rows: list[Restart] = []
        for label, runner in [("servesweep", None), *[(f"sleep {s}", s) for s in args.sleep]]:
            fake = work / f"gpus-{label.replace(' ', '-')}"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "servesweep.fakegpu",
                    "init",
                    str(fake),
                    "--count",
                    "1",
                    "--memory",
                    "8GiB",
                ],
                check=True,
                capture_output=True,
            )
            if runner is None:
                rows += run_servesweep(args, work, fake)
            else:
                rows += run_fixed_sleep(args, work, fake, runner)
    print(
        f"restart overhead: load {args.load_time:g}s, release delay {args.release_delay:g}s, "
        f"graceful shutdown {args.shutdown_delay:g}s, {args.restarts} restarts per mode"
    )
    print(_table(rows))
    ours = [r for r in rows if r.mode == "servesweep"]
    if ours:

        def mean(key: str) -> float:
            return float(statistics.mean(getattr(r, key) for r in ours))

        print(
            f"servesweep overhead = release gate after the physical release "
            f"{mean('release_gate_s'):.3f} (settle window included) + start "
            f"{mean('start_s'):.3f} + readiness after the engine was ready "
            f"{mean('ready_detect_s'):.3f} (one real generation included); noticing the "
            f"old exit took {mean('exit_detect_s'):.3f}, hidden behind the release delay"
        )
    if args.json:
        for r in rows:
            print(json.dumps(asdict(r)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
