"""A slot on a Ray node as the driver drives it (:class:`RaySlot`, a ``SlotHandle``):
the slot's actor on its node (``sweep.ray_actor``) does the trial's work; a thread
here sends it one command at a time, puts the events it streams back into the
driver's queue and ends each command with ``SlotIdle``, exactly like a local slot.

When Ray reports the actor or its node dead, the handle reports ``NodeLost`` and
ends the trial it ran ``node_lost`` with what Ray said; when only the actor died and
its node lives, the instance it had started there is stopped by a task on that node.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayError, RayTaskError

from servesweep.errors import ServesweepError
from servesweep.models import FailureClass, InstanceRecord, Outcome
from servesweep.sweep.cluster import lost_evidence, short_error
from servesweep.sweep.events import (
    Event,
    InstanceGone,
    InstanceStarted,
    NodeLost,
    SlotIdle,
    SweepWarning,
    TrialFinished,
)
from servesweep.sweep.ray_actor import Command, Done, Finish, Run, Started, Teardown
from servesweep.sweep.slot import NodeInfo, Placement, TrialOrder

__all__ = ["RaySlot", "SlotHost"]

_CALL_TIMEOUT_S = 60.0
_GPU_WAIT_WARN_S = 60.0
"""How often to say that a slot's actor still waits for Ray to give it its GPUs."""
_VERDICT_TIMEOUT_S = 120.0
"""How long to wait for Ray to tell whether an actor it cannot reach is dead."""


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
        self._inbox: queue.Queue[tuple[Command, int | None] | None] = queue.Queue()
        self._started = False
        self._lost = False
        self._interrupted = False
        self._killed = False
        self._holding = False
        self._instance: tuple[int, InstanceRecord] | None = None
        """The instance the slot runs (trial, record), as its events tell."""
        self._finished: set[int] = set()
        """Trials whose end the slot's events already told (a loss after it is no
        loss of theirs)."""
        self._lost_dead = False
        self._lost_message = ""
        self._closed = False
        self._thread = threading.Thread(
            target=self._main, name=f"ray-slot-{node.name}-{placement.slot}", daemon=True
        )
        self._thread.start()

    # -- commands (each ends with a SlotIdle event) -------------------------------------

    def run(self, order: TrialOrder) -> None:
        self._inbox.put((Run(order), order.trial))

    def teardown(self) -> None:
        self._inbox.put((Teardown(), None))

    def finish(self, keep_running: bool, restart_units: Sequence[str] = ()) -> None:
        self._inbox.put((Finish(keep_running, tuple(restart_units)), None))

    def interrupt(self) -> None:
        """Stop the slot's instance now (the running command ends)."""
        self._interrupted = True
        if self._lost:
            return
        if not self._started:
            # still waiting for its GPUs: it must never start a server now
            self.kill()
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
        except RayTaskError as exc:  # the node could not give the unit back
            raise ServesweepError(f"on {self._node.name}: {_task_error(exc)}") from exc
        except RayError:
            pass  # the actor or its node is gone: nothing to give back there
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
            if not self._lost and not self._interrupted:
                error = self._start(trial) if not self._started else None
                if error is None and not self._lost and not self._interrupted:
                    error = self._command(command, trial)
            lost = self._lost and not self._interrupted
            if lost and trial is not None and trial not in self._finished:
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
        ref = self._actor.start.remote()
        began = time.monotonic()
        while True:
            try:
                started: Started = ray.get(ref, timeout=_GPU_WAIT_WARN_S)
                break
            except GetTimeoutError:
                # Ray starts the actor once the node has its GPUs free (another job may
                # hold them): say so, and go on waiting (Ctrl-C ends the wait)
                self._events.put(
                    SweepWarning(
                        trial=trial,
                        message=f"slot {self.placement.slot} on {self._node.name} has waited "
                        f"{time.monotonic() - began:.0f} s for Ray to give it "
                        f"{len(self.placement.gpus)} GPU(s) there",
                    )
                )
            except RayError as exc:
                self._lose(exc, trial)
                return None
        self._started = True
        self.placement = replace(self.placement, gpus=started.gpus)
        if started.failure is not None:
            self.error = started.failure.error(f"slot {self.placement.slot} on {self._node.name}")
            return str(self.error)
        return None

    def _command(self, command: Command, trial: int | None) -> str | None:
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
        except RayTaskError as exc:  # a bug on the node: an internal error, not a loss
            self.error = RuntimeError(
                f"slot {self.placement.slot} on {self._node.name}: {_task_error(exc)}"
            )
            return str(self.error)
        except RayError as exc:
            self._lose(exc, trial)
            return None
        self._lose(RayError("the slot's stream ended without its last answer"), trial)
        return None

    def _put(self, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, TrialFinished):
                self._finished.add(event.trial)
            elif isinstance(event, InstanceStarted):
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


def _task_error(exc: RayTaskError) -> str:
    """What a task on a node raised, said first: Ray's message opens with the worker's
    process title and a traceback, which a long title would push past the cut."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) < 2:
        return short_error(" ".join(lines))
    return short_error(f"{lines[-1]} (in {lines[0]})")
