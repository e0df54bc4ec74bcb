"""The conformance suite every GPU probe backend passes (NVML, fake, yours).

Pure functions that raise ``AssertionError``; the tests in
``tests/integration/test_gpu_conformance.py`` (fake GPUs) and
``tests/gpu/test_gpu_nvml_conformance.py`` (real GPUs) run them. A check that
needs a process holding memory gets a :class:`MemoryHolder`: the fake GPUs'
``hold`` command, or a tiny CUDA driver program on real GPUs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from servesweep.errors import GpuProbeError
from servesweep.models import GpuState
from servesweep.servers.gpu.base import GpuProbe

__all__ = [
    "CUDA_HOLDER_SOURCE",
    "MemoryHolder",
    "check_describe",
    "check_holder_lifecycle",
    "check_invalid_index",
    "check_poll_cost",
    "check_snapshot",
    "check_subset",
    "cuda_holder",
    "fake_holder",
]

CUDA_HOLDER_SOURCE = r"""
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    if rc != 0:
        print(f"fail {what} {rc}", flush=True); sys.exit(1)
gpu, size = int(sys.argv[1]), int(sys.argv[2])
ok(cuda.cuInit(0), "cuInit")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
ok(cuda.cuDeviceGet(ctypes.byref(dev), gpu), "cuDeviceGet")
ok(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)), "cuMemAlloc")
print("ok", flush=True)
while True:
    time.sleep(1)
"""


@dataclass(frozen=True)
class MemoryHolder:
    """A live process holding ``used_bytes`` on GPU ``gpu``."""

    pid: int
    gpu: int
    used_bytes: int
    release_delay_s: float = 0.0


@contextlib.contextmanager
def _holding_process(argv: list[str], env: dict[str, str] | None = None) -> Iterator[int]:
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode(errors="replace").strip()
        assert line.startswith(("ok", "holding")), f"holder {argv[:4]} failed: {line!r}"
        yield proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def fake_holder(
    fake_dir: str, gpu: int, used_bytes: int, release_delay_s: float = 0.0
) -> Iterator[MemoryHolder]:
    """A ``python -m servesweep.fakegpu hold`` process, SIGKILLed on exit."""
    argv = [sys.executable, "-m", "servesweep.fakegpu", "hold", fake_dir]
    argv += ["--gpus", str(gpu), "--mem", str(used_bytes)]
    argv += ["--release-delay", str(release_delay_s)]
    with _holding_process(argv) as pid:
        yield MemoryHolder(pid, gpu, used_bytes, release_delay_s)


@contextlib.contextmanager
def cuda_holder(gpu: int, used_bytes: int) -> Iterator[MemoryHolder]:
    """A process that allocates ``used_bytes`` with the CUDA driver API (ctypes)."""
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    argv = [sys.executable, "-c", CUDA_HOLDER_SOURCE, str(gpu), str(used_bytes)]
    with _holding_process(argv, env) as pid:
        yield MemoryHolder(pid, gpu, used_bytes)


def check_snapshot(probe: GpuProbe) -> list[GpuState]:
    """A full snapshot is well formed; returns it."""
    assert isinstance(probe, GpuProbe), f"{probe!r} does not implement GpuProbe"
    assert probe.name in ("nvml", "fake", "none"), probe.name
    states = probe.snapshot()
    assert isinstance(states, list)
    indexes = [s.index for s in states]
    assert indexes == sorted(set(indexes)), f"GPU indexes not sorted/unique: {indexes}"
    for s in states:
        assert isinstance(s, GpuState)
        assert s.total_bytes > 0, s
        assert 0 <= s.used_bytes <= s.total_bytes, s
        assert s.name, s
        for h in s.holders:
            assert h.pid > 0 and h.used_bytes >= 0, h
        assert s.utilization_pct is None or 0.0 <= s.utilization_pct <= 100.0, s
        assert s.power_w is None or s.power_w >= 0.0, s
    return states


def check_subset(probe: GpuProbe) -> None:
    """``snapshot([i])`` answers for GPU i only; ``snapshot([])`` for none."""
    states = probe.snapshot()
    assert probe.snapshot([]) == []
    for s in states[-2:]:
        (only,) = probe.snapshot([s.index])
        assert only.index == s.index and only.total_bytes == s.total_bytes


def check_invalid_index(probe: GpuProbe) -> None:
    """A GPU that does not exist is a ``GpuProbeError`` naming it."""
    bad = len(probe.snapshot()) + 100
    try:
        probe.snapshot([bad])
    except GpuProbeError as exc:
        assert str(bad) in str(exc), str(exc)
    else:
        raise AssertionError(f"snapshot([{bad}]) did not raise GpuProbeError")


def check_describe(probe: GpuProbe) -> None:
    facts = probe.describe()
    assert facts.get("backend") == probe.name, facts
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in facts.items()), facts
    if probe.name != "none":
        assert facts.get("driver_version"), facts
        assert int(facts.get("gpu_count", "0")) == len(probe.snapshot()), facts


def check_poll_cost(probe: GpuProbe, max_ms: float = 10.0, polls: int = 50) -> float:
    """Mean milliseconds per full snapshot stays under ``max_ms``; returns it."""
    probe.snapshot()
    start = time.perf_counter()
    for _ in range(polls):
        probe.snapshot()
    mean_ms = (time.perf_counter() - start) * 1000.0 / polls
    assert mean_ms < max_ms, f"snapshot costs {mean_ms:.2f} ms (limit {max_ms} ms)"
    return mean_ms


def _wait_for(what: str, timeout_s: float, test: Callable[[], bool]) -> float:
    start = time.monotonic()
    while True:
        if test():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.005)


def check_holder_lifecycle(
    probe: GpuProbe,
    hold: contextlib.AbstractContextManager[MemoryHolder],
    settle_s: float = 10.0,
) -> None:
    """A holding process is listed with its memory; after SIGKILL it disappears and
    used memory goes back to the baseline (after the release delay, not before)."""
    with hold as holder:

        def listed() -> bool:
            (s,) = probe.snapshot([holder.gpu])
            return any(h.pid == holder.pid for h in s.holders)

        _wait_for(f"pid {holder.pid} listed on GPU {holder.gpu}", settle_s, listed)
        (s,) = probe.snapshot([holder.gpu])
        (h,) = [h for h in s.holders if h.pid == holder.pid]
        assert h.used_bytes >= holder.used_bytes, f"{h} holds less than {holder.used_bytes}"
        assert s.used_bytes >= holder.used_bytes, s
        held_used = s.used_bytes
        os.kill(holder.pid, signal.SIGKILL)
        killed_at = time.monotonic()

        def gone() -> bool:
            (s,) = probe.snapshot([holder.gpu])
            return all(h.pid != holder.pid for h in s.holders)

        _wait_for(f"pid {holder.pid} to disappear", settle_s, gone)

        def released() -> bool:
            (s,) = probe.snapshot([holder.gpu])
            return s.used_bytes <= held_used - holder.used_bytes

        _wait_for(f"GPU {holder.gpu} memory of pid {holder.pid} released", settle_s, released)
        took = time.monotonic() - killed_at
        # The last heartbeat (every 20 ms, later on a loaded machine) is the exit time
        # of a killed holder, so the release may come a little before kill + delay.
        assert took >= holder.release_delay_s - min(0.2, holder.release_delay_s / 2), (
            f"released after {took:.3f} s, before the {holder.release_delay_s} s release delay"
        )
