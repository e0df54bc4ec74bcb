"""The one narrow interface between a slot and the driver: events, in order.

A slot (``sweep.slots.worker``) does the work of a trial on the machine that owns its
GPUs and sends every state change as a typed event (``sweep.events``) through a
:class:`TrialChannel`; the driver's
:class:`~servesweep.sweep.core.store_writer.StoreWriter` alone writes them to the
results database. Two channels implement the interface:

* :class:`QueueChannel` — slots in threads of ``servesweep run``: events go straight
  into the driver's queue; the driver's thread writes them (one writer);
* ``sweep.executors.ray.nodes.BufferChannel`` — slots in Ray actors on other machines:
  events are buffered on the node and fetched by the driver, which puts them into the
  same queue.

Nothing else differs between one machine and many.
"""

from __future__ import annotations

import queue
from typing import Protocol

from servesweep.sweep.events import Event

__all__ = ["QueueChannel", "TrialChannel"]


class TrialChannel(Protocol):
    """Where a slot sends its events; ``send`` never blocks for long and never raises."""

    def send(self, event: Event) -> None: ...


class QueueChannel:
    """A slot's channel to a driver in the same process (a thread-safe queue)."""

    def __init__(self, sink: queue.Queue[Event]) -> None:
        self._sink = sink

    def send(self, event: Event) -> None:
        self._sink.put(event)
