"""One slot on a Ray node: an actor there (:class:`SlotActor`) and its handle in the
driver (:class:`RaySlot`).

The actor is pinned to its node and asks Ray for the slot's GPUs (``num_gpus``);
the GPU indexes Ray assigns become the slot's, so the records show what Ray gave.
Inside, a ``SlotWorker`` runs commands (a trial, a teardown, the finish) and sends
its events into a buffer. Each command is one streaming call that yields the
buffered events while the work runs and ends with a :class:`Done`; the handle's
thread puts them into the driver's queue and then ``SlotIdle``, exactly like a
local slot. The actor serves several calls at once, so ``interrupt`` reaches it
while a command runs.

When Ray reports the actor or its node dead, the handle reports ``NodeLost`` and
ends the trial it ran ``node_lost`` with what Ray said; when only the actor died
and its node lives, the instance it had started there is stopped by a task on
that node.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from servesweep.bench.target import Target
from servesweep.errors import BenchError, Interrupted, ServesweepError
from servesweep.models import FailureClass, InstanceRecord, LevelResult, Outcome
from servesweep.spec.schema import WorkloadSpec
from servesweep.sweep.cluster import BufferChannel, RemoteFailure, lost_evidence, short_error
from servesweep.sweep.events import (
    Event,
    InstanceGone,
    InstanceStarted,
    NodeLost,
    SlotIdle,
    SweepWarning,
    TrialFinished,
)
from servesweep.sweep.slot import (
    CurrentInstance,
    NodeInfo,
    Placement,
    SlotWorker,
    SweepContext,
    TrialOrder,
)

__all__ = ["Done", "LoadFrom", "RaySlot", "SlotActor", "on_node"]

_TAKE_S = 0.5
_CALL_TIMEOUT_S = 60.0
_VERDICT_TIMEOUT_S = 120.0
"""How long to wait for Ray to tell whether an actor it cannot reach is dead."""


def on_node(node_id: str) -> NodeAffinitySchedulingStrategy:
    """Run there or nowhere."""
    return NodeAffinitySchedulingStrategy(node_id, soft=False)


# -- commands and answers (plain data: they travel) ------------------------------------


@dataclass(frozen=True)
class _Run:
    order: TrialOrder

    def apply(self, worker: SlotWorker) -> None:
        worker.run(self.order)


@dataclass(frozen=True)
class _Teardown:
    def apply(self, worker: SlotWorker) -> None:
        worker.teardown()


@dataclass(frozen=True)
class _Finish:
    keep_running: bool
    restart_units: tuple[str, ...]

    def apply(self, worker: SlotWorker) -> None:
        worker.finish(self.keep_running, self.restart_units)


_Command = _Run | _Teardown | _Finish


@dataclass(frozen=True)
class Done:
    """The end of a command's stream."""

    failure: RemoteFailure | None = None
    holding: bool = False


@dataclass(frozen=True)
class _Started:
    gpus: tuple[int, ...]
    failure: RemoteFailure | None = None


@dataclass(frozen=True)
class LoadFrom:
    """``executor.bench_from: driver``: where the load generator runs instead."""

    node_id: str
    name: str
    node_ip: str
    """The address of the slot's node, for a server listening on every interface."""


# -- on the node ------------------------------------------------------------------------


class SlotActor:
    """The slot's side on its node (see the module doc); a Ray actor."""

    def __init__(
        self,
        context: SweepContext,
        placement: Placement,
        current: CurrentInstance | None,
        baseline: Mapping[int, int],
        load_from: LoadFrom | None,
    ) -> None:
        self._context = context
        self._placement = placement
        self._current = current
        self._baseline = dict(baseline)
        self._load_from = load_from
        self._channel = BufferChannel()
        self._worker: SlotWorker | None = None

    def start(self) -> _Started:
        """Take the GPUs Ray assigned and make the slot's worker."""
        here = ray.get_runtime_context().get_node_id()
        if here != self._placement.node_id:
            message = f"placed on node {here}, not on {self._placement.node_id}"
            return _Started((), RemoteFailure(message))
        gpus = tuple(sorted(int(g) for g in ray.get_gpu_ids()))
        placement = replace(self._placement, gpus=gpus)
        try:
            current = self._current
            if current is not None and tuple(current.instance.gpus) != gpus:
                # Ray gave the slot other GPUs than the instance to adopt holds
                self._stop_elsewhere(current)
                current = None
            self._worker = SlotWorker(
                self._context,
                placement,
                self._channel,
                current=current,
                baseline={g: self._baseline[g] for g in gpus if g in self._baseline},
                load=self._load_remote if self._load_from else None,
            )
        except BaseException as exc:
            return _Started(gpus, RemoteFailure.of(exc))
        return _Started(gpus)

    def _stop_elsewhere(self, current: CurrentInstance) -> None:
        where = replace(self._placement, gpus=tuple(current.instance.gpus))
        worker = SlotWorker(self._context, where, self._channel, current=current)
        try:
            worker.warn(
                f"the instance of trial {current.trial} runs on GPUs other than those Ray "
                "gave its slot: stopping it instead of adopting it"
            )
            worker.teardown()
        finally:
            worker.close()

    def command(self, command: _Command) -> Iterator[list[Event] | Done]:
        """Run ``command``, yielding its events as they come, then :class:`Done`."""
        worker = self._worker
        assert worker is not None
        failure: list[RemoteFailure] = []
        done = threading.Event()

        def work() -> None:
            try:
                command.apply(worker)
            except Interrupted:
                pass
            except BaseException as exc:
                failure.append(RemoteFailure.of(exc))
            finally:
                done.set()
                self._channel.wake()

        threading.Thread(target=work, name="slot-command", daemon=True).start()
        while not done.is_set():
            events = self._channel.take(_TAKE_S)
            if events:
                yield events
        rest = self._channel.take(0)
        if rest:
            yield rest
        yield Done(failure[0] if failure else None, holding=worker.current is not None)

    def interrupt(self) -> None:
        if self._worker is not None:
            self._worker.interrupt()

    def restore(self, restart_units: tuple[str, ...]) -> list[Event]:
        if self._worker is not None:
            self._worker.restore(keep_running=False, restart_units=restart_units)
        return self._channel.take(0)

    def take(self) -> list[Event]:
        """Events no command has streamed yet (an interrupt's, between commands)."""
        return self._channel.take(0)

    def close(self) -> list[Event]:
        """The slot is done: its worker lets go of its probe, telemetry and load
        generators; returns the events no command streamed."""
        if self._worker is not None:
            self._worker.close()
        return self._channel.take(0)

    def ping(self) -> bool:
        return True

    def _load_remote(
        self,
        target: Target,
        workload: WorkloadSpec,
        progress: Callable[[str], None],
        after_level: Callable[[LevelResult], bool],
    ) -> list[LevelResult]:
        """The workload from the driver's node. Its levels run there in one go; the
        decision to go on after each level (pruning) is taken as the results come back,
        and the levels after a stop are not kept (as if they had not run)."""
        load = self._load_from
        assert load is not None
        host = target.base_url.split("//", 1)[-1].rsplit(":", 1)[0]
        if host in ("0.0.0.0", "[::]", "::", ""):
            port = target.base_url.rsplit(":", 1)[-1]
            target = replace(target, base_url=f"http://{load.node_ip}:{port}")
        progress(f"load generator on the driver's node {load.name}")
        task = _load_on_node.options(scheduling_strategy=on_node(load.node_id))
        answer = ray.get(task.remote(target, workload, self._context.base_dir))
        if isinstance(answer, RemoteFailure):
            raise answer.error()
        results, ran_on = answer
        where = {"load_generator": f"driver node {load.name}", "load_node_id": ran_on}
        kept = []
        for result in results:
            kept.append(replace(result, info={**result.info, **where}))
            if not after_level(kept[-1]):
                break
        return kept


@ray.remote(num_cpus=0)
def _load_on_node(
    target: Target, workload: WorkloadSpec, base_dir: str | None
) -> tuple[list[LevelResult], str] | RemoteFailure:
    """The load generator on another node (``executor.bench_from: driver``): the
    results, and the node they were measured from."""
    from servesweep.bench.load import run_workload_sync

    try:
        results = run_workload_sync(target, workload, workers=workload.workers, base_dir=base_dir)
    except BenchError as exc:
        return RemoteFailure.of(exc)
    return results, ray.get_runtime_context().get_node_id()


# -- in the driver ------------------------------------------------------------------------


class SlotHost(Protocol):
    """What a slot's handle asks of its executor."""

    def node_alive(self, node_id: str) -> bool: ...

    def stop_orphan(
        self, placement: Placement, trial: int, instance: InstanceRecord
    ) -> list[Event]: ...


class RaySlot:
    """A slot on a Ray node, as the driver drives it (``SlotHandle``)."""

    def __init__(
        self,
        host: SlotHost,
        node: NodeInfo,
        placement: Placement,
        actor: ActorHandle[Any],
        events: queue.Queue[Event],
    ) -> None:
        self.placement = placement
        self.error: BaseException | None = None
        self._host = host
        self._node = node
        self._actor = actor
        self._events = events
        self._inbox: queue.Queue[tuple[_Command, int | None] | None] = queue.Queue()
        self._started = False
        self._lost = False
        self._interrupted = False
        self._killed = False
        self._holding = False
        self._instance: tuple[int, InstanceRecord] | None = None
        """The instance the slot runs (trial, record), as its events tell."""
        self._lost_dead = False
        self._lost_message = ""
        self._closed = False
        self._thread = threading.Thread(
            target=self._main, name=f"ray-slot-{node.name}-{placement.slot}", daemon=True
        )
        self._thread.start()

    # -- commands (each ends with a SlotIdle event) -------------------------------------

    def run(self, order: TrialOrder) -> None:
        self._inbox.put((_Run(order), order.trial))

    def teardown(self) -> None:
        self._inbox.put((_Teardown(), None))

    def finish(self, keep_running: bool, restart_units: Sequence[str] = ()) -> None:
        self._inbox.put((_Finish(keep_running, tuple(restart_units)), None))

    def interrupt(self) -> None:
        """Stop the slot's instance now (the running command ends)."""
        self._interrupted = True
        if self._lost or not self._started:
            return
        try:
            ray.get(self._actor.interrupt.remote(), timeout=_CALL_TIMEOUT_S)
        except RayError:
            return

    def restore(self, restart_units: Sequence[str] = ()) -> None:
        """After an interrupt: give a unit back, then end the actor."""
        try:
            if self._started and not self._lost:
                events = ray.get(
                    self._actor.restore.remote(tuple(restart_units)), timeout=_CALL_TIMEOUT_S
                )
                self._put(events)
                self._put(ray.get(self._actor.close.remote(), timeout=_CALL_TIMEOUT_S))
        except RayError:
            pass
        finally:
            self.kill()

    def close(self, timeout: float = 30.0) -> bool:
        """End the slot after its command: its thread closes the actor's worker and ends
        the actor (Ray takes its GPUs back) — after an interrupt, only once ``restore``
        ran. True when that is done within ``timeout`` (it goes on in the background)."""
        if not self._closed:
            self._closed = True
            self._inbox.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def kill(self) -> None:
        """End the actor (Ray gives its GPUs back)."""
        if not self._killed:
            self._killed = True
            with contextlib.suppress(RayError, ValueError):
                ray.kill(self._actor, no_restart=True)

    # -- the thread ---------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._serve()
        finally:
            self._end()

    def _serve(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            command, trial = item
            error = None
            if not self._lost:
                error = self._start(trial) if not self._started else None
                if error is None and not self._lost:
                    error = self._command(command, trial)
            if self._lost and trial is not None and not self._interrupted:
                self._lose_trial(trial)
            self._idle(error)

    def _end(self) -> None:
        reachable = self._started and not self._lost and not self._killed
        if self._interrupted:  # restore() comes next, then the end
            if reachable:
                with contextlib.suppress(RayError):
                    self._put(ray.get(self._actor.take.remote(), timeout=_CALL_TIMEOUT_S))
            return
        if reachable:
            with contextlib.suppress(RayError):
                self._put(ray.get(self._actor.close.remote(), timeout=_CALL_TIMEOUT_S))
        self.kill()

    def _start(self, trial: int | None) -> str | None:
        try:
            started: _Started = ray.get(self._actor.start.remote())
        except RayError as exc:
            self._lose(exc, trial)
            return None
        self._started = True
        self.placement = replace(self.placement, gpus=started.gpus)
        if started.failure is not None:
            self.error = started.failure.error(f"slot {self.placement.slot} on {self._node.name}")
            return str(self.error)
        return None

    def _command(self, command: _Command, trial: int | None) -> str | None:
        try:
            for ref in self._actor.command.remote(command):
                item = ray.get(ref)
                if isinstance(item, Done):
                    self._holding = item.holding
                    if item.failure is None:
                        return None
                    self.error = item.failure.error(f"on {self._node.name}")
                    return str(self.error)
                self._put(item)
        except RayError as exc:
            self._lose(exc, trial)
            return None
        self._lose(RayError("the slot's stream ended without its last answer"), trial)
        return None

    def _put(self, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, InstanceStarted):
                self._instance = (event.trial, event.instance)
            elif isinstance(event, InstanceGone) and self._instance_of(event.trial):
                self._instance = None
            self._events.put(event)

    def _instance_of(self, trial: int) -> bool:
        return self._instance is not None and self._instance[0] == trial

    # -- loss -----------------------------------------------------------------------------

    def _lose(self, exc: BaseException, trial: int | None) -> None:
        """Ray cannot reach the actor: learn whether it (and its node) is dead, report
        the loss, and stop what the slot left running on a node that lives."""
        if self._killed:  # ended here (the sweep is stopping): not a loss
            self._lost = True
            return
        message = self._verdict(exc)
        node_id = self.placement.node_id
        dead = "node has died" in message or not self._host.node_alive(node_id)
        self._lost, self._lost_dead, self._lost_message = True, dead, message
        self._events.put(
            NodeLost(
                trial=trial,
                node=self._node.name,
                node_id=node_id,
                slot=self.placement.slot,
                dead=dead,
                message=short_error(message),
            )
        )
        self.kill()
        if not dead and self._instance is not None:
            owner, instance = self._instance
            try:
                self._put(self._host.stop_orphan(self.placement, owner, instance))
            except (RayError, ServesweepError) as failure:
                self._events.put(
                    SweepWarning(
                        trial=owner,
                        message=f"cannot stop the instance of trial {owner} on "
                        f"{self._node.name}: {short_error(str(failure))}",
                    )
                )

    def _verdict(self, exc: BaseException) -> str:
        """What Ray says of the actor: when the connection broke, its verdict (dead,
        or reachable again) follows once its health checks ran."""
        deadline = time.monotonic() + _VERDICT_TIMEOUT_S
        while isinstance(exc, ActorUnavailableError) and time.monotonic() < deadline:
            try:
                ray.get(self._actor.ping.remote(), timeout=5)
                break  # it answers again; the command's stream is lost all the same
            except (ActorUnavailableError, GetTimeoutError):
                time.sleep(0.5)
            except RayError as later:
                exc = later
        return str(exc)

    def _lose_trial(self, trial: int) -> None:
        self._events.put(
            TrialFinished(
                trial=trial,
                outcome=Outcome.FAILED,
                failure_class=FailureClass.NODE_LOST,
                evidence=lost_evidence(
                    self._node,
                    self.placement.slot,
                    trial,
                    self._lost_message,
                    dead=self._lost_dead,
                ),
                at=time.time(),
            )
        )

    def _idle(self, error: str | None) -> None:
        self._events.put(
            SlotIdle(
                node=self.placement.node,
                node_id=self.placement.node_id,
                slot=self.placement.slot,
                gpus=self.placement.gpus,
                holding=self._holding and not self._lost,
                error=error,
            )
        )
