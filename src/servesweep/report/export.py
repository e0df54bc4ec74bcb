"""Machine-readable exports: CSV (one row per trial x workload x level x repeat)
and the versioned JSON document (``servesweep-report`` version 1, docs/reports.md)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from servesweep.decide.acceptance import AcceptanceContext
from servesweep.decide.best import find_best
from servesweep.decide.intervals import DEFAULT_CONFIDENCE
from servesweep.decide.level_intervals import INTERVAL_METRICS
from servesweep.decide.refs import ResultIndex
from servesweep.decide.stats import (
    GPU_PHASES,
    all_params,
    finite,
    in_plan_count,
    metric_names,
    out_of_plan,
    outcome_counts,
    phase_costs,
    result_intervals,
    swept_params,
    trial_gpu_count,
)
from servesweep.errors import ServesweepError
from servesweep.metrics_catalog import ACCEPTANCE_LENGTH
from servesweep.models import LevelResult
from servesweep.records import SweepData, TrialRecord
from servesweep.report.best_view import best_to_json
from servesweep.report.evals import eval_rates, task_flips
from servesweep.report.predicted_view import predicted_json

__all__ = ["JSON_FORMAT", "JSON_VERSION", "render_csv", "render_json", "report_document"]

JSON_FORMAT = "servesweep-report"
JSON_VERSION = 1

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_text(value: Any) -> str:
    """A cell for a spreadsheet: text that would start a formula gets a leading
    apostrophe (CSV injection); numbers stay numbers."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, float) else str(value)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = " ".join(text.splitlines())
    if text.startswith(_FORMULA_START):
        return "'" + text
    return text


def render_csv(data: SweepData) -> str:
    """One row per trial x workload x level x repeat; trials without results (failed,
    skipped) get one row with empty workload columns. Columns: trial facts,
    ``param_<name>`` for every param, the phase seconds (``load_s``...), the level,
    then every metric seen (key metrics first)."""
    index = ResultIndex(data)
    params = all_params(data)
    levels = [lvl for lv in index.levels.values() for lvl in lv]
    fixed = [
        "sweep",
        "trial",
        "seq",
        "fingerprint",
        "outcome",
        "in_plan",
        "failure_class",
        "failure_reason",
        "gpus",
        *(f"param_{p}" for p in params),
        *(f"{p}_s" for p in GPU_PHASES),
        "workload",
        "level",
        "repeat",
        "launch",
        "duration_s",
        "warnings",
        "unreliable",
    ]
    # a metric named like a fixed column (the level's ``duration_s``) is that column
    metrics = [m for m in metric_names(levels) if m not in fixed]
    bounded = [m for m in metrics if m in INTERVAL_METRICS]
    bounds = [f"{m}_{end}" for m in bounded for end in ("lo", "hi")]
    spec = ACCEPTANCE_LENGTH.name in metrics
    header = [*fixed, *metrics, *(["confidence", *bounds] if bounded else [])]
    header += list(ACCEPTANCE_COLUMNS) if spec else []
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for trial in sorted(data.trials, key=lambda t: (t.seq, t.id)):
        head = [
            data.sweep.name,
            trial.number,
            trial.seq,
            trial.fingerprint,
            trial.outcome.value,
            int(trial.in_plan),
            trial.failure_class.value if trial.failure_class else None,
            trial.evidence.reason if trial.evidence else None,
            trial_gpu_count(data, trial),
            *(trial.params.get(p) for p in params),
            *(trial.phase_seconds.get(p) for p in GPU_PHASES),
        ]
        results = sorted(
            data.results.get(trial.id, ()),
            key=lambda r: (r.workload, r.level, r.launch, r.repeat),
        )
        if not results:
            writer.writerow([_csv_text(v) for v in head + [None] * (len(header) - len(head))])
        for res in results:
            own = result_intervals(res)
            ends: list[float | None] = []
            for m in bounded:
                lo_hi = own.get(m)
                ends += [None, None] if lo_hi is None else list(lo_hi)
            row = [
                *head,
                res.workload,
                res.level,
                res.repeat,
                res.launch,
                res.duration_s,
                "; ".join(res.warnings) or None,
                res.unreliable,
                *(res.metrics.get(m) for m in metrics),
                *([DEFAULT_CONFIDENCE if own else None, *ends] if bounded else []),
                *(_acceptance_cells(res) if spec else []),
            ]
            writer.writerow([_csv_text(v) for v in row])
    return buf.getvalue()


ACCEPTANCE_COLUMNS = (
    "acceptance_dataset",
    "acceptance_ignore_eos",
    "acceptance_endpoint",
    "acceptance_trusted",
)
"""The CSV's columns saying what text a row's acceptance length was measured on."""


def _acceptance_cells(res: LevelResult) -> list[Any]:
    ctx = _acceptance_context(res)
    if ctx is None:
        return [None] * len(ACCEPTANCE_COLUMNS)
    return [ctx.dataset, ctx.ignore_eos, ctx.endpoint, ctx.trusted]


def _acceptance_context(res: LevelResult) -> AcceptanceContext | None:
    if ACCEPTANCE_LENGTH.name not in res.metrics:
        return None
    return AcceptanceContext.of_info(res.info)


def _acceptance_json(ctx: AcceptanceContext | None) -> dict[str, Any] | None:
    return None if ctx is None else ctx.to_info()


def _trial_json(data: SweepData, index: ResultIndex, trial: TrialRecord) -> dict[str, Any]:
    peak: dict[str, int] = {}
    for point in data.telemetry:
        if point.trial_id == trial.id:
            key = str(point.gpu)
            peak[key] = max(peak.get(key, 0), point.used_bytes)
    return {
        "id": trial.id,
        "number": trial.number,
        "seq": trial.seq,
        "fingerprint": trial.fingerprint,
        "params": dict(trial.params),
        "outcome": trial.outcome.value,
        "failure_class": trial.failure_class.value if trial.failure_class else None,
        "failure": None
        if trial.evidence is None
        else {"summary": trial.evidence.summary(), **trial.evidence.to_dict()},
        "memory": data.memory.get(trial.id),
        "phase": trial.phase.value if trial.phase else None,
        "phase_seconds": {k: finite(v) for k, v in trial.phase_seconds.items()},
        "phase_started": dict(trial.phase_started),
        "gpus": list(trial.instance.gpus) if trial.instance else [],
        "node": trial.node,
        "node_id": trial.node_id,
        "slot": trial.slot,
        "gpu_count": trial_gpu_count(data, trial),
        "peak_gpu_memory_bytes": peak,
        "launch_command": trial.launch_command,
        "log_path": trial.log_path,
        "attempts": trial.attempts,
        "started_at": trial.started_at,
        "finished_at": trial.finished_at,
        "in_plan": trial.in_plan,
        "adopted": trial.adopted,
        # skipped as predicted worse, then launched before the end: each skip
        "reopened": [skip.to_json() for skip in data.reopened.get(trial.id, ())],
        "results": [
            {
                "workload": r.workload,
                "level": r.level,
                "repeat": r.repeat,
                "launch": r.launch,
                "metrics": {k: finite(v) for k, v in r.metrics.items()},
                "intervals": {
                    k: [finite(lo), finite(hi)] for k, (lo, hi) in result_intervals(r).items()
                },
                "confidence": DEFAULT_CONFIDENCE,
                "warnings": list(r.warnings),
                "unreliable": r.unreliable,
                "generator_health": r.info.get("generator_health"),
                "load_generator": r.info.get("load_generator"),
                "acceptance_source": r.info.get("acceptance_source"),
                "acceptance_context": _acceptance_json(_acceptance_context(r)),
                "spec_decode": r.info.get("spec_decode"),
                "started_at": r.started_at,
                "duration_s": r.duration_s,
                "eval_results": [
                    {
                        "task_id": e.task_id,
                        "sample": e.sample,
                        "status": e.status,
                        "message": e.message,
                        "seconds": e.seconds,
                    }
                    for e in r.eval_results
                ],
            }
            for r in data.results.get(trial.id, ())
        ],
        "aggregates": [
            {
                "workload": lvl.workload,
                "level": lvl.level,
                "repeats": len(lvl.repeats),
                "unreliable": lvl.unreliable,
                "acceptance_context": _acceptance_json(lvl.acceptance),
                "metrics": {k: s.to_dict() for k, s in lvl.metrics.items()},
            }
            for lvl in index.levels.get(trial.id, ())
        ],
    }


def report_document(data: SweepData) -> dict[str, Any]:
    """The JSON report as a dict (schema: docs/reports.md)."""
    index = ResultIndex(data)
    costs, unknown = phase_costs(data)
    try:
        best: dict[str, Any] | None = best_to_json(find_best(data))
        best_error = None
    except ServesweepError as exc:
        best, best_error = None, str(exc)
    sweep = data.sweep
    predicted = predicted_json(data)
    return {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "sweep": {
            "id": sweep.id,
            "name": sweep.name,
            "spec_path": sweep.spec_path,
            "spec_hash": sweep.spec_hash,
            "created_at": sweep.created_at,
            "finished_at": sweep.finished_at,
            "servesweep_version": sweep.servesweep_version,
            "environment": dict(sweep.environment),
        },
        "objective": dict(data.objective) if data.objective else None,
        "constraints": list(data.constraints),
        "swept_params": swept_params(data),
        "summary": {
            "trials": in_plan_count(data),
            "not_in_plan": out_of_plan(data),
            "outcomes": outcome_counts(data),
            "phase_seconds": {c.phase: c.seconds for c in costs},
            "gpu_hours": {c.phase: c.gpu_hours for c in costs},
            "trials_with_unknown_gpu_count": unknown,
        },
        "trials": [
            _trial_json(data, index, t) for t in sorted(data.trials, key=lambda t: (t.seq, t.id))
        ],
        "evals": {
            "pass_rates": [
                {
                    "trial": r.trial_id,
                    "workload": r.workload,
                    "passed": r.passed,
                    "total": r.total,
                    "pass_rate": r.pass_rate,
                }
                for r in eval_rates(data)
            ],
            "flipped": [
                {
                    "workload": f.workload,
                    "task_id": f.task_id,
                    "statuses": {str(t): s for t, s in f.statuses},
                }
                for f in task_flips(data)
            ],
        },
        # only where the sweep predicted its performance (docs/reports.md)
        **({"predicted": predicted} if predicted is not None else {}),
        "best": best,
        "best_error": best_error,
    }


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats become null, unknown objects their text."""
    if isinstance(value, float):
        return finite(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def render_json(data: SweepData) -> str:
    """The JSON report (``servesweep-report`` version 1), indented."""
    return json.dumps(_clean(report_document(data)), indent=2, allow_nan=False) + "\n"
