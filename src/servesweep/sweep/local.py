"""Slots on this machine: one thread per slot, each running a :class:`SlotWorker`.

A :class:`LocalSlot` takes commands (run a trial, tear down, finish) one at a time in
its own thread and tells the driver when it is idle again (``SlotIdle``). Its events
go straight into the driver's queue (``QueueChannel``). ``interrupt`` is called from
the driver's thread: it stops the slot's instance at once and makes the running
command end.

The slot's thread (and the load-generator processes it starts) can be pinned to CPU
cores of their own, so that the load generators of concurrent trials do not compete
for the same cores.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence

from servesweep.errors import Interrupted, ServesweepError
from servesweep.servers.gpu import open_probe
from servesweep.servers.gpu.topology import link_distances
from servesweep.sweep.channel import QueueChannel
from servesweep.sweep.events import Event, SlotIdle
from servesweep.sweep.node import Leftover, NodePrepared, prepare_node
from servesweep.sweep.slot import (
    CurrentInstance,
    GeneratorPools,
    NodeInfo,
    Placement,
    SlotWorker,
    SweepContext,
    TrialOrder,
    pin_current_thread,
    this_node,
)

__all__ = ["LocalExecutor", "LocalSlot"]

Command = Callable[[SlotWorker], None]


class LocalSlot:
    """One slot of this machine, run by a thread (see the module doc)."""

    def __init__(
        self,
        context: SweepContext,
        placement: Placement,
        events: queue.Queue[Event],
        *,
        current: CurrentInstance | None = None,
        baseline: Mapping[int, int] | None = None,
        cpus: Sequence[int] = (),
        generators: GeneratorPools | None = None,
    ) -> None:
        self.placement = placement
        self._generators = generators
        self.error: BaseException | None = None
        """The exception that ended a command (not a trial failure: those are events)."""
        self._events = events
        self._inbox: queue.Queue[Command | None] = queue.Queue()
        self._worker: SlotWorker | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(
            target=self._main,
            args=(context, current, dict(baseline or {}), tuple(cpus)),
            name=f"slot-{placement.slot}",
            daemon=True,
        )
        self._thread.start()

    # -- commands (each ends with a SlotIdle event) -----------------------------------

    def run(self, order: TrialOrder) -> None:
        self._inbox.put(lambda worker: worker.run(order))

    def teardown(self) -> None:
        self._inbox.put(lambda worker: worker.teardown())

    def finish(self, keep_running: bool, restart_units: Sequence[str] = ()) -> None:
        self._inbox.put(lambda worker: worker.finish(keep_running, restart_units))

    def interrupt(self) -> None:
        """From the driver's thread: stop the instance now, end the running command."""
        self._ready.wait(timeout=30)
        if self._worker is not None:
            self._worker.interrupt()

    def restore(self, restart_units: Sequence[str] = ()) -> None:
        """After an interrupt (the slot thread may be gone): give the unit back."""
        if self._worker is not None:
            self._worker.restore(keep_running=False, restart_units=restart_units)

    def close(self, timeout: float = 30.0) -> bool:
        """End the thread after its current command; True when it ended in time
        (``timeout`` 0: do not wait)."""
        self._inbox.put(None)
        if timeout > 0:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the thread -------------------------------------------------------------------

    def _main(
        self,
        context: SweepContext,
        current: CurrentInstance | None,
        baseline: dict[int, int],
        cpus: tuple[int, ...],
    ) -> None:
        pin_current_thread(cpus)
        try:
            self._worker = SlotWorker(
                context,
                self.placement,
                QueueChannel(self._events),
                current=current,
                baseline=baseline,
                generators=self._generators,
            )
        except BaseException as exc:  # reported to the driver, which ends the sweep
            self.error = exc
            self._ready.set()
            self._idle(f"{type(exc).__name__}: {exc}")
            return
        self._ready.set()
        worker = self._worker
        try:
            while True:
                command = self._inbox.get()
                if command is None:
                    return
                error = None
                try:
                    command(worker)
                except Interrupted:
                    pass
                except ServesweepError as exc:
                    self.error, error = exc, str(exc)
                except BaseException as exc:
                    self.error = exc
                    error = "".join(traceback.format_exception(exc)).strip()
                self._idle(error)
        finally:
            worker.close()

    def _idle(self, error: str | None) -> None:
        worker = self._worker
        self._events.put(
            SlotIdle(
                node=self.placement.node,
                node_id=self.placement.node_id,
                slot=self.placement.slot,
                gpus=self.placement.gpus,
                holding=worker is not None and worker.current is not None,
                error=error,
            )
        )


class LocalExecutor:
    """Runs slots in threads of this process, on this machine."""

    def __init__(self, context: SweepContext, events: queue.Queue[Event]) -> None:
        self.context = context
        self.events = events
        self.node = this_node()
        self.generators = GeneratorPools()
        """Load-generator processes by slot number, kept while slots come and go."""

    def nodes(self) -> list[NodeInfo]:
        """This machine, with the sweep's GPU pool."""
        return [NodeInfo(self.node, tuple(self.context.spec.server.gpus))]

    def context_for(self, node: NodeInfo) -> SweepContext:
        return self.context

    def links(self, node: NodeInfo) -> dict[tuple[int, int], int] | None:
        """How the pool's GPUs are linked (None: unknown)."""
        server = self.context.spec.server
        probe = open_probe(server.gpu_backend, self.context.fake_gpu_dir)
        try:
            return link_distances(probe, server.gpus)
        finally:
            probe.close()

    def prepare(
        self,
        node: NodeInfo,
        pool: Placement,
        leftovers: Sequence[Leftover],
        stored: Mapping[int, int] | None,
        service_slots: Sequence[int],
    ) -> NodePrepared:
        return prepare_node(
            self.context,
            pool,
            leftovers,
            stored,
            QueueChannel(self.events),
            service_slots=service_slots,
        )

    def open(
        self,
        placement: Placement,
        *,
        current: CurrentInstance | None,
        baseline: Mapping[int, int],
        cpus: Sequence[int],
    ) -> LocalSlot:
        return LocalSlot(
            self.context,
            placement,
            self.events,
            current=current,
            baseline=baseline,
            cpus=cpus,
            generators=self.generators,
        )

    def close(self) -> None:
        self.generators.close()
