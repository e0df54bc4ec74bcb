"""The fake GPUs' on-disk protocol (documented in docs/fake-gpus.md).

A directory holds ``gpus.json`` (the GPUs), ``.lock`` (``fcntl.flock`` for
allocations) and ``holders/`` (one JSON file per holding process). Memory of a
process counts as used while the process lives, and until its exit time plus its
release delay afterwards, like a driver tearing a CUDA context down. The exit time
is ``exited_at`` when the holder wrote it (graceful exit), else the file's mtime:
a live holder refreshes it every ~20 ms, so a SIGKILLed holder's exit time is its
last heartbeat.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from servesweep.fakegpu.procinfo import host_pid, own_pid_ns, own_start_time, read_stat
from servesweep.fakegpu.units import format_bytes

__all__ = [
    "HEARTBEAT_S",
    "FakeGpu",
    "FakeGpuDir",
    "FakeGpuError",
    "FakeOutOfMemory",
    "GpuUsage",
    "Holder",
    "Holding",
]

SCHEMA_VERSION = 1
GPUS_FILE = "gpus.json"
LOCK_FILE = ".lock"
HOLDERS_DIR = "holders"
HEARTBEAT_S = 0.02


class FakeGpuError(Exception):
    """The fake GPU directory is missing or invalid, or a request names no GPU."""


class FakeOutOfMemory(FakeGpuError):
    """An allocation does not fit: the simulated CUDA out-of-memory error."""

    def __init__(self, gpu: int, requested: int, total: int, free: int, pid: int) -> None:
        self.gpu = gpu
        self.requested = requested
        self.total = total
        self.free = free
        self.pid = pid
        super().__init__(self.torch_message())

    def torch_message(self) -> str:
        """The line PyTorch prints, so log matchers written for real engines apply."""
        return (
            f"CUDA out of memory. Tried to allocate {format_bytes(self.requested)}. "
            f"GPU {self.gpu} has a total capacity of {format_bytes(self.total)} of which "
            f"{format_bytes(max(self.free, 0))} is free. Process {self.pid} has 0 bytes "
            "memory in use. Of the allocated memory 0 bytes is allocated by PyTorch, and "
            "0 bytes is reserved by PyTorch but unallocated."
        )


@dataclass(frozen=True)
class FakeGpu:
    index: int
    name: str
    total_bytes: int
    reserved_bytes: int = 0
    """Used even with no holder (driver, display): the baseline."""
    idle_power_w: float = 75.0
    max_power_w: float = 700.0


@dataclass(frozen=True)
class Holding:
    """One holder file as read at ``now``."""

    path: str
    pid: int
    start_time: int | None
    memory: Mapping[int, int]
    release_delay_s: float
    exited_at: float | None
    heartbeat_at: float
    alive: bool
    name: str = ""
    truth: str | None = None
    utilization_pct: float = 0.0
    release_logged: bool = False

    @property
    def exit_time(self) -> float | None:
        """When the holder exited (None while alive)."""
        if self.alive:
            return None
        return self.exited_at if self.exited_at is not None else self.heartbeat_at

    @property
    def release_at(self) -> float:
        """When its memory disappears from the GPUs (``inf`` while alive)."""
        exit_time = self.exit_time
        return math.inf if exit_time is None else exit_time + self.release_delay_s

    def holds_at(self, now: float) -> bool:
        return now < self.release_at


@dataclass(frozen=True)
class GpuUsage:
    gpu: FakeGpu
    used_bytes: int
    holders: tuple[Holding, ...] = field(default=())
    """Live processes with memory on this GPU (exited ones are not listed, like NVML)."""
    utilization_pct: float = 0.0

    @property
    def free_bytes(self) -> int:
        return self.gpu.total_bytes - self.used_bytes

    @property
    def power_w(self) -> float:
        g = self.gpu
        return g.idle_power_w + (g.max_power_w - g.idle_power_w) * self.utilization_pct / 100.0


def _write_json_atomic(path: str, data: Mapping[str, Any]) -> None:
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def append_truth(path: str | None, event: str, **fields: Any) -> None:
    """Append one ground-truth JSON line (``O_APPEND``: whole lines, several writers)."""
    if not path:
        return
    record = {"event": event, "t": fields.pop("t", None) or time.time(), "pid": os.getpid()}
    record.update(fields)
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class FakeGpuDir:
    """A directory of fake GPUs. Cheap to construct; every call reads the files."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.holders_path = os.path.join(self.path, HOLDERS_DIR)

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        count: int,
        memory_bytes: int,
        *,
        name: str = "NVIDIA H200 (fake)",
        reserved_bytes: int = 0,
    ) -> FakeGpuDir:
        """Create (or reset the GPU list of) a fake GPU directory. Holders are kept."""
        if count < 1 or memory_bytes <= 0 or reserved_bytes < 0 or reserved_bytes >= memory_bytes:
            raise FakeGpuError("need count >= 1, memory > 0 and 0 <= reserved < memory")
        d = cls(path)
        os.makedirs(d.holders_path, exist_ok=True)
        gpus = [
            {
                "index": i,
                "name": name,
                "total_bytes": memory_bytes,
                "reserved_bytes": reserved_bytes,
            }
            for i in range(count)
        ]
        _write_json_atomic(
            os.path.join(d.path, GPUS_FILE),
            {"version": SCHEMA_VERSION, "gpus": gpus, "heartbeat_s": HEARTBEAT_S},
        )
        return d

    # -- reading -------------------------------------------------------------

    def gpus(self) -> list[FakeGpu]:
        file = os.path.join(self.path, GPUS_FILE)
        try:
            with open(file, encoding="utf-8") as f:
                data = json.load(f)
            return [
                FakeGpu(
                    index=int(g["index"]),
                    name=str(g.get("name", "fake GPU")),
                    total_bytes=int(g["total_bytes"]),
                    reserved_bytes=int(g.get("reserved_bytes", 0)),
                    idle_power_w=float(g.get("idle_power_w", 75.0)),
                    max_power_w=float(g.get("max_power_w", 700.0)),
                )
                for g in data["gpus"]
            ]
        except FileNotFoundError as exc:
            raise FakeGpuError(
                f"{file} does not exist: create the fake GPUs with "
                f"`servesweep fake-gpus init {self.path} --count N --memory SIZE`"
            ) from exc
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise FakeGpuError(f"{file} is not a valid fake GPU list: {exc}") from exc

    def _holder_files(self) -> list[str]:
        try:
            names = os.listdir(self.holders_path)
        except FileNotFoundError:
            return []
        return [os.path.join(self.holders_path, n) for n in names if n.endswith(".json")]

    @staticmethod
    def read_holding(path: str) -> Holding | None:
        """One holder file evaluated now; None if it vanished or is unreadable."""
        try:
            with open(path, encoding="utf-8") as f:
                st = os.fstat(f.fileno())
                data = json.load(f)
            pid = int(data["pid"])
            start_time = data.get("start_time")
            memory = {int(k): int(v) for k, v in data.get("memory", {}).items()}
        except (OSError, ValueError, KeyError, TypeError):
            return None
        exited_at = data.get("exited_at")
        pid_ns = str(data.get("pid_ns") or "")
        unseen = False
        if pid_ns:
            # a holder in another PID namespace (a container): its PID as we see it;
            # none when it has exited (or its namespace is not below ours)
            seen = host_pid(pid_ns, pid, None if start_time is None else int(start_time))
            unseen = seen is None
            pid = pid if seen is None else seen
        alive = False
        if exited_at is None and not unseen:
            stat = read_stat(pid)
            alive = (
                stat is not None
                and not stat.exited
                and (start_time is None or int(start_time) == stat.start_time)
            )
        return Holding(
            path=path,
            pid=pid,
            start_time=None if start_time is None else int(start_time),
            memory=memory,
            release_delay_s=float(data.get("release_delay_s", 0.0)),
            exited_at=None if exited_at is None else float(exited_at),
            heartbeat_at=st.st_mtime,
            alive=alive,
            name=str(data.get("name", "")),
            truth=data.get("truth"),
            utilization_pct=float(data.get("utilization_pct", 0.0)),
            release_logged=bool(data.get("release_logged", False)),
        )

    def holdings(self) -> list[Holding]:
        """Every holder file, evaluated now (including expired ones not yet collected)."""
        found = (self.read_holding(p) for p in self._holder_files())
        return sorted((h for h in found if h is not None), key=lambda h: h.pid)

    def usage(
        self, now: float | None = None, holdings: list[Holding] | None = None
    ) -> list[GpuUsage]:
        """Per-GPU used memory (reserved + every holding still held), live holders.

        ``holdings``: as returned by :meth:`holdings` (read now when None).
        """
        if holdings is None:
            holdings = self.holdings()
        t = time.time() if now is None else now
        result = []
        for gpu in self.gpus():
            used = gpu.reserved_bytes
            live: list[Holding] = []
            util = 0.0
            for h in holdings:
                amount = h.memory.get(gpu.index, 0)
                if amount and h.holds_at(t):
                    used += amount
                    if h.alive:
                        live.append(h)
                        util += h.utilization_pct
            result.append(GpuUsage(gpu, used, tuple(live), min(util, 100.0)))
        return result

    # -- writing -------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive ``fcntl.flock`` on ``DIR/.lock``: allocation and collection."""
        fd = os.open(os.path.join(self.path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def allocate(
        self,
        memory: Mapping[int, int],
        *,
        release_delay_s: float = 0.0,
        truth: str | None = None,
        name: str = "",
    ) -> Holder:
        """Hold ``memory`` (GPU index -> bytes) for this process, atomically.

        Raises :class:`FakeOutOfMemory` when it does not fit on a GPU (memory of
        exited processes within their release delay counts as used).
        """
        gpus = {g.index: g for g in self.gpus()}
        pid = os.getpid()
        with self.locked():
            self._collect_locked(time.time())
            usage = {u.gpu.index: u for u in self.usage()}
            for index, amount in sorted(memory.items()):
                if index not in gpus:
                    raise FakeGpuError(
                        f"CUDA error: invalid device ordinal (GPU {index}; "
                        f"{self.path} has GPUs {sorted(gpus)})"
                    )
                u = usage[index]
                if amount > u.free_bytes:
                    raise FakeOutOfMemory(index, amount, u.gpu.total_bytes, u.free_bytes, pid)
            holder = Holder(
                path=os.path.join(self.holders_path, f"{pid}.{own_start_time()}.json"),
                memory=dict(memory),
                release_delay_s=release_delay_s,
                truth=truth,
                name=name,
            )
            holder.write()
        return holder

    def collect(self) -> int:
        """Remove holder files whose memory is released; returns how many."""
        with self.locked():
            return self._collect_locked(time.time())

    def _collect_locked(self, now: float) -> int:
        removed = 0
        for h in self.holdings():
            if h.holds_at(now):
                continue
            if h.truth and not h.release_logged:
                if h.exited_at is None:
                    append_truth(h.truth, "exit", t=h.exit_time, pid=h.pid, inferred=True)
                append_truth(h.truth, "memory_released", t=h.release_at, pid=h.pid)
            with contextlib.suppress(FileNotFoundError):
                os.remove(h.path)
            removed += 1
        return removed


class Holder:
    """This process's holding: heartbeat while alive, ``release()`` on graceful exit."""

    def __init__(
        self,
        path: str,
        memory: Mapping[int, int],
        release_delay_s: float,
        truth: str | None,
        name: str,
    ) -> None:
        self.path = path
        self.pid = os.getpid()
        self.memory = dict(memory)
        self.release_delay_s = release_delay_s
        self.truth = truth
        self.name = name
        self.utilization_pct = 0.0
        self.exited_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _data(self, release_logged: bool = False) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "start_time": own_start_time(),
            "pid_ns": own_pid_ns(),
            "memory": {str(k): v for k, v in self.memory.items()},
            "release_delay_s": self.release_delay_s,
            "exited_at": self.exited_at,
            "name": self.name,
            "truth": self.truth,
            "utilization_pct": self.utilization_pct,
            "release_logged": release_logged,
        }

    def write(self) -> None:
        with self._lock:
            _write_json_atomic(self.path, self._data())

    def heartbeat(self) -> None:
        with self._lock, contextlib.suppress(FileNotFoundError):
            os.utime(self.path)

    def start_heartbeat(self, interval_s: float = HEARTBEAT_S) -> None:
        """Refresh the file's mtime every ``interval_s`` from a daemon thread."""

        def run() -> None:
            while not self._stop.wait(interval_s):
                self.heartbeat()

        self._thread = threading.Thread(target=run, name="fakegpu-heartbeat", daemon=True)
        self._thread.start()

    def set_utilization(self, pct: float) -> None:
        if pct != self.utilization_pct and self.exited_at is None:
            self.utilization_pct = pct
            self.write()

    def release(self, log_truth: bool = True) -> float:
        """Mark the holding exited now; returns when the fake GPUs free the memory.

        With ``log_truth``, appends the ``memory_released`` truth line now (its ``t``
        is the future release time) so nobody has to collect the file to learn it.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.exited_at = time.time()
        with self._lock:
            _write_json_atomic(self.path, self._data(release_logged=log_truth and bool(self.truth)))
        release_at = self.exited_at + self.release_delay_s
        if log_truth:
            append_truth(self.truth, "memory_released", t=release_at)
        return release_at
