"""Worker processes of the load generator: when one event loop is not enough,
each worker runs its share of a level (:class:`LevelPlan`) and sends back its raw
samples; the parent merges them. Worker processes are started with ``spawn`` (the
parent runs an event loop, which must not be forked), keep one event loop and one
HTTP session across levels, and are ended by their handle when the run is done."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
from multiprocessing.connection import Connection
from typing import Any

from servesweep.bench.client import make_session
from servesweep.bench.plan import LevelPlan, PlanOutput, run_plan
from servesweep.errors import BenchError

__all__ = ["WorkerPool"]

_START_TIMEOUT_S = 60.0


def _worker_main(conn: Connection, timeout_s: float) -> None:
    asyncio.run(_worker_loop(conn, timeout_s))


async def _worker_loop(conn: Connection, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    async with make_session(timeout_s) as session:
        conn.send("ready")
        while True:
            plan = await loop.run_in_executor(None, conn.recv)
            if plan is None:
                return
            try:
                out: Any = await run_plan(plan, session)
            except Exception as exc:  # the parent turns it into a BenchError
                out = f"{type(exc).__name__}: {exc}"
            conn.send(out)


class WorkerPool:
    """``n`` worker processes; use as ``async with WorkerPool(n, timeout_s) as pool``."""

    def __init__(self, n: int, timeout_s: float) -> None:
        self.n = n
        self._timeout_s = timeout_s
        self._procs: list[mp.process.BaseProcess] = []
        self._conns: list[Connection] = []

    async def __aenter__(self) -> WorkerPool:
        ctx = mp.get_context("spawn")
        for k in range(self.n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker_main,
                args=(child, self._timeout_s),
                name=f"servesweep-bench-{k}",
                daemon=True,
            )
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        try:
            answers = await asyncio.wait_for(
                asyncio.gather(*(self._recv(c) for c in self._conns)), _START_TIMEOUT_S
            )
        except (asyncio.TimeoutError, EOFError, OSError) as exc:
            self.close()
            raise BenchError(f"load generator worker processes did not start: {exc}") from exc
        if any(a != "ready" for a in answers):
            self.close()
            raise BenchError(f"load generator worker processes did not start: {answers}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def started(cls, n: int, timeout_s: float) -> WorkerPool:
        """A pool started now, for callers without an event loop: its processes stay up
        across workloads (and event loops) until :meth:`close`."""
        return asyncio.run(cls(n, timeout_s).__aenter__())

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    @staticmethod
    async def _recv(conn: Connection) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, conn.recv)

    async def run(self, plans: list[LevelPlan | None]) -> list[PlanOutput]:
        """Run one plan per worker (None: that worker sits this level out)."""
        busy = []
        for conn, plan in zip(self._conns, plans, strict=False):
            if plan is not None:
                conn.send(plan)
                busy.append(conn)
        try:
            answers = await asyncio.gather(*(self._recv(c) for c in busy))
        except (EOFError, OSError) as exc:
            raise BenchError(f"a load generator worker process died: {exc}") from exc
        outputs: list[PlanOutput] = []
        for a in answers:
            if not isinstance(a, PlanOutput):
                raise BenchError(f"a load generator worker process failed: {a}")
            outputs.append(a)
        return outputs

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._procs.clear()
        self._conns.clear()
