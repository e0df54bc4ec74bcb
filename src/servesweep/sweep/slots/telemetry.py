"""A slot's GPU samples for the report's memory timeline, taken in a thread of their own."""

from __future__ import annotations

import threading
import time

from servesweep.records import TelemetryPoint
from servesweep.servers.lifecycle import ServerLifecycle
from servesweep.sweep.events import TelemetrySampled

__all__ = ["SlotTelemetry"]


class SlotTelemetry:
    """Samples the slot's GPUs in the background for the report's memory timeline:
    every ``interval`` seconds, and every ``fast_interval`` while an instance stops
    and its memory comes back (so no release falls between two samples)."""

    def __init__(
        self, lifecycle: ServerLifecycle, node: str, interval: float = 0.25, fast: float = 0.05
    ) -> None:
        self._probe = lifecycle.probe
        self._gpus = list(lifecycle.spec.gpus)
        self._node = node
        self._interval = interval
        self._fast_interval = fast
        self._fast = False
        self._points: list[tuple[float, int, int, float | None, float | None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        if self._probe.name == "none" or not self._gpus:
            return
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def fast(self, on: bool) -> None:
        self._fast = on

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                states = self._probe.snapshot(self._gpus)
            except Exception:
                states = []
            now = time.time()
            with self._lock:
                for s in states:
                    self._points.append((now, s.index, s.used_bytes, s.utilization_pct, s.power_w))
            self._stop.wait(self._fast_interval if self._fast else self._interval)

    def drain(self, trial_id: int) -> tuple[TelemetryPoint, ...]:
        """The samples taken since the last drain, as ``trial_id``'s points; the slot
        drains once before a trial to discard what came before it."""
        with self._lock:
            points, self._points = self._points, []
        return tuple(
            TelemetryPoint(trial_id, t, g, u, ut, p, self._node) for t, g, u, ut, p in points
        )

    def released(self, holder: int | None, trial: int | None) -> list[TelemetrySampled]:
        """After a stop and release: the samples taken since the last drain belong to
        the instance that held the memory, the stopped instance's trial ``holder``, not
        to ``trial`` that waited for it (a trial's peak is its own instance's): the event
        that reports them as ``holder``'s. With no instance stopped (the first trial,
        after an interrupt) they belong to no trial and are discarded, like an idle
        slot's. A configuration's own next launch (``holder == trial``) keeps them."""
        if holder is not None and holder == trial:
            return []
        points = self.drain(holder or 0)
        return (
            [TelemetrySampled(trial=holder, points=points)] if holder is not None and points else []
        )

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
