"""The memory gate: a configuration predicted not to fit is not launched.

The decision is :mod:`servesweep.decide.memory`'s (fit or skip, and what the user is
told); this module carries it out and stores it. When the driver places a trial on a
slot (not when it queues it: a grid queues its plan at the start), :class:`MemoryGate`
predicts its memory per GPU (:mod:`servesweep.servers.memory`) with the calibration of
the trials measured by then. A configuration over its capacity by more than the margin
is finished ``skipped`` with reason ``predicted_oom`` and the prediction as evidence;
the search is told it as infeasible (decide/verdict.py) and proposes another. It
applies to a sampling search, and to a grid when the sweep file says
``search.predict: skip``; ``search.predict: off`` or ``run --no-predict`` turn it off.
A prediction whose verdict is ``unknown`` never stops a launch.

After each measured trial, :meth:`MemoryGate.learn` reads the engine's own memory
figures from its log (:mod:`servesweep.servers.memory.calibrate`) and corrects the
predictor for the rest of the sweep; the prediction and the measurement of every
launched trial are stored as a ``memory`` event. What the trial's server held on its
GPUs (:meth:`MemoryGate.saw`: the slot's GPU samples from the trial's first start on,
less the machine's baseline; NVML on a real GPU) goes with the engine's figures as
:attr:`~servesweep.servers.memory.calibrate.MeasuredMemory.device_used`: for
llama.cpp on a GPU it calibrates the memory no buffer report shows (the CUDA context,
cuBLAS, the memory pool).

A later run of the sweep (a resume) rebuilds the calibration from those events, in the
order they were stored: each carries the calibration its prediction was made with
(``applied``) and its trial's end (``ended``), so the gate predicts what the gate of the
run that measured them predicted, at its end and, for a point of the history
(:meth:`MemoryGate.over_by`'s ``at``: what a resumed search reads while it replays), as
of then. An event stored before it carried ``applied`` is taken as made with the
calibration of the events before it (true when the trials ran one at a time).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, ClassVar

from servesweep.decide.memory import gate_of, skip_evidence
from servesweep.models import Outcome
from servesweep.records import TelemetryPoint
from servesweep.servers.memory import Calibration, MemoryModel, MemoryPrediction
from servesweep.servers.memory.calibrate import Calibrator, MeasuredMemory, read_measured
from servesweep.spec.schema import SweepSpec
from servesweep.spec.slots import params_label
from servesweep.store import Store, TrialRecord
from servesweep.sweep.events import Fact, TrialFinished

__all__ = ["MemoryChecked", "MemoryGate"]


@dataclass(frozen=True)
class MemoryChecked(Fact):
    """A trial's predicted memory (before its launch) and, once it ran, what the
    engine reported it used (bytes per device, by component)."""

    kind: ClassVar[str] = "memory"
    predicted: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)
    applied: dict[str, Any] = field(default_factory=dict)
    """The calibration the prediction was made with (what a later run rebuilds the
    calibration from, with ``predicted`` and ``measured``)."""
    ended: float | None = None
    """The trial's end (its ``finished_at``): the calibration it gives holds from then."""


def _calibration(data: Mapping[str, Any]) -> Calibration:
    names = {f.name for f in fields(Calibration)}
    return Calibration(**{k: v for k, v in data.items() if k in names})


class MemoryGate:
    """The driver's memory check (see the module doc)."""

    def __init__(
        self, spec: SweepSpec, enabled: bool = True, stored: Iterable[Mapping[str, Any]] = ()
    ) -> None:
        """``stored``: the sweep's ``memory`` events (``Store.events``), which a later
        run rebuilds the calibration from (see the module doc)."""
        self.gate = gate_of(spec.search.predict, bool(spec.search.samples), enabled)
        self.model = MemoryModel.of_sweep(spec) if self.gate.active else None
        self.calibrator = Calibrator(spec.server.engine)
        self._predicted: dict[int, tuple[MemoryPrediction, Calibration]] = {}
        self.notes: list[str] = []
        """Warnings for the sweep (taken by the driver)."""
        self._told_verbosity = False
        self._started: dict[int, float] = {}
        self._held: dict[int, int] = {}
        self._learned: list[tuple[float, Calibration]] = []
        """The calibration after each trial that changed it, with the trial's end."""
        for event in stored:
            self._rebuild(event)

    @classmethod
    def of_sweep(cls, spec: SweepSpec, store: Store, sweep_id: int, enabled: bool) -> MemoryGate:
        """The gate of sweep ``sweep_id``, calibrated as its earlier runs left it (a
        resume: the stored ``memory`` events)."""
        return cls(spec, enabled, store.events(sweep_id, MemoryChecked.kind))

    def check(self, trial: TrialRecord) -> TrialFinished | None:
        """The trial's end when it must not be launched (None: launch it)."""
        if self.model is None:
            return None
        predicted = self.model.predict(trial.params)
        self._predicted[trial.id] = (predicted, self.model.calibration)
        evidence = skip_evidence(self.gate, params_label(trial.params), predicted)
        if evidence is None:
            return None
        return TrialFinished(
            trial=trial.id, outcome=Outcome.SKIPPED, evidence=evidence, at=time.time()
        )

    def over_by(self, params: Mapping[str, Any], at: float | None = None) -> int | None:
        """The predicted memory of ``params`` beyond its capacity (bytes, negative: room
        left; None: no prediction or an unknown one) with the calibration of the trials
        that ended by ``at`` (their ``finished_at``; None: every trial so far): what a
        guided search reads to keep clear of the memory margin, as of each stored
        trial it replays (``search.base.MemoryOver``)."""
        if self.model is None:
            return None
        predicted = self.model.predict(params, self.calibration_at(at))
        return None if predicted.verdict == "unknown" else predicted.over_by

    def calibration_at(self, at: float | None = None) -> Calibration | None:
        """The calibration the trials that ended by ``at`` gave (None: the latest)."""
        if at is None or self.model is None:
            return None
        learned = [c for ended, c in self._learned if ended <= at]
        return learned[-1] if learned else Calibration()

    def started(self, trial: int, at: float) -> None:
        """Trial ``trial``'s server was started at ``at`` (wall clock): GPU samples
        from then on are its own (before it, the slot stopped the previous instance)."""
        if trial in self._predicted:
            self._started.setdefault(trial, at)

    def saw(
        self, trial: int, points: Iterable[TelemetryPoint], baseline: Mapping[int, int]
    ) -> None:
        """GPU samples taken during ``trial``: the most its server held on one of its
        GPUs, above that GPU's ``baseline`` (the machine's idle memory), is kept for
        :meth:`learn`. Samples before its start, or of a GPU without a baseline
        (no probe), are left out."""
        since = self._started.get(trial)
        if since is None or not baseline:
            return
        for point in points:
            base = baseline.get(point.gpu)
            if base is None or point.t < since:
                continue
            held = max(point.used_bytes - base, 0)
            self._held[trial] = max(self._held.get(trial, 0), held)

    def learn(self, trial: TrialRecord) -> MemoryChecked | None:
        """After a trial: its prediction, the engine's figures (from its log) with what
        its server held on the GPU (:meth:`saw`), and the predictor corrected by them."""
        made = self._predicted.pop(trial.id, None)
        self._started.pop(trial.id, None)
        held = self._held.pop(trial.id, 0)
        if made is None or self.model is None:
            return None
        predicted, applied = made
        measured = read_measured(self.model.engine, trial.log_path) if trial.log_path else None
        if held and predicted.device == "gpu":
            if measured is None:  # no figures of its own: what the GPU saw is recorded
                measured = MeasuredMemory(self.model.engine, device="GPU", device_used=held)
            else:
                measured = replace(measured, device_used=held)
        if measured is not None and measured.known:
            self._learn(predicted, measured, applied, trial.finished_at or time.time())
        elif self.model.engine == "llama-server" and trial.log_path and not self._told_verbosity:
            self._told_verbosity = True
            self.notes.append(
                f"trial {trial.id}: llama-server printed no buffer sizes, so its memory "
                "cannot calibrate the prediction: add 'log-verbosity: 4' to server.args "
                "(llama-server prints them at -lv 4)"
            )
        return MemoryChecked(
            trial=trial.id,
            predicted=predicted.to_json(),
            measured=measured.to_json() if measured is not None else {},
            applied=asdict(applied),
            ended=trial.finished_at,
        )

    def _rebuild(self, event: Mapping[str, Any]) -> None:
        """One stored ``memory`` event's share of the calibration (module doc)."""
        if self.model is None or not event.get("measured"):
            return
        measured = MeasuredMemory.from_json(self.model.engine, event["measured"])
        if not measured.known:
            return
        predicted = MemoryPrediction.from_json(event.get("predicted") or {})
        applied = event.get("applied")
        before = _calibration(applied) if applied else self.model.calibration
        ended = event.get("ended")
        self._learn(predicted, measured, before, float(ended or event.get("t") or 0.0))

    def _learn(
        self,
        predicted: MemoryPrediction,
        measured: MeasuredMemory,
        applied: Calibration,
        ended: float,
    ) -> None:
        calibration = self.calibrator.add(predicted, measured, applied)
        assert self.model is not None
        self.model.learn(calibration)
        self._learned.append((ended, calibration))
