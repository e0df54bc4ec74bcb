"""What a sweep tells the world: one typed event per state change.

Slots (where one trial's work runs: the GPUs and port of one machine) send these
events through a :class:`~servesweep.sweep.slots.channel.TrialChannel`; the driver applies
each one to the results database and passes it on to an :class:`Observer` — the
CLI's live display, ``--events`` JSON lines, or a library user's own (or none).

Every event is a frozen dataclass with a stable ``kind`` (the ``event`` field of
the JSON lines) and ``to_json()``. Events that are evidence of what servesweep did
to processes and GPUs (:class:`Fact` subclasses: stops, releases, cleaned orphans,
baselines, warnings) are also kept in the store's events table.

Events cross machines (a slot on a Ray node sends them to the driver), so they hold
plain data only and pickle cleanly.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar, Protocol

from servesweep.models import (
    Evidence,
    FailureClass,
    InstanceRecord,
    LevelResult,
    Outcome,
    Phase,
)
from servesweep.records import TelemetryPoint

__all__ = [
    "BaselineTaken",
    "ConfigMismatched",
    "ConfirmStep",
    "Event",
    "Fact",
    "GpusReleased",
    "InstanceGone",
    "InstanceStarted",
    "InstanceStopped",
    "JsonLinesObserver",
    "LeftoverAdopted",
    "LeftoverStopped",
    "LevelMeasured",
    "NodeLost",
    "NullObserver",
    "Observer",
    "OrphansCleaned",
    "PhaseEntered",
    "PhaseSeconds",
    "Progress",
    "SlotIdle",
    "SweepFinished",
    "SweepStarted",
    "SweepWarning",
    "Tee",
    "TelemetrySampled",
    "TrialFinished",
    "TrialStarted",
    "UnitRestored",
    "WorkloadDone",
    "headline",
]


@dataclass(frozen=True)
class Event:
    """Base of every event; ``kind`` names it in JSON lines and the store."""

    kind: ClassVar[str] = "event"

    def to_json(self) -> dict[str, Any]:
        """The event's fields as JSON-able data (without ``kind``)."""
        return {name: _jsonable(getattr(self, name)) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class Fact(Event):
    """An event that is evidence: kept in the store's events table as well."""

    trial: int | None = None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (Outcome, Phase, FailureClass)):
        return value.value
    if isinstance(value, (Evidence, InstanceRecord)):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


# -- the sweep ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepStarted(Event):
    kind: ClassVar[str] = "sweep_started"
    sweep: int = 0
    name: str = ""
    store: str = ""
    trials: int = 0
    todo: int = 0
    done: int = 0
    slots: int = 1
    """How many trials may run at the same time."""
    at_most: bool = False
    """``todo`` is a bound, not a count: a search proposes trials as it goes, and stops
    at its trial cap or budget."""


@dataclass(frozen=True)
class SweepFinished(Event):
    kind: ClassVar[str] = "sweep_finished"
    sweep: int = 0
    counts: Mapping[str, int] = field(default_factory=dict)
    """Trials by outcome."""

    def to_json(self) -> dict[str, Any]:
        return {**dict(self.counts), "sweep": self.sweep}


# -- one trial ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialStarted(Event):
    """A new attempt of a trial begins on a slot: where it runs and where its log goes."""

    kind: ClassVar[str] = "trial_started"
    trial: int = 0
    seq: int = 0
    number: int = 0
    """The trial's number within its sweep (what people read; ``trial`` is its id)."""
    params: Mapping[str, Any] = field(default_factory=dict)
    attempt: int = 1
    at: float = 0.0
    log_path: str = ""
    node: str = ""
    node_id: str = ""
    slot: int = 0
    gpus: tuple[int, ...] = ()
    port: int = 0
    relaunch: bool = False
    """More launches of a finished trial (the confirm phase): not a new attempt."""


@dataclass(frozen=True)
class PhaseEntered(Event):
    """A trial entered ``phase`` at ``at``; ``previous_seconds``: how long the phase it
    left lasted, measured by the slot (the one clock of phase durations; None: the
    trial was in no phase before)."""

    kind: ClassVar[str] = "phase"
    trial: int = 0
    phase: Phase = Phase.STOP
    at: float = 0.0
    previous_seconds: float | None = None


@dataclass(frozen=True)
class PhaseSeconds(Event):
    """A phase's measured duration that differs from the time between phase changes
    (``load`` split out of a wait that became ready between two polls)."""

    kind: ClassVar[str] = "phase_seconds"
    trial: int = 0
    phase: Phase = Phase.LOAD
    seconds: float = 0.0


@dataclass(frozen=True)
class Progress(Event):
    """A live line: the server log while loading, the load generator while benchmarking."""

    kind: ClassVar[str] = "progress"
    trial: int = 0
    phase: str = ""
    elapsed: float = 0.0
    line: str = ""
    workload: str | None = None


@dataclass(frozen=True)
class InstanceStarted(Event):
    """The trial's instance runs (started, or an earlier one adopted): its identity."""

    kind: ClassVar[str] = "instance"
    trial: int = 0
    instance: InstanceRecord = field(default_factory=lambda: InstanceRecord(launcher=""))
    launch_command: str | None = None
    adopted: bool = False


@dataclass(frozen=True)
class InstanceGone(Event):
    """The instance recorded on ``trial`` no longer runs (stopped, or found dead)."""

    kind: ClassVar[str] = "instance_gone"
    trial: int = 0


@dataclass(frozen=True)
class LevelMeasured(Event):
    """One workload level's result (its samples included): stored as it arrives."""

    kind: ClassVar[str] = "level"
    trial: int = 0
    result: LevelResult = field(
        default_factory=lambda: LevelResult(workload="", level="", repeat=0, metrics={})
    )

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {
            "trial": self.trial,
            "workload": r.workload,
            "level": r.level,
            "repeat": r.repeat,
            "launch": r.launch,
            "metrics": headline(r),
        }


@dataclass(frozen=True)
class WorkloadDone(Event):
    kind: ClassVar[str] = "workload_done"
    trial: int = 0
    workload: str = ""
    levels: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class TelemetrySampled(Event):
    """GPU memory, utilisation and power sampled during a trial (for the report)."""

    kind: ClassVar[str] = "telemetry"
    trial: int = 0
    points: tuple[TelemetryPoint, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"trial": self.trial, "points": len(self.points)}


@dataclass(frozen=True)
class TrialFinished(Event):
    """The trial's final outcome; ``last_phase_seconds``: how long its last phase
    lasted, measured by the slot (None: ended without its slot); ``phase_seconds`` is
    filled by the driver from the store."""

    kind: ClassVar[str] = "trial_finished"
    trial: int = 0
    outcome: Outcome = Outcome.OK
    failure_class: FailureClass | None = None
    evidence: Evidence | None = None
    at: float = 0.0
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    relaunch: bool = False
    """The end of a confirm relaunch: the trial's own outcome stays as it was."""
    last_phase_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "outcome": self.outcome.value,
            "failure_class": self.failure_class.value if self.failure_class else None,
            "message": self.evidence.summary() if self.evidence else None,
            "phase_seconds": dict(self.phase_seconds),
        }


@dataclass(frozen=True)
class SlotIdle(Event):
    """A slot finished its work (a trial, a teardown, its preparation) and can take more."""

    kind: ClassVar[str] = "slot_idle"
    node: str = ""
    node_id: str = ""
    slot: int = 0
    gpus: tuple[int, ...] = ()
    holding: bool = False
    """Whether its last instance still runs (and holds ``gpus``) until stopped."""
    error: str | None = None
    """Set when the slot could not do its work at all (an internal error)."""


# -- facts: evidence kept in the store ---------------------------------------------------


@dataclass(frozen=True)
class InstanceStopped(Fact):
    kind: ClassVar[str] = "stopped"
    instance_of: int = 0
    seconds: float = 0.0
    signalled: tuple[int, ...] = ()
    killed: tuple[int, ...] = ()
    node: str = ""


@dataclass(frozen=True)
class GpusReleased(Fact):
    kind: ClassVar[str] = "released"
    seconds: float = 0.0
    polls: int = 0
    cleaned: tuple[str, ...] = ()
    node: str = ""
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class LeftoverStopped(Fact):
    """An instance that an earlier (dead) run of this results database left running
    was stopped, and its GPU memory waited for."""

    kind: ClassVar[str] = "stopped_leftover"
    instance_of: int = 0
    signalled: tuple[int, ...] = ()
    killed: tuple[int, ...] = ()
    reason: str = ""
    node: str = ""


@dataclass(frozen=True)
class LeftoverAdopted(Fact):
    """An instance left running by an earlier run already runs the next trial's launch."""

    kind: ClassVar[str] = "adopted_leftover"
    instance_of: int = 0
    node: str = ""


@dataclass(frozen=True)
class NodeLost(Fact):
    """A slot's machine (or the slot's process there) was lost: Ray reported the slot's
    actor or its node dead. The trial it ran (``trial``) ends ``node_lost``; no more
    work goes to the slot, nor to the node when ``dead``."""

    kind: ClassVar[str] = "node_lost"
    node: str = ""
    node_id: str = ""
    slot: int = 0
    dead: bool = True
    """The node itself is gone (else only the slot's process died)."""
    message: str = ""
    """What the cluster said."""


@dataclass(frozen=True)
class OrphansCleaned(Fact):
    """Processes of servesweep's own earlier instances that were killed before the sweep."""

    kind: ClassVar[str] = "cleaned_before_sweep"
    cleaned: tuple[str, ...] = ()
    node: str = ""


@dataclass(frozen=True)
class BaselineTaken(Fact):
    """The GPU memory the release gate waits for on one machine, and where it came from
    (``measured`` on idle GPUs, or ``stored`` from an earlier run of this sweep)."""

    kind: ClassVar[str] = "baseline"
    node: str = ""
    bytes_by_gpu: Mapping[int, int] = field(default_factory=dict)
    source: str = "measured"


@dataclass(frozen=True)
class UnitRestored(Fact):
    """What became of a service the sweep ran through (systemd): as it was, or not."""

    kind: ClassVar[str] = "unit_restored"
    unit: str = ""
    message: str = ""
    node: str = ""


@dataclass(frozen=True)
class ConfirmStep(Fact):
    """A step of the confirm phase (``decide.confirm``), kept so that a rerun continues
    it and ``best`` can say what it changed. ``step``: ``round`` (a round begins:
    ``targets`` are the launches each candidate has once it is done, ``tied`` the tie
    set it starts from), ``round_done`` (with its ``seconds``), ``dropped`` (a
    relaunch of ``trial`` failed: no more rounds for it), ``done`` (with ``reason``)
    or ``reset`` (trials ran since: the earlier rounds no longer count)."""

    kind: ClassVar[str] = "confirm"
    step: str = ""
    round: int = 0
    targets: Mapping[str, int] = field(default_factory=dict)
    tied: tuple[int, ...] = ()
    relaunches: int = 0
    """Launches the round adds (``round``), or the phase added (``done``)."""
    seconds: float = 0.0
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class Screened(Fact):
    """What screening decided on one trial's short levels (``decide.screening``):
    ``kept`` (it can still win: measured in full) or not, with ``reason``; ``attempt``
    is the trial's attempt it decided in (a decision of an earlier one no longer counts)."""

    kind: ClassVar[str] = "screening"
    kept: bool = True
    reason: str = ""
    attempt: int = 0


@dataclass(frozen=True)
class SweepWarning(Fact):
    kind: ClassVar[str] = "warning"
    message: str = ""


@dataclass(frozen=True)
class ConfigMismatched(SweepWarning):
    """The ready server of a trial does not run a swept parameter as asked
    (:mod:`servesweep.servers.config_check`): a warning, stored with the values."""

    kind: ClassVar[str] = "config_mismatch"
    param: str = ""
    asked: Any = None
    engine: Any = None
    """What the engine reports it runs."""
    source: str = ""
    """Where the engine said it (``/props default_generation_settings.n_ctx``)."""


def headline(result: LevelResult) -> dict[str, float]:
    """The few metrics a progress line shows for one level."""
    keys = ("output_throughput", "ttft_p99_ms", "tpot_mean_ms", "pass_rate", "error_rate")
    values = result.metrics
    return {k: values[k] for k in keys if k in values and not math.isnan(values[k])}


# -- observers ---------------------------------------------------------------------------


class Observer(Protocol):
    def event(self, event: Event) -> None: ...


class NullObserver:
    def event(self, event: Event) -> None:
        return None


class JsonLinesObserver:
    """Writes each event as one JSON line: ``{"t": ..., "event": kind, ...fields}``.

    ``progress`` and ``telemetry`` are left out unless ``progress`` is set."""

    _CHATTY = frozenset({"progress", "telemetry", "phase_seconds"})

    def __init__(self, stream: IO[str], *, progress: bool = False) -> None:
        self._stream = stream
        self._progress = progress

    def event(self, event: Event) -> None:
        if event.kind in self._CHATTY and not self._progress:
            return
        record = {"t": round(time.time(), 6), "event": event.kind, **event.to_json()}
        self._stream.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
        self._stream.flush()


class Tee:
    def __init__(self, observers: Sequence[Observer]) -> None:
        self._observers = list(observers)

    def event(self, event: Event) -> None:
        for observer in self._observers:
            observer.event(event)
