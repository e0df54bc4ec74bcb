"""An executor and a slot for driver unit tests: the executor's machines are given,
nothing is left on them, and the slots it opens are the test's own (``open``); a slot
answers every command but ``run`` at once, idle."""

from __future__ import annotations

import queue
from collections.abc import Mapping, Sequence

from servesweep.sweep.events import Event, SlotIdle
from servesweep.sweep.slots.data import (
    CurrentInstance,
    NodeInfo,
    Placement,
    SweepContext,
    TrialOrder,
)
from servesweep.sweep.slots.node import Leftover, NodePrepared


class FakeSlot:
    """A slot handle whose ``run`` is the test's; every other command is answered at
    once with the slot idle, on the driver's queue ``events``."""

    def __init__(self, placement: Placement, events: queue.Queue[Event]) -> None:
        self.placement = placement
        self.error: BaseException | None = None
        self._events = events

    def _idle(self) -> None:
        p = self.placement
        self._events.put(SlotIdle(node=p.node, node_id=p.node_id, slot=p.slot, gpus=p.gpus))

    def run(self, order: TrialOrder) -> None:
        raise NotImplementedError("a test's slot runs its own trials")

    def teardown(self) -> None:
        self._idle()

    def finish(self, keep_running: bool, restart_units: Sequence[str] = ()) -> None:
        self._idle()

    def interrupt(self) -> None:
        return None

    def restore(self, restart_units: Sequence[str] = ()) -> None:
        return None

    def close(self, timeout: float = 30.0) -> bool:
        return True


class FakeExecutor:
    """The driver's ``Executor`` over ``machines``, each prepared with ``baseline``
    (GPU index -> bytes held with no server); a subclass opens its slots."""

    def __init__(
        self, machines: Sequence[NodeInfo], baseline: Mapping[int, int] | None = None
    ) -> None:
        self._machines = list(machines)
        self._baseline = dict(baseline or {})

    def nodes(self) -> list[NodeInfo]:
        return list(self._machines)

    def links(self, node: NodeInfo) -> dict[tuple[int, int], int] | None:
        return None

    def check(self) -> None:
        return None

    def warnings(self) -> list[str]:
        return []

    def context_for(self, node: NodeInfo) -> SweepContext:
        raise AssertionError("no leftovers here")

    def prepare(
        self,
        node: NodeInfo,
        pool: Placement,
        leftovers: Sequence[Leftover],
        stored: Mapping[int, int] | None,
        service_slots: Sequence[int],
    ) -> NodePrepared:
        return NodePrepared(baseline=dict(self._baseline))

    def open(
        self, placement: Placement, *, current: CurrentInstance | None, baseline: Mapping[int, int]
    ) -> object:
        raise NotImplementedError("a test's executor opens its own slots")

    def close(self) -> None:
        return None
