"""How the orchestrator tells the world what it does: one event per state change.

An :class:`Observer` receives ``(kind, data)`` pairs; the CLI turns them into live
progress and, with ``--events``, into one JSON object per line. Library users pass
their own observer or none (silent).

Kinds: ``sweep_started``, ``trial_started``, ``phase``, ``progress``,
``workload_done``, ``trial_finished``, ``warning``, ``sweep_finished``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, Protocol

__all__ = ["JsonLinesObserver", "NullObserver", "Observer", "Tee"]


class Observer(Protocol):
    def event(self, kind: str, data: Mapping[str, Any]) -> None: ...


class NullObserver:
    def event(self, kind: str, data: Mapping[str, Any]) -> None:
        return None


class JsonLinesObserver:
    """Writes each event (``progress`` excluded unless asked) as one JSON line."""

    def __init__(self, stream: IO[str], *, progress: bool = False) -> None:
        self._stream = stream
        self._progress = progress

    def event(self, kind: str, data: Mapping[str, Any]) -> None:
        if kind == "progress" and not self._progress:
            return
        record = {"t": round(time.time(), 6), "event": kind, **data}
        self._stream.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
        self._stream.flush()


class Tee:
    def __init__(self, observers: Sequence[Observer]) -> None:
        self._observers = list(observers)

    def event(self, kind: str, data: Mapping[str, Any]) -> None:
        for observer in self._observers:
            observer.event(kind, data)
