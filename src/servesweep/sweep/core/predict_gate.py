"""The performance gate: a configuration predicted not to beat the best so far is not
launched, and every launched one verifies its prediction.

The decision is :mod:`servesweep.decide.perf.gate`'s (launch or skip, and what the user
is told), on :func:`servesweep.decide.perf.predict`'s prediction; this module carries it
out and stores it, the way :mod:`.memory_gate` does for memory. When the driver places a
trial on a slot, :meth:`PredictGate.check` predicts every configuration of the sweep's
space from the trials measured so far in this sweep and the earlier sweeps that count
(``sweep.core.earlier``: the same name, engine, model, GPUs and workloads; a warm start,
which the sampling search's guide is given too), with the
:class:`~servesweep.decide.perf.Trust` the sweep has earned; a configuration not worth a
launch is finished ``skipped`` with reason ``predicted_worse`` and its prediction as
evidence (the search is told it as stopped early at its predicted value,
``decide.verdict``). It applies when the memory gate would skip (a sampling search; a
grid with ``search.predict: skip``) and the sweep has one objective; ``search.predict:
off`` or ``run --no-predict`` turn it off.

After each launched trial, :meth:`PredictGate.learn` stores the prediction made at its
placement beside what it measured (a ``performance`` event) and widens the trust of a
metric whose measurement missed the interval (:func:`~servesweep.decide.perf.verify`);
a later run rebuilds the trust from those events. Before the sweep ends,
:meth:`PredictGate.still_open` names the skipped trials that must be launched after
all (their interval still reaches the leader's value); :meth:`PredictGate.reopen` keeps
each one's skip as a ``reopened`` fact (:class:`Reopened`), so that a rerun replays it
to the sampler where the sampler was told it (``search_source.search_history``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from servesweep.decide.memory import gate_of
from servesweep.decide.perf import Prediction, Setting, Trust, predict, verify
from servesweep.decide.perf.gate import (
    PREDICTED_WORSE,
    Leader,
    prediction_of,
    skip_evidence,
    still_open,
)
from servesweep.decide.perf.inputs import History, measured_of, perf_setting
from servesweep.decide.verdict import Goal, VerdictKind, judge
from servesweep.models import Evidence, Outcome
from servesweep.records import ReopenedSkip
from servesweep.search.base import goal_of
from servesweep.servers.engines import get_preset
from servesweep.spec.schema import SweepSpec
from servesweep.spec.slots import params_label
from servesweep.spec.space import build_space
from servesweep.store import Store, SweepRecord, TrialRecord
from servesweep.sweep.core.earlier import earlier_sweeps
from servesweep.sweep.events import Fact, TrialFinished

__all__ = [
    "PerformanceChecked",
    "PredictGate",
    "Reopened",
    "decide_launch",
    "guide_of",
    "leader_of",
    "setting_of",
]


@dataclass(frozen=True)
class PerformanceChecked(Fact):
    """A launched trial's performance as predicted at its placement and as measured,
    with the trust (widening per metric) the sweep has after it."""

    kind: ClassVar[str] = "performance"
    predicted: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)
    widen: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Reopened(Fact):
    """A trial skipped as predicted worse, made pending again to launch before the end
    (:meth:`PredictGate.reopen`): when it was skipped and why, which its record then
    no longer holds. Read back as a :class:`~servesweep.records.ReopenedSkip` (the
    search's replay, the report, ``status``)."""

    kind: ClassVar[str] = ReopenedSkip.kind
    skipped_at: float = 0.0
    evidence: dict[str, Any] = field(default_factory=dict)


def setting_of(spec: SweepSpec) -> Setting:
    """What the predictor is told of ``spec``, with its engine's speculative params
    (the draft length, the drafter's, those naming a draft model)."""
    preset = get_preset(spec.server.engine)
    return perf_setting(
        spec, preset.draft_length_param, preset.spec_params, preset.draft_model_params
    )


def guide_of(spec: SweepSpec, enabled: bool) -> Setting | None:
    """What a sampling search is told of the performance predictor, so that it launches
    first what the prediction says can win (``search.create_search``'s ``guide``):
    the gate's setting when the gate skips (``search.predict`` not ``off``, a sampling
    search, one objective, not ``run --no-predict``: ``enabled``); else None."""
    gate = gate_of(spec.search.predict, bool(spec.search.samples), enabled)
    if not gate.skips or not spec.search.samples or len(goal_of(spec).objectives) != 1:
        return None
    setting = setting_of(spec)
    return setting if setting.metrics else None


def leader_of(goal: Goal, history: History) -> Leader | None:
    """The best feasible measured value of the sweep's one objective (None: none yet,
    or several objectives)."""
    if len(goal.objectives) != 1:
        return None
    ref, direction = goal.objectives[0]
    best: Leader | None = None
    for trial, results in history:
        verdict = judge(goal, trial, results)
        value = verdict.values[0]
        if verdict.kind is not VerdictKind.COMPLETE or not verdict.feasible or value is None:
            continue
        if best is None or (value > best.value if direction == "max" else value < best.value):
            best = Leader(ref.key, direction, value, trial.id)
    return best


def decide_launch(
    predictions: Mapping[str, Prediction],
    goal: Goal,
    leader: Leader | None,
    threshold: float,
    label: str,
) -> Evidence | None:
    """Whether the configuration whose predictions are ``predictions`` is worth a
    launch: None, or the evidence of its skip
    (:func:`~servesweep.decide.perf.gate.skip_evidence`)."""
    return skip_evidence(label, predictions, leader, threshold, goal.constraints)


class PredictGate:
    """The driver's performance check (see the module doc)."""

    def __init__(self, spec: SweepSpec, store: Store, sweep: SweepRecord, enabled: bool) -> None:
        self.spec = spec
        self.store = store
        self.sweep_id = sweep.id
        self.goal = goal_of(spec)
        gate = gate_of(spec.search.predict, bool(spec.search.samples), enabled)
        self.active = gate.active
        """Predictions are made and verified."""
        self.skips = gate.skips and len(self.goal.objectives) == 1
        """A configuration predicted worse is skipped (not only predicted)."""
        self.setting = setting_of(spec)
        self.threshold = spec.decision.threshold
        space = build_space(spec.params)
        self.space = [c.params for c in space.allowed()] if space.enumerable else []
        past = earlier_sweeps(store, spec, store.sweep(sweep.id))
        self.earlier = measured_of(self._history(*past.ids)) if self.active else []
        """The earlier sweeps' measurements (``sweep.core.earlier``): the gate's warm
        start, and the sampling search's (``run`` gives them to its guide)."""
        self.notes = past.notes(len(self.earlier)) if self.active else []
        """Which earlier sweeps start the prediction, and which do not (for the user)."""
        self.trust = Trust()
        for stored in store.events(sweep.id, "performance"):
            self.trust = self._verified(self.trust, stored["predicted"], stored["measured"])
        self.forced: set[int] = set(
            ReopenedSkip.by_trial(store.events(sweep.id, ReopenedSkip.kind))
        )
        """Trials launched before the end as still open (reopened, in this run or an
        earlier one that ended before their launch): never skipped again."""
        self._made: dict[int, dict[str, Prediction]] = {}

    def _history(self, *sweep_ids: int) -> History:
        return [
            (t, self.store.results(t.id, with_samples=False))
            for sweep_id in sweep_ids
            for t in self.store.trials(sweep_id)
        ]

    @staticmethod
    def _verified(trust: Trust, predicted: Mapping[str, Any], measured: Mapping[str, Any]) -> Trust:
        for metric, data in predicted.items():
            value = measured.get(metric)
            if isinstance(value, int | float) and isinstance(data, Mapping):
                trust = verify(trust, prediction_of(data), float(value))
        return trust

    def _leader(self, history: History) -> Leader | None:
        return leader_of(self.goal, history)

    def _predict(
        self, configs: Sequence[Mapping[str, Any]], history: History
    ) -> list[dict[str, Prediction]]:
        measured = measured_of(history)
        return predict(self.setting, configs, measured, self.earlier, self.trust)

    def check(self, trial: TrialRecord) -> TrialFinished | None:
        """The trial's end when it must not be launched (None: launch it); the
        prediction made now is kept for :meth:`learn`."""
        if not self.active or not self.setting.metrics:
            return None
        history = self._history(self.sweep_id)
        done = {t.fingerprint for t, _ in history if t.outcome.final and t.id != trial.id}
        done_params = [dict(t.params) for t, _ in history if t.fingerprint in done]
        # predicted beside every configuration not finished, as the guide and `plan`
        # predict them (the empirical model's ranges are those of what is left)
        others = [p for p in self.space if p != dict(trial.params) and p not in done_params]
        predictions = self._predict([dict(trial.params), *others], history)
        mine = predictions[0]
        self._made[trial.id] = mine
        if not self.skips or trial.id in self.forced:
            return None
        evidence = decide_launch(
            mine,
            self.goal,
            self._leader(history),
            self.threshold,
            params_label(trial.params),
        )
        if evidence is None:
            return None
        self._made.pop(trial.id, None)
        return TrialFinished(
            trial=trial.id, outcome=Outcome.SKIPPED, evidence=evidence, at=time.time()
        )

    def learn(self, trial: TrialRecord) -> PerformanceChecked | None:
        """After a launched trial: its prediction against its measurement, and the
        trust widened where the measurement missed."""
        made = self._made.pop(trial.id, None)
        if made is None:
            return None
        measured = measured_of([(trial, self.store.results(trial.id, with_samples=False))])
        if not measured:
            return None
        values = {m: measured[0].metrics[m] for m in made if m in measured[0].metrics}
        predicted = {m: p.to_json() for m, p in made.items()}
        self.trust = self._verified(self.trust, predicted, values)
        return PerformanceChecked(
            trial=trial.id, predicted=predicted, measured=values, widen=dict(self.trust.widen)
        )

    def reopen(self, trial: TrialRecord) -> TrialRecord:
        """A trial :meth:`still_open` named, pending again and never skipped again; its
        skip is kept as a :class:`Reopened` fact."""
        if trial.evidence is not None and trial.finished_at is not None:
            fact = Reopened(
                trial=trial.id, skipped_at=trial.finished_at, evidence=trial.evidence.to_dict()
            )
            data = fact.to_json()
            data.pop("trial", None)
            self.store.add_event(self.sweep_id, fact.kind, data, trial.id)
        self.store.reset_trial(trial.id)
        self.forced.add(trial.id)
        return self.store.trial(trial.id)

    def still_open(self) -> list[TrialRecord]:
        """The trials skipped as predicted worse whose interval, with the trust the
        sweep has now, still reaches the leader's value: to launch before the end."""
        if not self.skips:
            return []
        history = self._history(self.sweep_id)
        skipped = [
            t
            for t, _ in history
            if t.outcome is Outcome.SKIPPED
            and t.evidence is not None
            and t.evidence.reason == PREDICTED_WORSE
        ]
        if not skipped:
            return []
        leader = self._leader(history)
        predictions = self._predict([dict(t.params) for t in skipped], history)
        return [
            t
            for t, p in zip(skipped, predictions, strict=True)
            if still_open(p, leader, self.goal.constraints)
        ]
