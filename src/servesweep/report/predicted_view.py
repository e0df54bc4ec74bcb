"""The performance prediction in the report: for every launched trial its prediction
(made when it was placed) against what it measured, the error per metric; the trials
skipped as predicted worse with their predictions; the trials skipped as predicted
worse and then launched before the end because their interval still reached the
leader (reopened: when they were skipped, on which prediction, against what they then
measured); and the GPU-hours the skipping saved: the trials still skipped times the
mean GPU-hours of a measured trial (its launch and its benchmarks). A reopened trial
was launched, so it saved nothing and is not counted. Read from the ``performance``
events, the skipped trials' evidence and the ``reopened`` events
(``SweepData.reopened``; written by ``sweep/core/predict_gate.py``).
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Mapping
from typing import Any

from servesweep.decide.perf.gate import PREDICTED_WORSE, prediction_of, skipped_as
from servesweep.models import Outcome
from servesweep.records import ReopenedSkip, SweepData, TrialRecord
from servesweep.spec.slots import params_label

__all__ = ["predicted_json", "predicted_lines", "predicted_table"]


def _worse(t: TrialRecord) -> bool:
    return (
        t.outcome is Outcome.SKIPPED
        and t.evidence is not None
        and t.evidence.reason == PREDICTED_WORSE
    )


def _metric_rows(predicted: Mapping[str, Any], measured: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric, data in predicted.items():
        if not isinstance(data, Mapping):
            continue
        p = prediction_of(data)
        value = measured.get(metric)
        got = float(value) if isinstance(value, int | float) else None
        error = None
        inside = None
        if got is not None and p.value is not None and got != 0:
            error = (p.value - got) / abs(got)
        if got is not None and p.low is not None and p.high is not None:
            inside = p.low <= got <= p.high
        out[metric] = {**p.to_json(), "measured": got, "error": error, "inside": inside}
    return out


def _reopened_row(
    trial: TrialRecord, skip: ReopenedSkip, measured: Mapping[str, Any]
) -> dict[str, Any]:
    """A skip that was reopened: its prediction against what the late launch measured."""
    details = skip.evidence.details
    return {
        "trial": trial.id,
        "params": dict(trial.params),
        "skipped_at": skip.skipped_at,
        "reason": skip.evidence.reason,
        "leader": details.get("leader"),
        "constraint": details.get("constraint"),
        "threshold": details.get("threshold"),
        "launched_at": trial.started_at,
        "outcome": trial.outcome.value,
        "predicted": _metric_rows(details.get("predicted_performance", {}), measured),
    }


def predicted_json(data: SweepData) -> dict[str, Any] | None:
    """The report's ``predicted`` section (None: nothing was predicted)."""
    trials = {t.id: t for t in data.trials}
    skipped = [t for t in sorted(data.trials, key=lambda t: (t.seq, t.id)) if _worse(t)]
    reopened = [
        _reopened_row(t, skip, data.performance.get(t.id, {}).get("measured", {}))
        for t in sorted(data.trials, key=lambda t: (t.seq, t.id))
        for skip in data.reopened.get(t.id, ())
    ]
    if not data.performance and not skipped and not reopened:
        return None
    launched = []
    for trial_id, event in sorted(data.performance.items()):
        trial = trials.get(trial_id)
        launched.append(
            {
                "trial": trial_id,
                "params": dict(trial.params) if trial is not None else {},
                "metrics": _metric_rows(event.get("predicted", {}), event.get("measured", {})),
            }
        )
    costs = [
        t.gpu_seconds / 3600
        for t in data.trials
        if t.outcome in (Outcome.OK, Outcome.PRUNED) and t.gpu_seconds > 0
    ]
    mean_cost = statistics.fmean(costs) if costs else None
    widen: Mapping[str, Any] = {}
    if data.performance:
        widen = data.performance[max(data.performance)].get("widen", {})
    return {
        "launched": launched,
        "skipped": [
            {
                "trial": t.id,
                "params": dict(t.params),
                "predicted": dict(t.evidence.details.get("predicted_performance", {}))
                if t.evidence is not None
                else {},
                "leader": t.evidence.details.get("leader") if t.evidence is not None else None,
                "message": t.evidence.message if t.evidence is not None else "",
            }
            for t in skipped
        ],
        "reopened": reopened,
        "mean_launch_gpu_hours": mean_cost,
        # only what is still skipped: a reopened trial was launched after all
        "saved_gpu_hours": len(skipped) * mean_cost if mean_cost is not None else None,
        "trust": dict(widen),
    }


def _cell(row: Mapping[str, Any]) -> str:
    if row.get("value") is None:
        return "unknown"
    text = f"{row['value']:.4g} [{row['low']:.4g}-{row['high']:.4g}] {row['basis']}"
    if row.get("measured") is None:
        return text
    error = row.get("error")
    miss = "" if row.get("inside") else ", outside"
    err = f"{error:+.1%}" if error is not None else "-"
    return f"{text}; measured {row['measured']:.4g} ({err}{miss})"


def _utc(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _then(row: Mapping[str, Any]) -> str:
    """What came of a reopened trial: its late launch."""
    if row["outcome"] == "pending":
        return "not launched yet"
    if row["outcome"] == "skipped":
        return "skipped again"
    return f"launched {_utc(row['launched_at'])}, {row['outcome']}"


def _reopened_lines(doc: Mapping[str, Any]) -> list[str]:
    lines = []
    for row in doc["reopened"]:
        label = params_label(row["params"])
        cells = "; ".join(f"{m} {_cell(c)}" for m, c in row["predicted"].items())
        lines.append(
            f"#{row['trial']} {label}: {skipped_as(row)}: {cells or 'no prediction'}; "
            f"reopened (its interval still reached the leader) and {_then(row)}"
        )
    return lines


def _saved_line(doc: Mapping[str, Any]) -> list[str]:
    saved = doc["saved_gpu_hours"]
    late = sum(1 for row in doc["reopened"] if row["outcome"] != "skipped")
    not_counted = (
        f"; {late} reopened (skipped, then launched) saved nothing and are not counted"
        if late
        else ""
    )
    if doc["skipped"]:
        return [
            f"saved: {len(doc['skipped'])} launch(es) not made, about "
            + (f"{saved:.3g} GPU-hours" if saved is not None else "unknown GPU-hours")
            + f" (the mean GPU-hours of a measured trial each){not_counted}"
        ]
    if late:
        return [
            f"saved: nothing, every trial skipped as predicted worse was launched before "
            f"the end ({late} reopened)"
        ]
    return []


def predicted_lines(data: SweepData) -> list[str]:
    """The same as text: one line per launched trial and metric, one per skipped trial,
    one per reopened skip, and what the skipping saved."""
    doc = predicted_json(data)
    if doc is None:
        return []
    lines = []
    for row in doc["launched"]:
        label = params_label(row["params"])
        for metric, cell in row["metrics"].items():
            lines.append(f"#{row['trial']} {label}: {metric} predicted {_cell(cell)}")
    for row in doc["skipped"]:
        label = params_label(row["params"])
        cells = "; ".join(f"{m} {_cell(c)}" for m, c in row["predicted"].items())
        lines.append(f"#{row['trial']} {label}: skipped (predicted_worse): {cells}")
    lines += _reopened_lines(doc)
    lines += _saved_line(doc)
    if doc["trust"]:
        widened = ", ".join(f"{m} x{f:.3g}" for m, f in doc["trust"].items())
        lines.append(f"intervals widened after missed predictions: {widened}")
    return lines


def _against(c: Mapping[str, Any]) -> tuple[str, str]:
    """A prediction's measured value and error, as the table's two cells."""
    got = f"{c['measured']:.4g}" if c.get("measured") is not None else "-"
    err = f"{c['error']:+.1%}" if c.get("error") is not None else "-"
    if c.get("inside") is False:
        err += " (outside)"
    return got, err


def predicted_table(data: SweepData) -> dict[str, Any] | None:
    """For the HTML report: one row per launched trial and metric (trial, configuration,
    metric, predicted, measured, error) and per skipped trial; one row per reopened
    skip and metric (trial, configuration, how it was skipped, metric, the prediction
    it was skipped on, what came of it, measured, error); and the summary lines."""
    doc = predicted_json(data)
    if doc is None:
        return None
    rows: list[tuple[int, str, str, str, str, str]] = []
    for row in doc["launched"]:
        for metric, c in row["metrics"].items():
            pred = _cell({**c, "measured": None})
            rows.append((row["trial"], params_label(row["params"]), metric, pred, *_against(c)))
    for row in doc["skipped"]:
        for metric, c in row["predicted"].items():
            pred = _cell(c)
            rows.append((row["trial"], params_label(row["params"]), metric, pred, "skipped", "-"))
    reopened: list[tuple[int, str, str, str, str, str, str, str]] = []
    for row in doc["reopened"]:
        for metric, c in row["predicted"].items():
            got, err = _against(c)
            reopened.append(
                (
                    row["trial"],
                    params_label(row["params"]),
                    skipped_as(row),
                    metric,
                    _cell({**c, "measured": None}),
                    _then(row),
                    got,
                    err,
                )
            )
    lines = [line for line in predicted_lines(data) if line.startswith(("saved", "intervals"))]
    return {"rows": rows, "reopened": reopened, "lines": lines}
