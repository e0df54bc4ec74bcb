"""What the load generator watches besides the server's answers: the GPUs (through
the GPU probe, sampled in a thread) and itself (event-loop lag)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import Sequence
from time import monotonic_ns
from typing import Any

from servesweep.errors import GpuProbeError
from servesweep.metrics_catalog import GPU_MEM_USED_MAX_MIB, GPU_POWER_MEAN_W, GPU_UTIL_MEAN_PCT
from servesweep.servers.gpu.base import GpuProbe

__all__ = ["GpuSampler", "LoopLagMonitor", "summarize_gpu"]


class GpuSampler:
    """Samples memory used, utilisation and power of ``gpus`` every ``interval_s``
    in a daemon thread, between :meth:`start` and :meth:`stop`."""

    def __init__(self, probe: GpuProbe, gpus: Sequence[int], interval_s: float = 0.2) -> None:
        self._probe = probe
        self._gpus = list(gpus) or None
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples: list[tuple[int, int, float, float | None, float | None]] = []
        """``(monotonic_ns, gpu, used_mib, util_pct, power_w)``."""
        self.errors: list[str] = []

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="servesweep-gpu", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self._interval)

    def sample_once(self) -> None:
        try:
            states = self._probe.snapshot(self._gpus)
        except GpuProbeError as exc:
            if len(self.errors) < 5:
                self.errors.append(str(exc))
            return
        except Exception as exc:  # a probe that broke its contract must not kill the level
            if len(self.errors) < 5:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            return
        now = monotonic_ns()
        for s in states:
            self.samples.append((now, s.index, s.used_bytes / 2**20, s.utilization_pct, s.power_w))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample_once()


def summarize_gpu(
    samples: Sequence[tuple[int, int, float, float | None, float | None]],
) -> tuple[dict[str, float], dict[str, Any]]:
    """Flat metrics (max memory, mean utilisation and power over all GPUs) and
    per-GPU mean/max for ``info``."""
    per: dict[int, dict[str, list[float]]] = {}
    for _, gpu, mem, util, power in samples:
        d = per.setdefault(gpu, {"mem": [], "util": [], "power": []})
        d["mem"].append(mem)
        if util is not None:
            d["util"].append(util)
        if power is not None:
            d["power"].append(power)
    info: dict[str, Any] = {}
    metrics: dict[str, float] = {}
    if not per:
        return metrics, info
    utils: list[float] = []
    powers: list[float] = []
    for gpu, d in sorted(per.items()):
        entry: dict[str, float] = {
            "mem_used_mean_mib": round(sum(d["mem"]) / len(d["mem"]), 1),
            "mem_used_max_mib": round(max(d["mem"]), 1),
        }
        if d["util"]:
            entry["util_mean_pct"] = round(sum(d["util"]) / len(d["util"]), 1)
            entry["util_max_pct"] = round(max(d["util"]), 1)
            utils.append(entry["util_mean_pct"])
        if d["power"]:
            entry["power_mean_w"] = round(sum(d["power"]) / len(d["power"]), 1)
            entry["power_max_w"] = round(max(d["power"]), 1)
            powers.append(entry["power_mean_w"])
        entry["samples"] = len(d["mem"])
        info[str(gpu)] = entry
    metrics[GPU_MEM_USED_MAX_MIB.name] = max(e["mem_used_max_mib"] for e in info.values())
    if utils:
        metrics[GPU_UTIL_MEAN_PCT.name] = sum(utils) / len(utils)
    if powers:
        metrics[GPU_POWER_MEAN_W.name] = sum(powers) / len(powers)
    return metrics, info


class LoopLagMonitor:
    """Measures how late the event loop runs what is due. Every ``interval_s`` the
    ticker queues a callback with ``call_soon`` and records the larger of (a) the
    time until that callback runs and (b) how late the ticker's own sleep ended,
    less 1 ms (epoll rounds timeouts up to whole milliseconds). (a) is the delay a
    chunk that arrives while the loop is busy waits before it is stamped; (b)
    catches stalls of the whole process (descheduled, swapped, a long collection),
    which (a) alone cannot see. Either bounds the generator's own timing error."""

    def __init__(
        self, interval_s: float = 0.005, collect_young_every_s: float | None = None
    ) -> None:
        self._interval = interval_s
        self._collect_every_ns = (
            None if collect_young_every_s is None else int(collect_young_every_s * 1e9)
        )
        self.lags_ns: list[int] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    def _probe(self, queued_ns: int, overslept_ns: int) -> None:
        self.lags_ns.append(max(monotonic_ns() - queued_ns, overslept_ns - 1_000_000))

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        call_soon = loop.call_soon
        probe = self._probe
        sleep = asyncio.sleep
        every = self._collect_every_ns
        next_collect = monotonic_ns() + every if every is not None else None
        interval_ns = int(self._interval * 1e9)
        while True:
            start = monotonic_ns()
            await sleep(self._interval)
            now = monotonic_ns()
            call_soon(probe, now, now - start - interval_ns)
            if next_collect is not None and every is not None and now >= next_collect:
                gc.collect(1)  # young generations only: cheap, bounded by recent garbage
                next_collect = now + every

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
