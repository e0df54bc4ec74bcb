"""A slot on a Ray node as the driver drives it (:class:`RaySlot`, a ``SlotHandle``):
the slot's actor on its node (``sweep.executors.ray.actor``) does the trial's work; a thread
here sends it one command at a time, puts the events it streams back into the
driver's queue and ends each command with ``SlotIdle``, exactly like a local slot.

When Ray reports the actor or its node dead, the handle reports ``NodeLost`` and
ends the trial it ran ``node_lost`` with what Ray said; when only the actor died and
its node lives, the instance it had started there is stopped by a task on that node.

The actor's state (:class:`ActorState`) is one value, changed by two threads (the
handle's, and the driver's through ``interrupt``, ``restore`` and ``kill``) under one
lock; its docstring lists the transitions.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Protocol

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayError, RayTaskError

from servesweep.errors import ServesweepError
from servesweep.models import FailureClass, InstanceRecord, Outcome
from servesweep.sweep.events import (
    Event,
    InstanceGone,
    InstanceStarted,
    NodeLost,
    SweepWarning,
    TrialFinished,
)
from servesweep.sweep.executors.ray.actor import Done, Started
from servesweep.sweep.executors.ray.nodes import lost_evidence, short_error
from servesweep.sweep.slots.data import NodeInfo, Placement
from servesweep.sweep.slots.handle import Command, CommandInbox, slot_idle

__all__ = ["ActorState", "RaySlot", "SlotHost"]

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


class ActorState(Enum):
    """Where a slot's actor is, as its handle knows it. The transitions (``_NEXT``),
    each taken at once under the handle's lock (``RaySlot._move``):

    * ``WAITING`` → ``READY``: the actor started (Ray gave it its GPUs);
    * ``WAITING``/``READY`` → ``LOST``: Ray cannot reach it — ``NodeLost`` is reported,
      the actor ended, and the trial it ran ends ``node_lost``;
    * ``READY`` → ``INTERRUPTED``: Ctrl-C (``interrupt``) — no more commands,
      ``restore`` comes next;
    * ``WAITING``/``READY``/``INTERRUPTED`` → ``ENDED``: ended here (``kill``, or
      Ctrl-C while it waits for its GPUs); from ``INTERRUPTED`` also when it is lost
      after Ctrl-C (reported, but the trial is the stop's, not the loss's);
    * ``LOST`` → ``ENDED``: Ctrl-C after the loss.

    ``ENDED`` is final.
    """

    WAITING = "waiting"
    """Not started yet: no command came, or Ray has not given it its GPUs."""
    READY = "ready"
    """Started: it takes commands."""
    INTERRUPTED = "interrupted"
    """The sweep is stopping: it takes no more commands, but still answers."""
    LOST = "lost"
    """Ray cannot reach it (it or its node died): the trial it ran ends ``node_lost``."""
    ENDED = "ended"
    """Ended from here (or lost while the sweep stopped): nothing more to ask it."""


_NEXT: dict[ActorState, frozenset[ActorState]] = {
    ActorState.WAITING: frozenset({ActorState.READY, ActorState.LOST, ActorState.ENDED}),
    ActorState.READY: frozenset({ActorState.INTERRUPTED, ActorState.LOST, ActorState.ENDED}),
    ActorState.INTERRUPTED: frozenset({ActorState.ENDED}),
    ActorState.LOST: frozenset({ActorState.ENDED}),
    ActorState.ENDED: frozenset(),
}
"""The transitions :class:`ActorState` documents."""

_ALIVE = frozenset({ActorState.WAITING, ActorState.READY, ActorState.INTERRUPTED})
"""The states in which the actor has not been ended."""


@dataclass(frozen=True)
class _Loss:
    dead: bool
    """The node died (not only the slot's process)."""
    message: str
    """What Ray said."""


class RaySlot(CommandInbox):
    """A slot on a Ray node, as the driver drives it (``SlotHandle``); its commands
    (``run``, ``teardown``, ``finish``) wait in its inbox for its thread."""

    def __init__(
        self,
        host: SlotHost,
        node: NodeInfo,
        placement: Placement,
        actor: ActorHandle[Any],
        events: queue.Queue[Event],
    ) -> None:
        super().__init__()
        self.placement = placement
        self.error: BaseException | None = None
        self._host = host
        self._node = node
        self._actor = actor
        self._events = events
        self._lock = threading.Lock()
        self._state = ActorState.WAITING
        """Changed only through :meth:`_move` (see :class:`ActorState`)."""
        self._holding = False
        """Whether the slot's instance ran on when its last command ended."""
        self._loss: _Loss | None = None
        self._instance: tuple[int, InstanceRecord] | None = None
        """The instance the slot runs (trial, record), as its events tell."""
        self._finished: set[int] = set()
        """Trials whose end the slot's events already told (a loss after it is no
        loss of theirs)."""
        self._thread = threading.Thread(
            target=self._main, name=f"ray-slot-{node.name}-{placement.slot}", daemon=True
        )
        self._thread.start()

    @property
    def state(self) -> ActorState:
        with self._lock:
            return self._state

    def _move(self, moves: Mapping[ActorState, ActorState]) -> ActorState | None:
        """Take the transition ``moves`` gives for the actor's state, at once; the
        state it left (None: ``moves`` has none for it, nothing changed)."""
        with self._lock:
            was = self._state
            to = moves.get(was)
            if to is None:
                return None
            assert to in _NEXT[was], f"{was} -> {to}"
            self._state = to
            return was

    # -- besides the commands (each ends with a SlotIdle event) -------------------------

    def interrupt(self) -> None:
        """Stop the slot's instance now (the running command ends)."""
        was = self._move(
            {
                ActorState.WAITING: ActorState.ENDED,
                ActorState.READY: ActorState.INTERRUPTED,
                ActorState.LOST: ActorState.ENDED,
            }
        )
        if was is ActorState.WAITING:
            # still waiting for its GPUs: it must never start a server now
            self._end_actor()
            return
        if was is not ActorState.READY:
            return
        try:
            ray.get(self._actor.interrupt.remote(), timeout=_CALL_TIMEOUT_S)
        except RayError:
            return

    def restore(self, restart_units: Sequence[str] = ()) -> None:
        """After an interrupt: give a unit back, then end the actor."""
        try:
            if self.state in (ActorState.READY, ActorState.INTERRUPTED):
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
        self.end()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def kill(self) -> None:
        """End the actor (Ray gives its GPUs back); once."""
        if self._move(dict.fromkeys(_ALIVE, ActorState.ENDED)) is not None:
            self._end_actor()

    def _end_actor(self) -> None:
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
            command = self.next()
            if command is None:
                return
            trial = command.trial
            error = None
            if self.state is ActorState.WAITING:
                error = self._start(trial)
            if error is None and self.state is ActorState.READY:
                error = self._command(command, trial)
            if self.state is ActorState.LOST and trial is not None and trial not in self._finished:
                self._lose_trial(trial)
            self._idle(error)

    def _end(self) -> None:
        state = self.state
        if state is ActorState.INTERRUPTED:  # restore() comes next, then the end
            with contextlib.suppress(RayError):
                self._put(ray.get(self._actor.take.remote(), timeout=_CALL_TIMEOUT_S))
            return
        if state is ActorState.READY:
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
        self._move({ActorState.WAITING: ActorState.READY})
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
        if self.state is ActorState.ENDED:  # ended here (the sweep is stopping): not a loss
            return
        message = self._verdict(exc)
        node_id = self.placement.node_id
        dead = "node has died" in message or not self._host.node_alive(node_id)
        self._loss = _Loss(dead, message)
        # after Ctrl-C the loss is reported, but the trial is the stop's, not the loss's
        was = self._move(
            {
                ActorState.WAITING: ActorState.LOST,
                ActorState.READY: ActorState.LOST,
                ActorState.INTERRUPTED: ActorState.ENDED,
            }
        )
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
        if was is not None:
            self._end_actor()
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
        loss = self._loss
        assert loss is not None
        self._events.put(
            TrialFinished(
                trial=trial,
                outcome=Outcome.FAILED,
                failure_class=FailureClass.NODE_LOST,
                evidence=lost_evidence(
                    self._node, self.placement.slot, trial, loss.message, dead=loss.dead
                ),
                at=time.time(),
            )
        )

    def _idle(self, error: str | None) -> None:
        holding = self._holding and self._loss is None  # a lost slot holds nothing
        self._events.put(slot_idle(self.placement, holding=holding, error=error))


def _task_error(exc: RayTaskError) -> str:
    """What a task on a node raised, said first: Ray's message opens with the worker's
    process title and a traceback, which a long title would push past the cut."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) < 2:
        return short_error(" ".join(lines))
    return short_error(f"{lines[-1]} (in {lines[0]})")
