"""A cluster slot's handle in the driver (``sweep.executors.ray.handle.RaySlot``) against a fake
actor: what it reports when the actor is lost after its trial ended, when a Ctrl-C
comes while the actor still waits for its GPUs, and when the node cannot give a unit
back. Ray's calls are replaced by the fake's answers (no cluster)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="Ray is the optional extra servesweep[ray]")

from ray.exceptions import ActorDiedError, GetTimeoutError, RayTaskError  # noqa: E402

from servesweep.errors import ServesweepError  # noqa: E402
from servesweep.models import FailureClass, Outcome  # noqa: E402
from servesweep.sweep.events import (  # noqa: E402
    Event,
    NodeLost,
    SlotIdle,
    SweepWarning,
    TrialFinished,
)
from servesweep.sweep.executors.ray import handle as ray_slot  # noqa: E402
from servesweep.sweep.executors.ray.actor import Done, Started  # noqa: E402
from servesweep.sweep.slots.data import NodeInfo, Placement, TrialOrder  # noqa: E402

_NODE = NodeInfo("gpu-b", (0, 1), "f158")
_PLACEMENT = Placement(node="gpu-b", slot=0, gpus=(0,), port=18400, node_id="f158")
_ORDER = TrialOrder(7, 1, 1, "fp", {"budget": 2}, "/logs/trial-7/server.log")


class _Pending:
    """A call whose answer is not there yet (``ray.get`` times out) until ``ready``."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.answer: Any = None


class _Method:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def remote(self, *args: Any) -> Any:
        return self._fn(*args)


class _Actor:
    """Answers like a slot's actor; each method's behaviour is set by the test."""

    def __init__(self) -> None:
        self.commands: list[Any] = []
        self.start = _Method(lambda: Started((0,)))
        self.command = _Method(self._command)
        self.stream: Callable[[], Iterator[Any]] = lambda: iter([Done()])
        self.interrupt = _Method(lambda: None)
        self.restore = _Method(lambda units: [])
        self.close = _Method(lambda: [])
        self.take = _Method(lambda: [])
        self.ping = _Method(lambda: True)

    def _command(self, command: Any) -> Iterator[Any]:
        self.commands.append(command)
        return self.stream()


class _Host:
    def node_alive(self, node_id: str) -> bool:
        return False

    def stop_orphan(self, placement: Placement, trial: int, instance: Any) -> list[Event]:
        return []


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """``ray.get`` answers the fake's values (raising what they are, waiting on a
    pending call); ``ray.kill`` is recorded and ends pending calls as a dead actor."""
    killed: list[Any] = []
    pending: list[_Pending] = []

    def get(ref: Any, timeout: float | None = None) -> Any:
        if isinstance(ref, _Pending):
            pending.append(ref)
            if not ref.ready.wait(min(timeout or 5.0, 0.05)):
                raise GetTimeoutError("not ready")
            ref = ref.answer
        if isinstance(ref, BaseException):
            raise ref
        return ref

    def kill(actor: Any, no_restart: bool = True) -> None:
        killed.append(actor)
        for call in pending:
            call.answer = ActorDiedError()
            call.ready.set()

    monkeypatch.setattr(ray_slot.ray, "get", get)
    monkeypatch.setattr(ray_slot.ray, "kill", kill)
    monkeypatch.setattr(ray_slot, "_GPU_WAIT_WARN_S", 0.05)
    return killed


def _drain(events: queue.Queue[Event], until: Callable[[Event], bool]) -> list[Event]:
    got: list[Event] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            event = events.get(timeout=0.1)
        except queue.Empty:
            continue
        got.append(event)
        if until(event):
            return got
    raise AssertionError(f"no such event within 10 s: {got}")


def test_a_slot_lost_after_its_trial_ended_leaves_the_trials_outcome_alone(
    fake_ray: list[Any],
) -> None:
    """The actor died between the trial's end and the command's last answer: the node
    is lost, but the trial's ``ok`` stands (it is not ended ``node_lost`` and run again)."""
    actor = _Actor()

    def stream() -> Iterator[Any]:
        yield [TrialFinished(trial=7, outcome=Outcome.OK)]
        raise ActorDiedError()

    actor.stream = stream
    events: queue.Queue[Event] = queue.Queue()
    slot = ray_slot.RaySlot(_Host(), _NODE, _PLACEMENT, actor, events)  # type: ignore[arg-type]
    slot.run(_ORDER)
    got = _drain(events, lambda e: isinstance(e, SlotIdle))
    finished = [e for e in got if isinstance(e, TrialFinished)]
    assert [(e.trial, e.outcome) for e in finished] == [(7, Outcome.OK)], got
    assert any(isinstance(e, NodeLost) and e.trial == 7 for e in got), got
    slot.close(timeout=5)


def test_a_trial_running_when_its_slot_is_lost_ends_node_lost(fake_ray: list[Any]) -> None:
    actor = _Actor()

    def stream() -> Iterator[Any]:
        yield [SweepWarning(trial=7, message="loading")]
        raise ActorDiedError()

    actor.stream = stream
    events: queue.Queue[Event] = queue.Queue()
    slot = ray_slot.RaySlot(_Host(), _NODE, _PLACEMENT, actor, events)  # type: ignore[arg-type]
    slot.run(_ORDER)
    got = _drain(events, lambda e: isinstance(e, SlotIdle))
    (finished,) = [e for e in got if isinstance(e, TrialFinished)]
    assert finished.trial == 7 and finished.failure_class is FailureClass.NODE_LOST
    slot.close(timeout=5)


def test_ctrl_c_while_the_actor_waits_for_its_gpus_ends_it_and_starts_nothing(
    fake_ray: list[Any],
) -> None:
    actor = _Actor()
    start = _Pending()
    actor.start = _Method(lambda: start)
    events: queue.Queue[Event] = queue.Queue()
    slot = ray_slot.RaySlot(_Host(), _NODE, _PLACEMENT, actor, events)  # type: ignore[arg-type]
    slot.run(_ORDER)
    waiting = _drain(events, lambda e: isinstance(e, SweepWarning))
    assert "for Ray to give it 1 GPU(s)" in waiting[-1].message  # type: ignore[attr-defined]
    slot.interrupt()
    got = _drain(events, lambda e: isinstance(e, SlotIdle))
    assert fake_ray == [actor], "the waiting actor is ended"
    assert actor.commands == [], "no command reaches an actor after Ctrl-C"
    assert not any(isinstance(e, (NodeLost, TrialFinished)) for e in got), got
    slot.restore()
    assert slot.close(timeout=5)


def test_a_unit_the_node_cannot_give_back_is_an_error_not_silence(
    fake_ray: list[Any],
) -> None:
    actor = _Actor()
    refused = RayTaskError(
        "restore", "Traceback ...\nServesweepError: systemctl restart failed", RuntimeError()
    )
    actor.restore = _Method(lambda units: refused)
    events: queue.Queue[Event] = queue.Queue()
    slot = ray_slot.RaySlot(_Host(), _NODE, _PLACEMENT, actor, events)  # type: ignore[arg-type]
    slot.run(_ORDER)
    _drain(events, lambda e: isinstance(e, SlotIdle))
    slot.interrupt()
    with pytest.raises(ServesweepError, match=r"gpu-b.*systemctl restart failed"):
        slot.restore(("llm.service",))
    assert fake_ray == [actor]
    slot.close(timeout=5)


def test_a_loss_after_ctrl_c_is_reported_but_the_trial_is_the_stops(
    fake_ray: list[Any],
) -> None:
    """Ctrl-C, then Ray loses the actor before its command ended: the loss is said, the
    actor ended once, and the trial is left to the stop (not ended ``node_lost``)."""
    actor = _Actor()
    lost = threading.Event()

    def stream() -> Iterator[Any]:
        yield [SweepWarning(trial=7, message="loading")]
        lost.wait(5)
        raise ActorDiedError()

    actor.stream = stream
    events: queue.Queue[Event] = queue.Queue()
    slot = ray_slot.RaySlot(_Host(), _NODE, _PLACEMENT, actor, events)  # type: ignore[arg-type]
    slot.run(_ORDER)
    _drain(events, lambda e: isinstance(e, SweepWarning))
    assert slot.state is ray_slot.ActorState.READY
    slot.interrupt()
    assert slot.state is ray_slot.ActorState.INTERRUPTED
    lost.set()
    got = _drain(events, lambda e: isinstance(e, SlotIdle))
    assert any(isinstance(e, NodeLost) and e.trial == 7 for e in got), got
    assert not any(isinstance(e, TrialFinished) for e in got), got
    assert slot.state is ray_slot.ActorState.ENDED
    slot.restore()
    assert fake_ray == [actor], "the actor is ended once"
    assert slot.close(timeout=5)
