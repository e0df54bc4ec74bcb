"""What the store returns: frozen records of sweeps, trials and results.

Reports are built from these alone (``SweepData``), so a report can be rendered from
any store, finished or still running, and tests can craft them directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from servesweep.models import Evidence, FailureClass, InstanceRecord, LevelResult, Outcome, Phase

__all__ = ["ReopenedSkip", "SweepData", "SweepRecord", "TelemetryPoint", "TrialRecord"]


@dataclass(frozen=True)
class SweepRecord:
    id: int
    name: str
    spec_path: str
    spec_text: str
    spec_hash: str
    created_at: float
    servesweep_version: str
    environment: Mapping[str, Any] = field(default_factory=dict)
    """GPU names, driver, engine version, hostname, python... (no secrets)."""
    finished_at: float | None = None


@dataclass(frozen=True)
class TrialRecord:
    id: int
    sweep_id: int
    seq: int
    """Position in the plan (run order)."""
    fingerprint: str
    params: Mapping[str, Any]
    outcome: Outcome
    failure_class: FailureClass | None = None
    evidence: Evidence | None = None
    phase: Phase | None = None
    """The phase the trial is in (running) or reached last."""
    phase_started: Mapping[str, float] = field(default_factory=dict)
    """Wall-clock start of each phase entered, by phase name."""
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    """Duration of each finished phase, by phase name (``stop``, ``release``...)."""
    instance: InstanceRecord | None = None
    log_path: str | None = None
    attempts: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    in_plan: bool = True
    """False for points that an edited sweep file no longer contains (history kept)."""
    adopted: bool = False
    """True when the trial used a server that was already running with its config."""
    launch_command: str | None = None
    """The exact command (or unit/container description) that started the instance."""
    node: str = ""
    """Hostname of the machine the latest attempt ran on ('' before it ran)."""
    node_id: str = ""
    """The cluster's id of that machine (Ray's node id) when a cluster ran it."""
    slot: int | None = None
    """The slot (lane) of that machine the attempt ran in; its port derives from it."""
    gpus: tuple[int, ...] = ()
    """The GPU indexes (on ``node``) the attempt was given."""
    sweep_number: int = 0
    """The trial's number within its sweep (1, 2, ... in the order trials were added);
    0 when not known. ``id`` is the database's key, shared by every sweep in it."""

    @property
    def number(self) -> int:
        """What a person reads and types (``#3``, ``--trial 3``): the number within the
        sweep, so each sweep of a shared database counts from 1."""
        return self.sweep_number or self.id

    @property
    def lane(self) -> str:
        """``node/slot`` label of where the trial ran, for timelines and status."""
        if self.slot is None:
            return self.node or "-"
        return f"{self.node or '-'}/{self.slot}"

    @property
    def gpu_seconds(self) -> float:
        """GPU-seconds the latest attempt held: wall time × GPUs given (at least one)."""
        if self.started_at is None or self.finished_at is None:
            return 0.0
        return max(0.0, self.finished_at - self.started_at) * max(1, len(self.gpus))


@dataclass(frozen=True)
class TelemetryPoint:
    trial_id: int
    t: float
    """Wall-clock time."""
    gpu: int
    used_bytes: int
    utilization_pct: float | None = None
    power_w: float | None = None
    node: str = ""
    """Hostname of the machine whose GPU ``gpu`` is."""


@dataclass(frozen=True)
class ReopenedSkip:
    """A trial skipped as predicted worse and then made pending again, to be launched
    before its sweep ends because its predicted interval still reached the leader's
    value (a ``reopened`` event, written by ``sweep/core/predict_gate``): when it was
    skipped and the evidence of that skip (its prediction, the leader then), which the
    trial's record, holding its launch, no longer shows."""

    kind: ClassVar[str] = "reopened"
    """The kind of the store's events that hold it."""
    trial: int
    skipped_at: float
    evidence: Evidence

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> ReopenedSkip | None:
        """The record back from a stored event (``Store.events``); None when it names
        no trial."""
        trial = data.get("trial")
        if not isinstance(trial, int):
            return None
        evidence = data.get("evidence")
        return cls(
            trial=trial,
            skipped_at=float(data.get("skipped_at") or 0.0),
            evidence=Evidence.from_dict(evidence if isinstance(evidence, Mapping) else {}),
        )

    @classmethod
    def by_trial(cls, events: Iterable[Mapping[str, Any]]) -> dict[int, tuple[ReopenedSkip, ...]]:
        """The stored ``reopened`` events of a sweep, per trial id, in order."""
        out: dict[int, list[ReopenedSkip]] = {}
        for event in events:
            fact = cls.of(event)
            if fact is not None:
                out.setdefault(fact.trial, []).append(fact)
        return {trial: tuple(facts) for trial, facts in out.items()}

    def to_json(self) -> dict[str, Any]:
        """The skip as ``status --json`` and the report's trials show it: when, on
        which prediction, against which leader (or which constraint)."""
        details = self.evidence.details
        predicted = details.get("predicted_performance")
        return {
            "skipped_at": self.skipped_at,
            "reason": self.evidence.reason,
            "predicted": dict(predicted) if isinstance(predicted, Mapping) else {},
            "leader": details.get("leader"),
            "constraint": details.get("constraint"),
        }

    def skip(self, trial: TrialRecord) -> TrialRecord:
        """``trial`` as it was when skipped: what the search was told then."""
        return replace(
            trial,
            outcome=Outcome.SKIPPED,
            failure_class=None,
            evidence=self.evidence,
            phase=None,
            phase_started={},
            phase_seconds={},
            instance=None,
            started_at=None,
            finished_at=self.skipped_at,
        )


@dataclass(frozen=True)
class SweepData:
    """Everything a report needs about one sweep."""

    sweep: SweepRecord
    trials: tuple[TrialRecord, ...]
    results: Mapping[int, tuple[LevelResult, ...]]
    """Level results by trial id (latest attempt only)."""
    telemetry: tuple[TelemetryPoint, ...] = ()
    objective: Mapping[str, Any] | None = None
    """The sweep file's objective as a dict (see spec.schema.Objective)."""
    constraints: tuple[str, ...] = ()
    include_unreliable: bool = False
    """The sweep file's ``include_unreliable``: levels marked unreliable count for
    ``best`` (default: they are left out)."""
    memory: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    """Per trial id: its predicted memory and what the engine reported
    (``{"predicted": {...}, "measured": {...}}``, bytes; the latest attempt)."""
    performance: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    """Per trial id: its performance predicted at its placement and what it measured
    (``{"predicted": {metric: prediction}, "measured": {metric: value}, "widen":
    {...}}``; the latest launch; ``performance`` events, ``sweep/core/predict_gate``)."""
    confirm: tuple[Mapping[str, Any], ...] = ()
    """The confirm phase's stored steps, in order (``confirm`` events: rounds, the
    relaunches that failed, how it ended; see ``decide.confirm``)."""
    screening: Mapping[int, tuple[LevelResult, ...]] = field(default_factory=dict)
    """The levels of the screening pass by trial id (latest attempt; only trials that
    had one): stored apart from ``results``, which they never enter."""
    screened: tuple[Mapping[str, Any], ...] = ()
    """What screening decided, one ``screening`` event per decision (``kept`` or
    not, why, when), in order."""
    mismatches: tuple[Mapping[str, Any], ...] = ()
    """Swept parameters a trial's server did not run as asked, as the engine said
    (``config_mismatch`` events: ``trial``, ``t``, ``param``, ``asked``, ``engine``,
    ``source``), in order."""
    reopened: Mapping[int, tuple[ReopenedSkip, ...]] = field(default_factory=dict)
    """Per trial id: its skips as predicted worse that were reopened (launched before
    the end after all), in order; ``reopened`` events."""
