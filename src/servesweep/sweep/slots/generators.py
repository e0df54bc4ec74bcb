"""Load-generator processes kept per slot number across the trials of a run."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from servesweep.bench.workers import WorkerPool

__all__ = ["GeneratorPools", "pin_current_thread"]


class GeneratorPools:
    """Load-generator processes by slot number, started once and kept across the
    slots that take that number (a slot's thread, pinned to its cores, starts them)."""

    def __init__(self) -> None:
        self._pools: dict[int, WorkerPool] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, slot: int, n: int, timeout_s: float) -> WorkerPool:
        """The slot number's ``n`` generator processes, started when missing (a second
        caller for the same slot waits for the first one's)."""
        with self._lock:
            slot_lock = self._locks.setdefault(slot, threading.Lock())
        with slot_lock:
            pool = self._pools.get(slot)
            if pool is not None and (pool.n != n or not pool.alive):
                pool.close()
                pool = None
            if pool is None:
                pool = WorkerPool.started(n, timeout_s)
                with self._lock:
                    self._pools[slot] = pool
            return pool

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


def pin_current_thread(cpus: Sequence[int]) -> None:
    """Keep the calling thread (and the processes it starts, such as load-generator
    workers) on ``cpus`` (Linux: the affinity of one thread)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cpus))
