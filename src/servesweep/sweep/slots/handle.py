"""What every slot handle does, wherever its slot runs (a thread here, ``sweep.executors.local``;
an actor on a Ray node, ``sweep.executors.ray.handle``):

* the commands the driver gives a slot, as plain data (they travel to a node
  unchanged): :class:`Run`, :class:`Teardown`, :class:`Finish`;
* :class:`CommandInbox`, the handle's side of them: each command waits in the inbox
  for the slot's thread, which carries them out one at a time;
* :func:`carry_out` runs one on the slot's ``SlotWorker`` and tells how it ended —
  ``Interrupted`` (the sweep is stopping) is no error, anything else is, and
  :func:`error_text` is the one line (a servesweep error) or the traceback (a bug)
  the driver reports for it;
* :func:`slot_idle`, the event that ends every command.
"""

from __future__ import annotations

import queue
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

from servesweep.errors import Interrupted, ServesweepError
from servesweep.sweep.events import SlotIdle
from servesweep.sweep.slots.data import Placement, TrialOrder
from servesweep.sweep.slots.worker import SlotWorker

__all__ = [
    "Command",
    "CommandInbox",
    "Finish",
    "Run",
    "Teardown",
    "carry_out",
    "error_text",
    "slot_idle",
]


@dataclass(frozen=True)
class Run:
    order: TrialOrder

    @property
    def trial(self) -> int | None:
        return self.order.trial

    def apply(self, worker: SlotWorker) -> None:
        worker.run(self.order)


@dataclass(frozen=True)
class Teardown:
    @property
    def trial(self) -> int | None:
        return None

    def apply(self, worker: SlotWorker) -> None:
        worker.teardown()


@dataclass(frozen=True)
class Finish:
    keep_running: bool
    restart_units: tuple[str, ...]

    @property
    def trial(self) -> int | None:
        return None

    def apply(self, worker: SlotWorker) -> None:
        worker.finish(self.keep_running, self.restart_units)


Command = Run | Teardown | Finish
"""A command for a slot; ``trial`` is the trial it runs (None: no trial's)."""


class CommandInbox:
    """The commands of a slot handle, in order, until it is closed (``None``)."""

    def __init__(self) -> None:
        self._inbox: queue.Queue[Command | None] = queue.Queue()

    def run(self, order: TrialOrder) -> None:
        self._inbox.put(Run(order))

    def teardown(self) -> None:
        self._inbox.put(Teardown())

    def finish(self, keep_running: bool, restart_units: Sequence[str] = ()) -> None:
        self._inbox.put(Finish(keep_running, tuple(restart_units)))

    def end(self) -> None:
        """No more commands: the slot's thread ends after the one it runs."""
        self._inbox.put(None)

    def next(self) -> Command | None:
        """The next command (waiting for it); None once the inbox is ended."""
        return self._inbox.get()


def carry_out(worker: SlotWorker, command: Command) -> BaseException | None:
    """Run ``command`` on ``worker``; the exception that ended it (None when it ran to
    its end, or when the sweep's stop interrupted it)."""
    try:
        command.apply(worker)
    except Interrupted:
        return None
    except BaseException as exc:  # reported to the driver, which ends the sweep
        return exc
    return None


def error_text(exc: BaseException) -> str:
    """How a command's error is told: a servesweep error's one line; a bug's traceback."""
    if isinstance(exc, ServesweepError):
        return str(exc)
    return "".join(traceback.format_exception(exc)).strip()


def slot_idle(placement: Placement, *, holding: bool, error: str | None = None) -> SlotIdle:
    """The end of a slot's command: the slot is free for the next one (``holding``: its
    instance still runs)."""
    return SlotIdle(
        node=placement.node,
        node_id=placement.node_id,
        slot=placement.slot,
        gpus=placement.gpus,
        holding=holding,
        error=error,
    )
