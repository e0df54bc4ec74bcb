"""The performance section of ``servesweep plan``: every configuration's objective and
constraint metrics predicted (``servesweep.decide.perf``) from the trials already
measured in the results database, as text and as JSON.

The latest sweep of the same name gives this sweep's trials; the earlier sweeps that
count (``sweep.core.earlier``: the same name, engine, model, GPUs and workloads, chosen
by the caller) are the warm start. With nothing measured every prediction is
``unknown``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from servesweep.decide.perf import Measured, Prediction, Setting, predict
from servesweep.decide.perf.inputs import measured_of
from servesweep.models import ServerConfig
from servesweep.store import Store

__all__ = [
    "format_predicted",
    "measured_trials",
    "predict_configs",
    "predicted_json",
]


def measured_trials(store: Store, sweep_ids: Sequence[int]) -> list[Measured]:
    """The trials of these sweeps that measured levels (``decide.perf.inputs``)."""
    return measured_of(
        [
            (trial, store.results(trial.id, with_samples=False))
            for sweep_id in sweep_ids
            for trial in store.trials(sweep_id)
        ]
    )


def predict_configs(
    setting: Setting,
    configs: Sequence[ServerConfig],
    store: Store | None,
    sweep_id: int | None = None,
    earlier_ids: Sequence[int] = (),
) -> tuple[Setting, list[dict[str, Prediction]], int, int]:
    """(setting, a prediction per configuration, trials of this sweep, of earlier ones);
    ``setting``: what the predictor is told of the sweep (``sweep.core.predict_gate.
    setting_of``); the trials of sweep ``sweep_id`` and of the earlier sweeps
    ``earlier_ids`` in ``store``."""
    trials: list[Measured] = []
    earlier: list[Measured] = []
    if store is not None:
        trials = measured_trials(store, [sweep_id] if sweep_id is not None else [])
        earlier = measured_trials(store, earlier_ids)
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
    earlier_notes: Sequence[str] = (),
) -> str:
    """The performance table: per configuration each metric's prediction and interval
    (or unknown), with the model that gave it; ``earlier_notes``: which earlier sweeps
    start it warm and which do not (``sweep.core.earlier``)."""
    lines = [
        f"performance (predicted from {trials} measured trial(s) of this sweep and "
        f"{earlier} of earlier sweeps of the same name, engine, model, GPUs and workloads):"
    ]
    lines.extend(f"  {note}" for note in earlier_notes)
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
