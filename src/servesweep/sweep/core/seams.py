"""What the driver is given, as protocols: an :class:`Executor` (where slots run) that
opens :class:`SlotHandle` s, and a :class:`TrialSource` (what to run). The driver knows
no implementation of them: the executors are in ``sweep.executors``, the source is
``sweep.core.search_source``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from servesweep.decide.prune import PrunePolicy
from servesweep.models import LevelResult
from servesweep.store import TrialRecord
from servesweep.sweep.slots.data import (
    CurrentInstance,
    NodeInfo,
    Placement,
    SweepContext,
    TrialOrder,
)
from servesweep.sweep.slots.node import Leftover, NodePrepared

__all__ = ["Executor", "SlotHandle", "TrialSource"]


class SlotHandle(Protocol):
    """A slot as the driver drives it; every command ends with a ``SlotIdle`` event."""

    placement: Placement
    error: BaseException | None

    def run(self, order: TrialOrder) -> None: ...
    def teardown(self) -> None: ...
    def finish(self, keep_running: bool, restart_units: Sequence[str] = ()) -> None: ...
    def interrupt(self) -> None: ...
    def restore(self, restart_units: Sequence[str] = ()) -> None: ...
    def close(self, timeout: float = ...) -> bool: ...


class Executor(Protocol):
    """Where slots run: this machine (``sweep.executors.local``) or a Ray cluster
    (``sweep.executors.ray.executor``); built for a run by its site
    (``sweep.executors.site``). The driver never knows which."""

    def nodes(self) -> list[NodeInfo]: ...

    def check(self) -> None:
        """Before the run, when it has trials to run: ConfigError for what would fail
        every one of them (a program on a slot's port)."""
        ...

    def warnings(self) -> list[str]:
        """What to tell the user as the run starts (slots that share CPU cores)."""
        ...

    def links(self, node: NodeInfo) -> dict[tuple[int, int], int] | None: ...

    def context_for(self, node: NodeInfo) -> SweepContext:
        """The sweep as ``node`` sees it (its address, its fake GPUs): launches there,
        and so their fingerprints, follow it."""
        ...

    def prepare(
        self,
        node: NodeInfo,
        pool: Placement,
        leftovers: Sequence[Leftover],
        stored: Mapping[int, int] | None,
        service_slots: Sequence[int],
    ) -> NodePrepared:
        """Make ``node`` ready: its slots' ports checked, leftovers adopted or stopped,
        the GPU baseline taken (see ``sweep.slots.node``)."""
        ...

    def open(
        self,
        placement: Placement,
        *,
        current: CurrentInstance | None,
        baseline: Mapping[int, int],
    ) -> SlotHandle: ...

    def close(self) -> None: ...


class TrialSource(Protocol):
    """What to run: a search's proposals (``sweep.core.search_source``: the grid is one)."""

    planned: bool
    """Every trial it gives is known before the first take (a grid's plan of pending
    trials): the count of trials to run is exact, not at most."""

    def take(self, room: int) -> list[TrialRecord]:
        """Up to ``room`` more trials to queue now ([] when there is nothing more yet)."""
        ...

    def tell(self, trial: TrialRecord, results: Sequence[LevelResult]) -> None: ...

    def exhausted(self) -> bool: ...

    def prune_policy(self) -> PrunePolicy | None:
        """What a slot needs to stop a trial early that can no longer win (None: never)."""
        ...
