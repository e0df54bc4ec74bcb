"""An executor for driver unit tests: its machines are given, nothing is left on them,
and the slots it opens are the test's own (``open``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from servesweep.sweep.slots.data import CurrentInstance, NodeInfo, Placement, SweepContext
from servesweep.sweep.slots.node import Leftover, NodePrepared


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
