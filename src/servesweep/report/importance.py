"""Parameter importance: which swept parameters decided the objective.

Optuna's PED-ANOVA evaluator (its default, no extra dependency) runs on an in-memory
study rebuilt from the stored trials (``optuna.create_study`` + ``add_trial``): every
trial that measured the objective is a complete trial with its params. PED-ANOVA
compares the params of the best trials with those of all; it needs a handful of trials
in that top set, hence :data:`MIN_TRIALS` and a top quantile of at least 5 trials.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from servesweep.decide.best import BestResult
from servesweep.decide.refs import ResultIndex
from servesweep.decide.standing import Standing, objective_ref, standings
from servesweep.decide.stats import format_value, swept_params
from servesweep.records import SweepData
from servesweep.report.charts import PALETTE, Chart, fmt, is_number

__all__ = ["MIN_TRIALS", "TOP_TRIALS", "importance_chart", "param_importances"]

MIN_TRIALS = 10
"""Measured trials needed before importances mean something."""
TOP_TRIALS = 5
"""Trials at least in the top set PED-ANOVA compares with the rest."""


def param_importances(
    data: SweepData, index: ResultIndex, best: BestResult | None
) -> tuple[dict[str, float], int] | None:
    """(importance by swept param, measured trials), or None when there are too few
    measured trials (fewer than :data:`MIN_TRIALS`) or fewer than two swept params."""
    found = objective_ref(best)
    params = swept_params(data)
    if found is None or len(params) < 2:
        return None
    rows = [s for s in standings(data, index, best) if s.value is not None]
    rows = [s for s in rows if all(p in s.trial.params for p in params)]
    if len(rows) < MIN_TRIALS:
        return None
    import optuna
    from optuna.distributions import (
        BaseDistribution,
        CategoricalDistribution,
        FloatDistribution,
    )

    dists: dict[str, BaseDistribution] = {}
    for name in params:
        values = [s.trial.params[name] for s in rows]
        if all(is_number(v) for v in values):
            low, high = min(float(v) for v in values), max(float(v) for v in values)
            dists[name] = FloatDistribution(low, high if high > low else low + 1.0)
        else:
            dists[name] = CategoricalDistribution(sorted({format_value(v) for v in values}))
    direction = "maximize" if found[1] == "max" else "minimize"
    quantile = top_count(len(rows)) / len(rows)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(logging.WARNING)  # no "study created" line on stderr
    try:
        return _evaluate(optuna, dists, rows, params, direction, quantile), len(rows)
    finally:
        optuna.logging.set_verbosity(verbosity)


def _evaluate(
    optuna: Any,
    dists: Mapping[str, Any],
    rows: Sequence[Standing],
    params: Sequence[str],
    direction: str,
    quantile: float,
) -> dict[str, float]:
    from optuna.distributions import FloatDistribution

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-API notices are not the reader's
        study = optuna.create_study(direction=direction)
        for s in rows:
            values: dict[str, Any] = {
                n: float(s.trial.params[n])
                if isinstance(dists[n], FloatDistribution)
                else format_value(s.trial.params[n])
                for n in params
            }
            study.add_trial(
                optuna.trial.create_trial(params=values, distributions=dists, value=s.value)
            )
        evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=quantile)
        found = optuna.importance.get_param_importances(study, evaluator=evaluator)
    return {k: float(v) for k, v in found.items() if math.isfinite(v)}


def top_count(n: int) -> int:
    """How many trials the top set holds among ``n``: at least :data:`TOP_TRIALS`, at
    least a tenth."""
    return min(n, max(TOP_TRIALS, math.ceil(0.1 * n)))


def importance_chart(data: SweepData, index: ResultIndex, best: BestResult | None) -> Chart | None:
    found = param_importances(data, index, best)
    if found is None:
        return None
    importances, n = found
    names = list(reversed(list(importances)))
    option = {
        "grid": {"left": 140, "right": 60, "top": 20, "bottom": 40},
        "xAxis": {"type": "value", "name": "importance (sums to 1)", "nameLocation": "middle",
                  "nameGap": 26, "min": 0},
        "yAxis": {"type": "category", "data": names},
        "series": [
            {"type": "bar", "name": "importance", "color": PALETTE[2],
             "label": {"show": True, "position": "right", "fromData": True},
             "data": [{"value": importances[k], "text": fmt(importances[k]),
                       "lines": [f"{k}: importance {fmt(importances[k])}"]} for k in names]}
        ],
    }  # fmt: skip
    return Chart(
        "chart-importance",
        "parameter importance",
        option,
        "item",
        height=80 + 36 * len(names),
        note=f"Optuna's PED-ANOVA on the {n} trials that measured the objective: how much "
        f"each param decides whether a trial reaches the top {top_count(n)} of them.",
    )
