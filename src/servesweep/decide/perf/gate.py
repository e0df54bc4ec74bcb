"""Launch or skip: whether a configuration is worth a launch, on its predicted
performance (:func:`servesweep.decide.perf.predict`).

- **worse by the threshold**: a configuration whose predicted interval for the
  objective cannot beat the best measured so far (the leader) by the sweep file's
  ``decision.threshold`` is not launched: for a maximised objective, the leader's
  value exceeds the interval's top by more than the threshold of it (the same test
  as screening's). A configuration predicted to violate a constraint with certainty
  (its whole interval on the wrong side of the limit) is not launched either.
- **never on no evidence**: an ``unknown`` prediction (too few measurements, far from
  anything measured), no leader yet, or a sweep of several objectives launch.
- **the predicted best is launched**: the sweep's predicted best is either measured
  (the leader: verified) or a configuration not measured yet predicted to beat the
  leader, whose interval then reaches the leader's value, so the rule above launches
  it. A configuration predicted below the leader by its whole interval is not launched
  to check the model: the model is checked on every launch (a miss widens the
  intervals, :class:`~servesweep.decide.perf.Trust`) and at the end (below).
- **before the sweep ends**: a skipped configuration whose interval, drawn with the
  sweep's current :class:`~servesweep.decide.perf.Trust`, still reaches the leader's
  value (and no constraint rules out) is launched (:func:`still_open`), so ``best``
  never names a configuration that was only predicted.

``sweep/core/predict_gate.py`` carries it out when the driver places a trial on a
slot, and stores it; the skipped trial ends ``skipped`` with reason
``predicted_worse`` and the prediction as evidence, and the search is told it as
stopped early at its predicted value (``decide.verdict``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from servesweep.decide.perf.records import Prediction
from servesweep.models import Evidence
from servesweep.spec.constraints import Constraint

__all__ = [
    "PREDICTED_WORSE",
    "Leader",
    "beaten",
    "prediction_of",
    "rules_out",
    "skip_evidence",
    "skipped_as",
    "still_open",
]

PREDICTED_WORSE = "predicted_worse"
"""The reason of a trial skipped because it was predicted not to beat the leader."""


@dataclass(frozen=True)
class Leader:
    """The best feasible measured value of the objective so far."""

    metric: str
    direction: Literal["max", "min"]
    value: float
    trial: int

    @property
    def maximize(self) -> bool:
        return self.direction == "max"


def beaten(p: Prediction, leader: Leader, threshold: float) -> bool:
    """Whether the leader beats the whole interval of ``p`` by more than ``threshold``
    (relative); an unknown prediction is never beaten."""
    if p.low is None or p.high is None:
        return False
    bar = leader.value
    if leader.maximize:
        return bar - p.high > threshold * abs(bar)
    return p.low - bar > threshold * abs(bar)


def rules_out(p: Prediction | None, constraint: Constraint) -> bool:
    """Whether the whole interval of ``p`` violates ``constraint`` (an order
    constraint: ``<``, ``<=``, ``>``, ``>=``); unknown never does."""
    if p is None or p.low is None or p.high is None:
        return False
    if constraint.op not in ("<", "<=", ">", ">="):
        return False
    return constraint.check(p.low) is False and constraint.check(p.high) is False


def _ruled_out(
    predictions: Mapping[str, Prediction], constraints: Sequence[Constraint]
) -> Constraint | None:
    for c in constraints:
        if rules_out(predictions.get(c.ref.key), c):
            return c
    return None


def skip_evidence(
    label: str,
    predictions: Mapping[str, Prediction],
    leader: Leader | None,
    threshold: float,
    constraints: Sequence[Constraint] = (),
) -> Evidence | None:
    """The evidence of a skipped trial when its configuration (``label``) is not worth
    a launch (None: launch it); see the module doc."""
    details: dict[str, Any] = {
        "predicted_performance": {m: q.to_json() for m, q in predictions.items()},
        "threshold": threshold,
    }
    how = "run --no-predict to launch it anyway"
    violated = _ruled_out(predictions, constraints)
    if violated is not None:
        got = predictions[violated.ref.key]
        details["constraint"] = str(violated)
        return Evidence(
            message=f"{label} is predicted to violate {violated}: {violated.ref.key} "
            f"{got.value:.4g} [{got.low:.4g}-{got.high:.4g}] ({got.basis}); "
            f"not launched ({how})",
            reason=PREDICTED_WORSE,
            details=details,
        )
    if leader is None:
        return None
    p = predictions.get(leader.metric)
    if p is None or not beaten(p, leader, threshold):
        return None
    details["leader"] = {"trial": leader.trial, "metric": leader.metric, "value": leader.value}
    return Evidence(
        message=f"{label} is predicted worse than the best so far (#{leader.trial}, "
        f"{leader.metric} {leader.value:.4g}) by more than {threshold:.0%}: "
        f"{p.value:.4g} [{p.low:.4g}-{p.high:.4g}] ({p.basis}); not launched ({how})",
        reason=PREDICTED_WORSE,
        details=details,
    )


def still_open(
    predictions: Mapping[str, Prediction],
    leader: Leader | None,
    constraints: Sequence[Constraint] = (),
) -> bool:
    """Whether a skipped configuration must be launched before the sweep ends: its
    interval (with the current trust) still reaches the leader's value and no
    constraint rules it out."""
    if _ruled_out(predictions, constraints) is not None:
        return False
    if leader is None:
        return True
    p = predictions.get(leader.metric)
    return p is None or p.reaches(leader.value, leader.maximize)


def prediction_of(data: Mapping[str, Any]) -> Prediction:
    """A prediction back from its JSON (:meth:`Prediction.to_json`)."""

    def num(key: str) -> float | None:
        value = data.get(key)
        return float(value) if isinstance(value, int | float) else None

    return Prediction(
        str(data.get("metric", "")),
        num("value"),
        num("low"),
        num("high"),
        str(data.get("basis", "unknown")),
    )


def skipped_as(skip: Mapping[str, Any]) -> str:
    """How a skip as predicted worse reads, from its time (``skipped_at``) and its
    evidence's ``leader`` or ``constraint`` (:func:`skip_evidence`): ``skipped
    2026-12-07 07:50:03 UTC as predicted worse than #1 (metric 63.2)``; the report and
    ``status`` say it alike."""
    when = dt.datetime.fromtimestamp(skip["skipped_at"], tz=dt.timezone.utc)
    text = f"skipped {when:%Y-%m-%d %H:%M:%S} UTC as predicted "
    leader = skip.get("leader")
    if isinstance(leader, Mapping):
        return text + f"worse than #{leader['trial']} ({leader['metric']} {leader['value']:.4g})"
    if skip.get("constraint"):
        return text + f"to violate {skip['constraint']}"
    return text + "worse"
