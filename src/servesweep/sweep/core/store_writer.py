"""The driver's one writer of the results database: :class:`StoreWriter`.

A slot sends every state change as a typed event through its
:class:`~servesweep.sweep.slots.channel.TrialChannel`; the driver owns the results
database, and its ``StoreWriter`` alone applies each event to it — phase changes,
instance identity, results, telemetry, evidence, the outcome — and passes it on to the
observers. ``servesweep apply`` and ``servesweep stop`` write through it too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from servesweep.models import Outcome
from servesweep.store import Store
from servesweep.sweep.events import (
    Event,
    Fact,
    InstanceGone,
    InstanceStarted,
    LevelMeasured,
    Observer,
    PhaseEntered,
    PhaseSeconds,
    TelemetrySampled,
    TrialFinished,
    TrialStarted,
)

__all__ = ["StoreWriter"]


class StoreWriter:
    """Applies events to the results database (the driver's thread only) and passes
    them on to the observer. ``finished`` is called with every final trial."""

    def __init__(
        self,
        store: Store,
        sweep_id: int,
        observer: Observer,
        on_finished: Callable[[TrialFinished], None] | None = None,
    ) -> None:
        self.store = store
        self.sweep_id = sweep_id
        self.observer = observer
        self._on_finished = on_finished
        self._lock = threading.RLock()
        """Reentrant: ``on_finished`` may note events of its own while a trial's end
        is being written."""
        self._relaunched: dict[int, float] = {}
        """Trials whose confirm relaunch is under way, and when it started."""
        self.interrupted = False
        """After an interrupt, outcomes that arrive are not final: trials in flight
        are marked ``interrupted`` instead."""

    def apply(self, event: Event) -> None:
        with self._lock:
            forwarded = self._write(event)
        if forwarded is not None:
            self.observer.event(forwarded)

    def note(self, event: Event) -> None:
        """An event of the driver's own (not from a slot): store facts, pass on."""
        self.apply(event)

    def _write(self, event: Event) -> Event | None:
        store = self.store
        if isinstance(event, TrialStarted) and event.relaunch:
            # more launches of a finished trial: its attempt and outcome stay
            self._relaunched[event.trial] = event.at or time.time()
        elif isinstance(event, TrialStarted):
            store.begin_attempt(
                event.trial,
                event.at or time.time(),
                event.log_path or None,
                node=event.node,
                node_id=event.node_id,
                slot=event.slot,
                gpus=event.gpus,
            )
        elif isinstance(event, PhaseEntered):
            store.enter_phase(event.trial, event.phase, event.at, event.previous_seconds)
        elif isinstance(event, PhaseSeconds):
            store.set_phase_seconds(event.trial, event.phase, event.seconds)
        elif isinstance(event, InstanceStarted):
            store.set_instance(
                event.trial,
                event.instance,
                launch_command=event.launch_command,
                adopted=event.adopted,
            )
        elif isinstance(event, InstanceGone):
            store.mark_instance_gone(event.trial)
        elif isinstance(event, LevelMeasured):
            store.add_result(event.trial, event.result)
        elif isinstance(event, TelemetrySampled):
            store.add_telemetry(event.points)
        elif isinstance(event, TrialFinished):
            if self.interrupted:
                return None
            at = event.at or time.time()
            if event.relaunch:
                started = self._relaunched.pop(event.trial, at)
                store.finish_relaunch(event.trial, at - started, at, event.last_phase_seconds)
            else:
                store.finish_trial(
                    event.trial,
                    event.outcome,
                    at,
                    failure_class=event.failure_class,
                    evidence=event.evidence,
                    last_phase_seconds=event.last_phase_seconds,
                )
            done = store.trial(event.trial)
            event = replace(event, phase_seconds=dict(done.phase_seconds))
            if self._on_finished is not None:
                self._on_finished(event)
        elif isinstance(event, Fact):
            data = event.to_json()
            trial = data.pop("trial", None)
            store.add_event(self.sweep_id, event.kind, data, trial)
        return event

    def mark_interrupted(self, trial_ids: list[int]) -> None:
        """Trials still running when the sweep was stopped end ``interrupted``."""
        with self._lock:
            self.interrupted = True
            for trial_id in trial_ids:
                if self.store.trial(trial_id).outcome is Outcome.RUNNING:
                    self.store.finish_trial(trial_id, Outcome.INTERRUPTED, time.time())
