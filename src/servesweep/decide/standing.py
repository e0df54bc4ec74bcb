"""Where each trial stands against the objective: the one view every chart of the
report shares (feasible with a value, infeasible with a value and the constraint it
broke, failed with its class, or not measured)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from servesweep.decide.best import BestResult
from servesweep.decide.refs import ResultIndex
from servesweep.models import Outcome
from servesweep.records import SweepData, TrialRecord
from servesweep.spec.constraints import MetricRef, parse_metric_ref

__all__ = ["Standing", "Status", "objective_ref", "standings"]


class Status:
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    FAILED = "failed"
    UNMEASURED = "unmeasured"


@dataclass(frozen=True)
class Standing:
    trial: TrialRecord
    status: str
    """One of :class:`Status`."""
    value: float | None
    """The objective (mean over repeats) when measured."""
    why: str = ""
    """The violated constraint, the failure class (with its reason), or why not measured."""
    best: bool = False
    interval: tuple[float, float, float] | None = None
    """(lo, hi, confidence) of the objective's value, when it has one."""


def objective_ref(best: BestResult | None) -> tuple[MetricRef, str] | None:
    """The deciding objective of ``best`` as (reference, ``max``/``min``)."""
    if best is None or not best.objectives:
        return None
    key, direction = best.objectives[0]
    return parse_metric_ref(key), direction


def _failure(trial: TrialRecord) -> str:
    cls = trial.failure_class.value if trial.failure_class else "failed"
    reason = trial.evidence.reason if trial.evidence and trial.evidence.reason else None
    return f"{cls} ({reason})" if reason and reason != cls else cls


def standings(
    data: SweepData, index: ResultIndex, best: BestResult | None, ref: MetricRef | None = None
) -> list[Standing]:
    """Every trial of the plan in run order with its standing on ``ref`` (default: the
    objective of ``best``). Constraints and the winner come from ``best``. A trial the
    sweep file no longer has (``in_plan`` false) has no standing: it is history, not
    an infeasible configuration, so no chart draws it and no importance counts it."""
    if ref is None:
        found = objective_ref(best)
        ref = found[0] if found else None
    excluded = {e.trial.id: e for e in best.excluded} if best else {}
    winner = best.trial.id if best is not None and best.trial is not None else None
    out: list[Standing] = []
    for trial in sorted(data.trials, key=lambda t: (t.seq, t.id)):
        if not trial.in_plan:
            continue
        value = index.value(trial, ref) if ref is not None else None
        if value is not None and not math.isfinite(value):
            value = None
        gone = excluded.get(trial.id)
        if trial.outcome is Outcome.FAILED:
            out.append(Standing(trial, Status.FAILED, value, _failure(trial)))
        elif value is None:
            why = trial.outcome.value if trial.outcome is not Outcome.OK else "not measured"
            out.append(Standing(trial, Status.UNMEASURED, None, why))
        elif gone is not None and gone.kind == "constraint":
            out.append(Standing(trial, Status.INFEASIBLE, value, gone.constraint or gone.reason))
        elif trial.outcome is Outcome.OK and (gone is None or gone.kind == "missing_metric"):
            status = Status.FEASIBLE if gone is None else Status.INFEASIBLE
            why = "" if gone is None else gone.reason
            stats = index.stats(trial, ref) if ref is not None else None
            interval = (
                None
                if stats is None or stats.lo is None or stats.hi is None
                else (stats.lo, stats.hi, stats.confidence or 0.95)
            )
            out.append(Standing(trial, status, value, why, trial.id == winner, interval))
        else:  # pruned, interrupted, running: measured in part
            out.append(Standing(trial, Status.INFEASIBLE, value, trial.outcome.value))
    return out


def best_so_far(values: Sequence[float | None], direction: str) -> list[float | None]:
    """The running best of ``values`` (None: nothing feasible yet)."""
    out: list[float | None] = []
    current: float | None = None
    for v in values:
        if v is not None and (
            current is None or (v > current if direction == "max" else v < current)
        ):
            current = v
        out.append(current)
    return out
