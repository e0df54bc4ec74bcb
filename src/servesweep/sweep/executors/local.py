"""Slots on this machine: one thread per slot, each running a :class:`SlotWorker`.

A :class:`LocalSlot` takes commands (run a trial, tear down, finish) one at a time in
its own thread and tells the driver when it is idle again (``SlotIdle``), as every
slot handle does (``sweep.slots.handle``). Its events
go straight into the driver's queue (``QueueChannel``). ``interrupt`` is called from
the driver's thread: it stops the slot's instance at once and makes the running
command end.

The slot's thread (and the load-generator processes it starts) is pinned to CPU
cores of its own when every slot can have some, so that the load generators of
concurrent trials do not compete for the same cores (``LocalExecutor``).

:class:`LocalSite` is this machine as a run's site (``sweep.executors.site``): its GPUs
checked before anything is created, its ports and GPUs leased, its GPUs described.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from servesweep.servers.gpu import open_probe
from servesweep.servers.gpu.topology import link_distances
from servesweep.spec.load import LoadedSweep
from servesweep.spec.schema import SweepSpec
from servesweep.spec.slots import gpu_need, slot_ports
from servesweep.sweep.events import Event
from servesweep.sweep.executors.fake_gpus import fake_gpu_dir
from servesweep.sweep.slots.channel import QueueChannel, TrialChannel
from servesweep.sweep.slots.data import (
    CurrentInstance,
    NodeInfo,
    Placement,
    SweepContext,
    this_node,
)
from servesweep.sweep.slots.generators import GeneratorPools, pin_current_thread
from servesweep.sweep.slots.handle import CommandInbox, carry_out, error_text, slot_idle
from servesweep.sweep.slots.leases import run_leases
from servesweep.sweep.slots.node import Leftover, NodePrepared, check_slot_ports, prepare_node
from servesweep.sweep.slots.worker import SlotWorker

__all__ = ["LocalExecutor", "LocalSite", "LocalSlot", "prepare_here"]


class LocalSlot(CommandInbox):
    """One slot of this machine, run by a thread (see the module doc); its commands
    (``run``, ``teardown``, ``finish``) wait in its inbox."""

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
        super().__init__()
        self.placement = placement
        self._generators = generators
        self.error: BaseException | None = None
        """The exception that ended a command (not a trial failure: those are events)."""
        self._events = events
        self._worker: SlotWorker | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(
            target=self._main,
            args=(context, current, dict(baseline or {}), tuple(cpus)),
            name=f"slot-{placement.slot}",
            daemon=True,
        )
        self._thread.start()

    # -- besides the commands (each ends with a SlotIdle event) ------------------------

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
        self.end()
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
                command = self.next()
                if command is None:
                    return
                failure = carry_out(worker, command)
                if failure is not None:
                    self.error = failure
                self._idle(None if failure is None else error_text(failure))
        finally:
            worker.close()

    def _idle(self, error: str | None) -> None:
        worker = self._worker
        holding = worker is not None and worker.current is not None
        self._events.put(slot_idle(self.placement, holding=holding, error=error))


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

    def check(self) -> None:
        """A program on the port would fail every trial: say so before anything starts
        (with the subprocess launcher: other launchers may find their own service
        there, and stop it)."""
        spec = self.context.spec
        if spec.server.launcher != "subprocess":
            return
        ports = slot_ports(spec, self.context.slots)
        check_slot_ports(self.context, spec.server.host, ports, first=True)

    def warnings(self) -> list[str]:
        """Concurrent slots whose load generators cannot each have cores of their own."""
        slots = self.context.slots
        if slots < 2 or not hasattr(os, "sched_getaffinity") or self._cpus(0):
            return []
        cores = len(os.sched_getaffinity(0))
        return [
            f"{slots} slots share {cores} CPU core(s): the load generators of concurrent "
            "trials compete for them (each needs a core of its own, plus one for "
            "servesweep); a level measured while the CPU was short says so in its warnings "
            "(event-loop lag) — use fewer --slots or a machine with more cores when they "
            "appear"
        ]

    def prepare(
        self,
        node: NodeInfo,
        pool: Placement,
        leftovers: Sequence[Leftover],
        stored: Mapping[int, int] | None,
        service_slots: Sequence[int],
    ) -> NodePrepared:
        return prepare_here(
            self.context, pool, leftovers, stored, QueueChannel(self.events), service_slots
        )

    def open(
        self,
        placement: Placement,
        *,
        current: CurrentInstance | None,
        baseline: Mapping[int, int],
    ) -> LocalSlot:
        return LocalSlot(
            self.context,
            placement,
            self.events,
            current=current,
            baseline=baseline,
            cpus=self._cpus(placement.slot),
            generators=self.generators,
        )

    def _cpus(self, slot: int) -> tuple[int, ...]:
        """Cores for slot ``slot``'s load generator when every slot can have its own
        (one core is left to the driver); none (no pinning) otherwise."""
        slots = self.context.slots
        if slots < 2 or not hasattr(os, "sched_getaffinity"):
            return ()
        cores = sorted(os.sched_getaffinity(0))
        share = (len(cores) - 1) // slots
        if share < 1:
            return ()
        start = 1 + slot * share
        return tuple(cores[start : start + share])

    def close(self) -> None:
        self.generators.close()


def prepare_here(
    context: SweepContext,
    pool: Placement,
    leftovers: Sequence[Leftover],
    stored: Mapping[int, int] | None,
    channel: TrialChannel,
    service_slots: Sequence[int],
) -> NodePrepared:
    """Make the machine this runs on ready (``node.prepare_node``), once the ports of
    its slots beyond the first are known to be free (ConfigError otherwise; slot 0's
    is checked at each start)."""
    ports = slot_ports(context.spec, len(service_slots))
    check_slot_ports(context, context.spec.server.host, ports)
    return prepare_node(context, pool, leftovers, stored, channel, service_slots=service_slots)


class LocalSite:
    """This machine as a run's site (``sweep.executors.site.Site``)."""

    def __init__(self, loaded: LoadedSweep) -> None:
        self._loaded = loaded

    def check(self) -> list[str]:
        spec = self._loaded.spec
        gpu_need(spec)  # a bad gpus_per_trial is a usage error before anything starts
        # GPUs named that no backend can see: an error before anything is created
        open_probe(
            spec.server.gpu_backend, fake_gpu_dir(self._loaded), gpus=spec.server.gpus
        ).close()
        return []

    def scheduled(self, spec: SweepSpec) -> SweepSpec:
        return spec

    @contextmanager
    def leases(
        self,
        spec: SweepSpec,
        store_path: Path,
        *,
        slots: int,
        wait: bool,
        notify: Callable[[str], None],
    ) -> Iterator[None]:
        fake_dir = fake_gpu_dir(self._loaded)
        with run_leases(
            spec, store_path, slots=slots, fake_gpu_dir=fake_dir, wait=wait, notify=notify
        ):
            yield

    def environment(self, context: SweepContext) -> dict[str, Any]:
        """This machine's GPUs, as their backend describes them."""
        env: dict[str, Any] = {}
        probe = open_probe(context.spec.server.gpu_backend, context.fake_gpu_dir)
        try:
            env["gpu_backend"] = probe.name
            env.update({f"gpu.{k}": v for k, v in probe.describe().items()})
        except Exception as exc:
            env["gpu.error"] = str(exc)
        finally:
            probe.close()
        return env

    def executor(self, context: SweepContext, events: queue.Queue[Event]) -> LocalExecutor:
        return LocalExecutor(context, events)

    def close(self) -> None:
        return None
