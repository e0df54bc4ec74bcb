"""The performance section of ``servesweep plan``: every configuration's objective and
constraint metrics predicted (``servesweep.decide.perf``) from the trials already
measured in the results database, as text and as JSON.

The latest sweep of the same name gives this sweep's trials; its earlier sweeps of the
same name (the same engine, model and GPUs, as the name stands for) are the warm start.
With nothing measured every prediction is ``unknown``.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from servesweep.decide.perf import Measured, Prediction, Setting, predict
from servesweep.models import Outcome, ServerConfig
from servesweep.spec.constraints import resolve_objectives, validate_constraints
from servesweep.spec.schema import SweepSpec
from servesweep.spec.space import build_space
from servesweep.store import Store

__all__ = [
    "format_predicted",
    "measured_trials",
    "perf_setting",
    "predict_configs",
    "predicted_json",
]

_LEVEL = re.compile(r"^c(\d+)$")


def _norm(name: str) -> str:
    return name.replace("-", "_")


def perf_setting(spec: SweepSpec, draft: str | None = None) -> Setting:
    """What the predictor is told: the objectives' and the constraints' metrics, the
    engine's draft-length param ``draft`` when the sweep varies it, the concurrency of each
    closed-loop level, and that acceptance depends on nothing but the draft length."""
    metrics = [ref.key for ref, _ in resolve_objectives(spec)]
    metrics += [c.ref.key for c in validate_constraints(spec) if c.ref.key not in metrics]
    swept = {_norm(k): k for k in _swept(spec)}
    draft_param = swept.get(_norm(draft)) if draft else None
    concurrency: dict[str, float] = {}
    for metric in metrics:
        workload, _, rest = metric.partition(".")
        level = rest.partition(".")[0]
        match = _LEVEL.match(level)
        if match:
            concurrency[f"{workload}.{level}"] = float(match.group(1))
    others = frozenset(k for k in swept.values() if k != draft_param)
    return Setting(
        metrics=tuple(metrics),
        draft_param=draft_param,
        concurrency=concurrency,
        invariant={"acceptance_length": others} if draft_param else {},
    )


def _swept(spec: SweepSpec) -> set[str]:
    space = build_space(spec.params)
    if not space.enumerable:
        return set()
    return {k for c in space.allowed() for k in c.params}


def measured_trials(store: Store, sweep_ids: Sequence[int]) -> list[Measured]:
    """The trials of these sweeps that measured levels (ok or stopped early): each
    level's metrics, the mean over its repeats."""
    out = []
    for sweep_id in sweep_ids:
        for trial in store.trials(sweep_id):
            if trial.outcome not in (Outcome.OK, Outcome.PRUNED):
                continue
            values: dict[str, list[float]] = {}
            for result in store.results(trial.id, with_samples=False):
                for name, value in result.metrics.items():
                    if isinstance(value, int | float) and value == value:
                        key = f"{result.workload}.{result.level}.{name}"
                        values.setdefault(key, []).append(float(value))
            if values:
                metrics = {k: statistics.fmean(v) for k, v in values.items()}
                out.append(Measured(dict(trial.params), metrics))
    return out


def predict_configs(
    spec: SweepSpec, configs: Sequence[ServerConfig], store: Store | None, draft: str | None
) -> tuple[Setting, list[dict[str, Prediction]], int, int]:
    """(setting, a prediction per configuration, trials of this sweep, of earlier ones);
    ``draft``: the engine's draft-length param (``EnginePreset.draft_length_param``)."""
    setting = perf_setting(spec, draft)
    trials: list[Measured] = []
    earlier: list[Measured] = []
    if store is not None:
        same = [s for s in store.sweeps() if s.name == spec.name]
        if same:
            latest = max(same, key=lambda s: s.id)
            trials = measured_trials(store, [latest.id])
            earlier = measured_trials(store, [s.id for s in same if s.id != latest.id])
    got = predict(setting, [c.params for c in configs], trials, earlier)
    return setting, got, len(trials), len(earlier)


def predicted_json(predictions: Mapping[str, Prediction]) -> dict[str, Any]:
    return {metric: p.to_json() for metric, p in predictions.items()}


def _cell(p: Prediction) -> str:
    if p.value is None or p.low is None or p.high is None:
        return "unknown"
    if p.basis == "measured":
        return f"{p.value:.4g} (measured)"
    return f"{p.value:.4g} [{p.low:.4g}-{p.high:.4g}] {p.basis}"


def format_predicted(
    ids: Sequence[int],
    setting: Setting,
    predictions: Sequence[Mapping[str, Prediction]],
    trials: int,
    earlier: int,
) -> str:
    """The performance table: per configuration each metric's prediction and interval
    (or unknown), with the model that gave it."""
    lines = [
        f"performance (predicted from {trials} measured trial(s) of this sweep and "
        f"{earlier} of earlier sweeps of the same name):"
    ]
    if not predictions:
        lines.append("  (the search's space is too large to list: nothing predicted)")
        return "\n".join(lines)
    head = ("#", *setting.metrics)
    rows = [head]
    for i, p in zip(ids, predictions, strict=True):
        rows.append((str(i), *(_cell(p[m]) for m in setting.metrics)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for row in rows:
        cells = [row[0].rjust(widths[0])] + [
            c.ljust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append(("  " + "  ".join(cells)).rstrip())
    known = sum(all(p[m].known for m in setting.metrics) for p in predictions)
    lines.append(
        f"  {known} predicted, {len(predictions) - known} unknown (far from anything "
        "measured); an interval is two standard deviations"
    )
    return "\n".join(lines)
