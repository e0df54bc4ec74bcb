"""One process's share of one load level, and how it is run (closed or open loop).

A :class:`LevelPlan` is plain picklable data so that a worker process can run it;
:func:`run_plan` runs it on the current event loop with a given session. Each request
joins the plan's :class:`~servesweep.bench.columns.RawColumns` as it completes, so
nothing is left to gather request by request when the level ends.

A level with a deadline (the workload's ``duration``) ends there: no request is
started after it, and the requests still in flight get a grace to finish (twice
the slowest request of the level so far, at least :data:`END_GRACE_MIN_S`); those
still running then are cancelled and recorded as ``timeout``, so a stalled server
cannot hold a level beyond its time.
"""

from __future__ import annotations

import asyncio
import gc
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import monotonic_ns

import aiohttp

from servesweep.bench.client import Cutoff, RawResult, send
from servesweep.bench.columns import RawColumns
from servesweep.bench.telemetry import LoopLagMonitor

__all__ = ["END_GRACE_MIN_S", "LevelPlan", "PlanOutput", "arrival_offsets", "run_plan"]

END_GRACE_MIN_S = 5.0
"""The least time requests in flight at a level's deadline get to finish."""


@dataclass(frozen=True)
class LevelPlan:
    url: str
    headers: dict[str, str] = field(repr=False)
    bodies: Sequence[bytes] = field(repr=False)
    order: Sequence[int] = field(repr=False)
    """Body index for request index ``i`` is ``order[i % len(order)]``."""
    stream: bool
    t0_ns: int
    first_index: int = 0
    stride: int = 1
    count: int | None = None
    """How many requests this process sends (None: until ``deadline_ns``)."""
    deadline_ns: int | None = None
    """No request is started after this moment (absolute monotonic ns)."""
    concurrency: int | None = None
    """Closed loop: requests held in flight."""
    offsets_ns: Sequence[int] | None = None
    """Open loop: planned send times of this process's requests, from ``t0_ns``."""


@dataclass
class PlanOutput:
    raws: RawColumns
    """The requests, gathered into columns as each one completed."""
    loop_lags_ns: list[int]
    full_at_ns: int | None = None
    """Closed loop: when the whole concurrency was first in flight."""
    drain_at_ns: int | None = None
    """Closed loop: when the first slot found no more work."""
    cut_off: int = 0
    """Requests cancelled because they were still in flight after the deadline's grace."""
    grace_s: float | None = None
    """The grace they had (None: nothing was in flight at the deadline)."""


def arrival_offsets(n: int, rate: float, arrival: str, burstiness: float, seed: int) -> list[int]:
    """Planned send times (ns from the level start) of ``n`` requests at ``rate``.

    Intervals are drawn (constant; Poisson: exponential; gamma with shape
    ``burstiness`` and mean ``1/rate``, burstiness 1 is Poisson) and then scaled so
    the ``n`` arrivals span exactly ``n / rate`` seconds: the run's mean rate is the
    requested rate, not a random draw around it."""
    if n <= 0:
        return []
    rng = random.Random(seed)
    if arrival == "constant":
        gaps = [1.0] * n
    elif arrival == "poisson":
        gaps = [rng.expovariate(1.0) for _ in range(n)]
    else:
        gaps = [rng.gammavariate(burstiness, 1.0 / burstiness) for _ in range(n)]
    scale = (n / rate) / sum(gaps)
    out: list[int] = []
    t = 0.0
    for g in gaps:
        t += g * scale
        out.append(int(t * 1e9))
    return out


async def _sleep_until(t_ns: int) -> None:
    delay = t_ns - monotonic_ns()
    if delay > 0:
        await asyncio.sleep(delay * 1e-9)


async def run_plan(plan: LevelPlan, session: aiohttp.ClientSession) -> PlanOutput:
    """Run one plan. Python's full garbage collections (tens of ms with many samples
    on the heap) are held off during the level, so they cannot stamp chunks late:
    the young generations are still collected every second by the loop-lag ticker,
    and a full collection runs after the level."""
    monitor = LoopLagMonitor(collect_young_every_s=1.0)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    monitor.start()
    try:
        if plan.offsets_ns is not None:
            out = await _open_loop(plan, session)
        else:
            out = await _closed_loop(plan, session)
    finally:
        await monitor.stop()
        if gc_was_enabled:
            gc.enable()
    gc.collect()
    out.loop_lags_ns = [x for x in monitor.lags_ns]
    return out


def _grace_s(raws: RawColumns) -> float:
    return max(END_GRACE_MIN_S, 2 * raws.slowest_ok_ns * 1e-9)


async def _finish(
    tasks: Sequence[asyncio.Task[object]],
    deadline_ns: int | None,
    raws: RawColumns,
    cutoff: Cutoff,
    out: PlanOutput,
) -> None:
    """Wait for ``tasks``. After the deadline, the requests still in flight get their
    grace, then are cancelled: :func:`send` records each as a ``timeout``."""
    pending: set[asyncio.Task[object]] = {t for t in tasks if not t.done()}
    if deadline_ns is not None and pending:
        wait_s = max(0.0, (deadline_ns - monotonic_ns()) * 1e-9)
        _, pending = await asyncio.wait(pending, timeout=wait_s)
        if pending:
            out.grace_s = _grace_s(raws)
            _, pending = await asyncio.wait(pending, timeout=out.grace_s)
        if pending:
            cutoff.reason = (
                f"still in flight {out.grace_s:.1f} s after the level's duration ended: cancelled"
            )
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
            out.cut_off = cutoff.count
    elif pending:
        await asyncio.wait(pending)
    for task in tasks:
        if not task.cancelled() and (exc := task.exception()) is not None:
            raise exc


async def _closed_loop(plan: LevelPlan, session: aiohttp.ClientSession) -> PlanOutput:
    raws = RawColumns()
    out = PlanOutput(raws=raws, loop_lags_ns=[])
    concurrency = plan.concurrency or 1
    bodies, order, n_order = plan.bodies, plan.order, len(plan.order)
    url, headers, stream = plan.url, plan.headers, plan.stream
    count, deadline = plan.count, plan.deadline_ns
    state = {"next": 0, "sent": 0}
    cutoff = Cutoff()

    async def slot() -> None:
        await _sleep_until(plan.t0_ns)
        scheduled = plan.t0_ns
        while True:
            j = state["next"]
            if (count is not None and j >= count) or (
                deadline is not None and monotonic_ns() >= deadline
            ):
                if out.drain_at_ns is None:
                    out.drain_at_ns = monotonic_ns()
                return
            state["next"] = j + 1
            i = plan.first_index + plan.stride * j
            state["sent"] += 1
            if state["sent"] == concurrency:
                out.full_at_ns = monotonic_ns()
            r = await send(
                session,
                url,
                bodies[order[i % n_order]],
                headers,
                i,
                stream=stream,
                scheduled_ns=scheduled,
                cutoff=cutoff,
            )
            raws.append(r)
            # the slot is free again now: its next request is due at once
            scheduled = monotonic_ns()

    loop = asyncio.get_running_loop()
    slots = [loop.create_task(slot()) for _ in range(concurrency)]
    await _finish(slots, deadline, raws, cutoff, out)
    return out


async def _open_loop(plan: LevelPlan, session: aiohttp.ClientSession) -> PlanOutput:
    raws = RawColumns()
    out = PlanOutput(raws=raws, loop_lags_ns=[])
    cutoff = Cutoff()
    offsets = plan.offsets_ns or ()
    bodies, order, n_order = plan.bodies, plan.order, len(plan.order)
    tasks: set[asyncio.Task[RawResult]] = set()
    loop = asyncio.get_running_loop()

    def done(task: asyncio.Task[RawResult]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is None:
            raws.append(task.result())

    for j, off in enumerate(offsets):
        planned = plan.t0_ns + off
        if plan.deadline_ns is not None and planned > plan.deadline_ns:
            break
        await _sleep_until(planned)
        i = plan.first_index + plan.stride * j
        task = loop.create_task(
            send(
                session,
                plan.url,
                bodies[order[i % n_order]],
                plan.headers,
                i,
                stream=plan.stream,
                scheduled_ns=planned,
                cutoff=cutoff,
            )
        )
        tasks.add(task)
        task.add_done_callback(done)
    await _finish(list(tasks), plan.deadline_ns, raws, cutoff, out)
    return out
