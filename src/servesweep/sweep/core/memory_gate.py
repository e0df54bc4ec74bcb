"""The memory gate: a configuration predicted not to fit is not launched.

Before the driver queues a trial, :class:`MemoryGate` predicts its memory per GPU
(:mod:`servesweep.servers.memory`). A configuration over its capacity by more than the
margin is finished ``skipped`` with reason ``predicted_oom`` and the prediction as
evidence; the search is told it as infeasible (search/verdict.py) and proposes
another. It applies to a sampling search, and to a grid when the sweep file says
``search.predict: skip``; ``search.predict: off`` or ``run --no-predict`` turn it off.
A prediction whose verdict is ``unknown`` never stops a launch.

After each measured trial, :meth:`MemoryGate.learn` reads the engine's own memory
figures from its log (:mod:`servesweep.servers.memory.calibrate`) and corrects the
predictor for the rest of the sweep; the prediction and the measurement of every
launched trial are stored as a ``memory`` event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from servesweep.models import Evidence, Outcome
from servesweep.servers.memory import Calibration, MemoryModel, MemoryPrediction
from servesweep.servers.memory.calibrate import Calibrator, read_measured
from servesweep.spec.schema import SweepSpec
from servesweep.spec.slots import params_label
from servesweep.store import TrialRecord
from servesweep.sweep.events import Fact, TrialFinished

__all__ = ["PREDICTED_OOM", "MemoryChecked", "MemoryGate"]

PREDICTED_OOM = "predicted_oom"
GiB = 2**30


@dataclass(frozen=True)
class MemoryChecked(Fact):
    """A trial's predicted memory (before its launch) and, once it ran, what the
    engine reported it used (bytes per device, by component)."""

    kind: ClassVar[str] = "memory"
    predicted: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)


class MemoryGate:
    """The driver's memory check (see the module doc)."""

    def __init__(self, spec: SweepSpec, enabled: bool = True) -> None:
        mode = spec.search.predict
        self.active = enabled and mode != "off"
        """Predictions are made and stored."""
        self.skips = self.active and (spec.search.samples or mode == "skip")
        """A certain OOM is skipped (not only predicted)."""
        self.model = MemoryModel.of_sweep(spec) if self.active else None
        self.calibrator = Calibrator(spec.server.engine)
        self._predicted: dict[int, tuple[MemoryPrediction, Calibration]] = {}
        self.notes: list[str] = []
        """Warnings for the sweep (taken by the driver)."""
        self._told_verbosity = False

    def check(self, trial: TrialRecord) -> TrialFinished | None:
        """The trial's end when it must not be launched (None: launch it)."""
        if self.model is None:
            return None
        predicted = self.model.predict(trial.params)
        self._predicted[trial.id] = (predicted, self.model.calibration)
        if not (self.skips and predicted.certain_oom):
            return None
        message = (
            f"{params_label(trial.params)} is predicted not to fit: {predicted.reason}; "
            f"{predicted.per_gpu_bytes / GiB:.1f} GiB per device against "
            f"{predicted.capacity / GiB:.1f} GiB (margin {predicted.margin / GiB:.2f} GiB); "
            "not launched (run --no-predict to launch it anyway)"
        )
        evidence = Evidence(
            message=message,
            reason=PREDICTED_OOM,
            details={"predicted_memory": predicted.to_json()},
        )
        return TrialFinished(
            trial=trial.id, outcome=Outcome.SKIPPED, evidence=evidence, at=time.time()
        )

    def learn(self, trial: TrialRecord) -> MemoryChecked | None:
        """After a trial: its prediction and the engine's figures (from its log), and
        the predictor corrected by them."""
        made = self._predicted.pop(trial.id, None)
        if made is None or self.model is None:
            return None
        predicted, applied = made
        measured = read_measured(self.model.engine, trial.log_path) if trial.log_path else None
        if measured is not None:
            self.model.learn(self.calibrator.add(predicted, measured, applied))
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
        )
