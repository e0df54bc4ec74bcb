"""Helpers of the GPU test tier: GPU checks, sweep files, running the CLI, an NVML
monitor for per-GPU release times, processes cleaned up by PID, result files.

Every process a test starts is ended by PID in a finalizer. Results (sweep files,
stores, server logs, reports, monitor traces, a summary line per test) go under
``$GPU_TEST_RESULTS/<test name>/`` when that is set (``dev/gpu-tests.sh`` sets it
and brings the folder back from the device machine), else under pytest's tmp_path.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from servesweep.errors import GpuProbeError, NoGpuDriverError
from servesweep.servers import procs
from servesweep.servers.gpu.nvml import NvmlProbe

GiB = 2**30
MiB = 2**20
SERVER_DIR = Path(__file__).parent / "server"
REPO = Path(__file__).resolve().parents[2]

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""NVLink multicast off in every process we start (the device machines require it)."""


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Our environment, multicast off, unbuffered, no servesweep instance tag."""
    env = {**os.environ, **MULTICAST_OFF, "PYTHONUNBUFFERED": "1"}
    env.pop(procs.TAG_ENV, None)
    src = str(REPO / "src")
    if src not in env.get("PYTHONPATH", "").split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def leftover_env(
    tag: str, store_db: Path, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of an instance that an earlier, dead run of the results
    database ``store_db`` left behind (created here if needed): its instance tag and
    owner (this database's id, a run that no longer exists, slot 0)."""
    from servesweep.servers.ownership import owner_env
    from servesweep.store import open_store

    with open_store(store_db) as store:
        store_id = store.store_id
    owner = owner_env(store_id, "dead-run-0", 0, str(store_db.resolve()))
    return child_env({procs.TAG_ENV: tag, **owner, **(extra or {})})


def gpu_count() -> int:
    """GPUs NVML sees; 0 without a driver."""
    probe = NvmlProbe()
    try:
        return len(probe.snapshot())
    except NoGpuDriverError:
        return 0
    except GpuProbeError:
        return 0
    finally:
        probe.close()


def require_gpus(n: int) -> list[int]:
    """Skip unless NVML sees at least ``n`` NVIDIA GPUs; their indexes."""
    count = gpu_count()
    if count < n:
        pytest.skip(f"needs {n} NVIDIA GPU(s); NVML sees {count}")
    return list(range(n))


def total_gib(gpu: int = 0) -> float:
    probe = NvmlProbe()
    try:
        return probe.snapshot([gpu])[0].total_bytes / GiB
    finally:
        probe.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def results_dir(name: str, tmp_path: Path) -> Path:
    root = os.environ.get("GPU_TEST_RESULTS")
    path = Path(root) / name if root else tmp_path / "results"
    path.mkdir(parents=True, exist_ok=True)
    return path


def record_summary(name: str, data: Mapping[str, Any]) -> None:
    """One JSON line per test in ``$GPU_TEST_RESULTS/summary.jsonl`` (the docs' numbers)."""
    root = os.environ.get("GPU_TEST_RESULTS")
    line = json.dumps({"test": name, "t": time.time(), **data}, default=str)
    print(f"SUMMARY {line}")
    if root:
        with open(Path(root) / "summary.jsonl", "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


# -- processes --------------------------------------------------------------------------


class ProcessKeeper:
    """Processes a test started, ended by PID (and by their servesweep tag prefix)."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[Any]] = []
        self.pids: set[int] = set()
        self.tag_prefixes: list[str] = []

    def popen(
        self, argv: Sequence[str], log: Path | None = None, **kw: Any
    ) -> subprocess.Popen[Any]:
        out: Any = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        kw.setdefault("env", child_env())
        kw.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, **kw)
        if log:
            out.close()
        self.popens.append(proc)
        return proc

    def cleanup(self) -> list[int]:
        """SIGKILL everything left; the PIDs that had to be killed."""
        killed: list[int] = []
        for proc in self.popens:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            if proc.poll() is None:
                killed.append(proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        for prefix in self.tag_prefixes:
            for pid in procs.tagged(prefix=prefix):
                killed.append(pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for pid in self.pids:
            if not procs.is_gone(pid):
                killed.append(pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        procs.wait_gone(set(killed), 10.0)
        return killed


def wait_for_line(
    path: Path, pattern: str, timeout: float, proc: subprocess.Popen[Any] | None
) -> str:
    """The first line of ``path`` matching ``pattern``; fails when ``proc`` exits first."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        for line in text.splitlines():
            if regex.search(line):
                return line
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"pid {proc.pid} exited ({proc.returncode}); log:\n{text[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern!r} in {path} within {timeout:g}s")


def start_holder(
    keeper: ProcessKeeper,
    log: Path,
    *,
    devices: Sequence[int] = (0,),
    gib: Sequence[float] = (1.0,),
    wait_trigger: bool = False,
) -> subprocess.Popen[Any]:
    """A foreign process holding GPU memory (no servesweep tag)."""
    argv = [
        sys.executable,
        str(SERVER_DIR / "holder.py"),
        "--devices",
        ",".join(map(str, devices)),
        "--gib-per-device",
        ",".join(map(str, gib)),
    ]
    if wait_trigger:
        argv.append("--wait-trigger")
    proc = keeper.popen(argv, log, stdin=subprocess.PIPE if wait_trigger else subprocess.DEVNULL)
    wait_for_line(log, "contexts ready", 120, proc)
    if not wait_trigger:
        wait_for_line(log, "^holding", 120, proc)
    return proc


def trigger_holder(proc: subprocess.Popen[Any], log: Path) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    wait_for_line(log, "^holding", 60, proc)


# -- sweeps ------------------------------------------------------------------------------


def server_command(script: str) -> str:
    """The generic engine's command template for one of our test servers."""
    return f"{sys.executable} {SERVER_DIR / script} --host {{host}} --port {{port}} {{args}}"


def write_sweep(
    path: Path,
    *,
    name: str,
    script: str,
    gpus: Sequence[int],
    args: Mapping[str, Any],
    points: Sequence[Mapping[str, Any]],
    workload: Mapping[str, Any] | None = None,
    release: Mapping[str, Any] | None = None,
    timeouts: Mapping[str, Any] | None = None,
) -> Path:
    """A sweep file of explicit points over one of our test servers on ``gpus``."""
    spec = {
        "name": name,
        "store": str(path.parent / "servesweep.db"),
        "server": {
            "engine": "generic",
            "command": server_command(script),
            "port": free_port(),
            "gpus": list(gpus),
            "gpu_backend": "nvml",
            "env": {**MULTICAST_OFF, "PYTHONUNBUFFERED": "1"},
            "args": dict(args),
            "timeouts": {
                "stop": "30s",
                "kill": "10s",
                "release": "120s",
                "ready": "300s",
                "request": "60s",
                **(timeouts or {}),
            },
            "release": {"tolerance": "1GiB", "settle": "300ms", "foreign_holders": "fail"}
            | dict(release or {}),
            "log_dir": str(path.parent / "runs"),
        },
        "params": {"points": [dict(p) for p in points]},
        "workloads": [
            dict(
                workload
                or {
                    "name": "chat",
                    "dataset": "builtin:chat",
                    "concurrency": [1, 4],
                    "requests": 8,
                    "max_tokens": 32,
                    "ignore_eos": True,
                }
            )
        ],
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


@dataclass
class CliRun:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def servesweep(
    args: Sequence[str],
    out_dir: Path,
    label: str,
    keeper: ProcessKeeper,
    timeout: float = 400.0,
    on_poll: Callable[[], None] | None = None,
) -> CliRun:
    """Run the servesweep CLI (in its own session, ended by the keeper on failure);
    stdout and stderr are saved as ``<label>.out`` / ``<label>.err``. ``on_poll``
    is called every 50 ms while it runs."""
    argv = [sys.executable, "-m", "servesweep.cli.main", *args]
    out_path, err_path = out_dir / f"{label}.out", out_dir / f"{label}.err"
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=err, env=child_env(), start_new_session=True
        )
        keeper.popens.append(proc)
        try:
            deadline = time.monotonic() + timeout
            while proc.poll() is None:
                if on_poll is not None:
                    on_poll()
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(argv, timeout)
                time.sleep(0.05)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(60)
            raise AssertionError(
                f"servesweep {' '.join(args)} ran over {timeout:g}s; see {err_path}"
            ) from None
    return CliRun(
        argv,
        proc.returncode,
        out_path.read_text(errors="replace"),
        err_path.read_text(errors="replace"),
        time.monotonic() - t0,
    )


def run_sweep(
    sweep: Path,
    keeper: ProcessKeeper,
    name: str,
    timeout: float = 400.0,
    on_poll: Callable[[], None] | None = None,
) -> CliRun:
    """``servesweep run SWEEP -q --events events.jsonl`` (events beside the sweep file)."""
    keeper.tag_prefixes.append(f"{name}-")
    events = sweep.parent / "events.jsonl"
    return servesweep(
        ["run", str(sweep), "-q", "--events", str(events)],
        sweep.parent,
        "run",
        keeper,
        timeout,
        on_poll,
    )


def report_json(sweep: Path, keeper: ProcessKeeper) -> dict[str, Any]:
    out = sweep.parent / "report.json"
    run = servesweep(
        ["report", str(sweep), "--format", "json", "--out", str(out)],
        sweep.parent,
        "report",
        keeper,
        120,
    )
    assert run.returncode == 0, run.stderr
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def events(sweep: Path) -> list[dict[str, Any]]:
    path = sweep.parent / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trial_digest(trial: Mapping[str, Any]) -> dict[str, Any]:
    """What the docs need of one trial from the JSON report."""
    failure = trial.get("failure") or {}
    return {
        "id": trial["id"],
        "params": trial["params"],
        "outcome": trial["outcome"],
        "failure_class": trial.get("failure_class"),
        "failure": failure.get("summary"),
        "phase_seconds": trial["phase_seconds"],
        "peak_gpu_memory_gib": _peak_gib(trial.get("peak_gpu_memory_bytes")),
        "worker_load": worker_load_times(trial.get("log_path")),
        "output_throughput": [
            (r["level"], r["metrics"].get("output_throughput")) for r in trial.get("results", [])
        ],
    }


def _peak_gib(peak: Any) -> float | None:
    """The report's peak GPU memory (bytes, or bytes per GPU) as GiB, the largest GPU."""
    if isinstance(peak, dict):
        values = [float(v) for v in peak.values() if isinstance(v, (int, float))]
        return max(values) / GiB if values else None
    return float(peak) / GiB if isinstance(peak, (int, float)) else None


_LOADED = re.compile(r"\[worker (\d+) pid (\d+)\] loaded: (.*)")


def worker_load_times(log_path: str | None) -> dict[str, dict[str, float]]:
    """Each worker's own load breakdown (``loaded: context_s 0.4, ...``) from a server log."""
    if not log_path or not Path(log_path).exists():
        return {}
    out: dict[str, dict[str, float]] = {}
    for line in Path(log_path).read_text(errors="replace").splitlines():
        m = _LOADED.search(line)
        if m:
            pairs = re.findall(r"(\w+_s) ([0-9]+\.[0-9]+)", m.group(3))
            out[m.group(1)] = {k: float(v) for k, v in pairs}
    return out


# -- NVML monitor ------------------------------------------------------------------------


@dataclass
class Sample:
    t: float
    gpu: int
    used: int
    pids: tuple[int, ...]


@dataclass
class GpuMonitor:
    """Polls NVML every ``interval`` seconds in a thread; keeps a sample whenever a
    GPU's used memory or holders change (and every 0.2 s otherwise)."""

    gpus: Sequence[int]
    interval: float = 0.02
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> GpuMonitor:
        self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        probe = NvmlProbe()
        last: dict[int, tuple[int, tuple[int, ...], float]] = {}
        try:
            while not self._stop.is_set():
                now = time.time()
                for s in probe.snapshot(list(self.gpus)):
                    pids = tuple(h.pid for h in s.holders)
                    prev = last.get(s.index)
                    if prev is None or prev[:2] != (s.used_bytes, pids) or now - prev[2] > 0.2:
                        self.samples.append(Sample(now, s.index, s.used_bytes, pids))
                        last[s.index] = (s.used_bytes, pids, now)
                self._stop.wait(self.interval)
        finally:
            probe.close()

    def save(self, path: Path) -> None:
        path.write_text(json.dumps([s.__dict__ for s in self.samples]))

    def released_at(
        self, gpu: int, after: float, limit_bytes: int, before: float | None = None
    ) -> float | None:
        """First time in [``after``, ``before``] when ``gpu`` used at most ``limit_bytes``."""
        for s in self.samples:
            if before is not None and s.t > before:
                break
            if s.gpu == gpu and s.t >= after and s.used <= limit_bytes:
                return s.t
        return None

    def holders_between(self, gpu: int, t0: float, t1: float) -> set[int]:
        return {p for s in self.samples if s.gpu == gpu and t0 <= s.t <= t1 for p in s.pids}

    def max_used(self, gpu: int, t0: float, t1: float) -> int:
        return max((s.used for s in self.samples if s.gpu == gpu and t0 <= s.t <= t1), default=0)


def per_gpu_release(
    report: Mapping[str, Any], monitor: GpuMonitor, tolerance: int = GiB
) -> list[dict[str, Any]]:
    """For each trial after the first: seconds from its ``stop`` phase start until each
    GPU's used memory was back within ``tolerance`` of the sweep's baseline (from the
    NVML monitor), next to servesweep's own stop_s/release_s for that trial."""
    env = report["sweep"]["environment"]
    stored = env.get("baseline_bytes") or {}
    # per machine ({node: {gpu: bytes}}); one machine here
    per_node = next(iter(stored.values()), {}) if stored else {}
    if not isinstance(per_node, Mapping):
        per_node = stored  # written by an older servesweep: {gpu: bytes}
    baseline = {int(k): int(v) for k, v in per_node.items()}
    rows = []
    for trial in report["trials"][1:]:
        stop_at = (trial.get("phase_started") or {}).get("stop")
        if stop_at is None:
            continue
        per_gpu = {}
        for gpu in monitor.gpus:
            at = monitor.released_at(gpu, float(stop_at), baseline.get(gpu, 0) + tolerance)
            per_gpu[str(gpu)] = None if at is None else round(at - float(stop_at), 3)
        rows.append(
            {
                "trial": trial["id"],
                "from_stop_s": per_gpu,
                "servesweep_stop_s": trial["phase_seconds"].get("stop"),
                "servesweep_release_s": trial["phase_seconds"].get("release"),
            }
        )
    return rows
