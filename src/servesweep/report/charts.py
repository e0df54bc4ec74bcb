"""What the HTML report's charts are made of, before the browser draws them.

A :class:`Chart` is an Apache ECharts option (plain JSON data, no functions) plus the
name of the tooltip the page's script gives it. Data items that stand for a trial
carry its id (``trial``) and, where a load level is meant, ``level``
(``workload.level``): the page looks the trial up in the :func:`trial_catalog` to show
its configuration, outcome and metrics on hover. Every number a person reads is
formatted here, by :func:`~servesweep.decide.numbers.format_number`, so the page
shows the same digits as the terminal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servesweep.decide.numbers import format_number, format_stats
from servesweep.decide.refs import ResultIndex
from servesweep.decide.stats import (
    KEY_METRICS,
    config_label,
    format_value,
    swept_params,
)
from servesweep.models import Outcome
from servesweep.records import SweepData, TrialRecord

__all__ = [
    "FAILED_COLOR",
    "INFEASIBLE_COLOR",
    "PALETTE",
    "Chart",
    "axis_for",
    "is_number",
    "outcome_text",
    "trial_catalog",
    "value_band",
]

PALETTE: tuple[str, ...] = (
    "#0072b2",
    "#e69f00",
    "#009e73",
    "#cc79a7",
    "#56b4e9",
    "#d55e00",
    "#6a3d9a",
    "#8c6d31",
    "#f0e442",
    "#000000",
)
"""Okabe-Ito colours (told apart with colour-vision deficiencies), then a few more."""

FAILED_COLOR = "#c0392b"
INFEASIBLE_COLOR = "#9e9e9e"
TOOLTIPS = ("point", "cell", "bar", "axis", "item")


@dataclass(frozen=True)
class Chart:
    """One chart of the report."""

    id: str
    """DOM id of the chart's container (``chart-heatmap``); tests find charts by it."""
    title: str
    option: Mapping[str, Any]
    """An ECharts option: series, axes, legend... JSON-ready."""
    tooltip: str = "point"
    """How the page's script explains a hovered item: ``point`` (a trial, its
    configuration and metrics), ``cell`` (a heatmap cell), ``bar`` (a timeline
    phase), ``axis`` (every series at one x), ``item`` (the item's own lines)."""
    height: int = 360
    note: str = ""
    """One paragraph under the chart: how to read it, what it leaves out."""

    def to_json(self) -> dict[str, Any]:
        assert self.tooltip in TOOLTIPS, self.tooltip
        return {
            "id": self.id,
            "title": self.title,
            "option": _clean(dict(self.option)),
            "tooltip": self.tooltip,
            "height": self.height,
        }


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats become None ('-' to ECharts: no value)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def outcome_text(trial: TrialRecord) -> str:
    """``ok``, ``failed: start_crash (oom)``, ``pruned``, ``running (load)``...; with
    ``, not in plan`` when the sweep file no longer has the trial."""
    gone = "" if trial.in_plan else ", not in plan"
    if trial.outcome is Outcome.FAILED:
        cls = trial.failure_class.value if trial.failure_class else "unclassified"
        reason = trial.evidence.reason if trial.evidence and trial.evidence.reason else None
        return f"failed: {cls}" + (f" ({reason})" if reason and reason != cls else "") + gone
    if trial.outcome is Outcome.RUNNING and trial.phase is not None:
        return f"running ({trial.phase.value})" + gone
    return str(trial.outcome.value) + gone


def axis_for(values: Sequence[object]) -> tuple[dict[str, Any], list[str] | None]:
    """An ECharts axis for a param's values: a value axis when every value is a
    number, else a category axis in order of first appearance (returned too)."""
    present = [v for v in values if v is not None]
    if present and all(is_number(v) for v in present):
        return {"type": "value", "scale": True}, None
    categories = list(dict.fromkeys(format_value(v) for v in values))
    return {"type": "category", "data": categories, "axisLabel": {"interval": 0}}, categories


def value_band(values: Sequence[float]) -> tuple[float, float] | None:
    """The band of ``values`` with a margin (not from zero, so that an 800-1000 spread
    fills a chart instead of a sliver at its top): failed trials are drawn at its
    bottom, on an axis that scales to the data. None without values."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    low, high = min(finite), max(finite)
    margin = (high - low) * 0.08 or abs(high) * 0.05 or 1.0
    bottom = low - margin
    if low >= 0 > bottom:
        bottom = 0.0  # a band near zero starts at zero, never below it
    return _nice(bottom, "down"), _nice(high + margin, "up")


def _nice(value: float, way: str) -> float:
    """``value`` rounded outward to 3 significant digits (a tidy axis end)."""
    if value == 0:
        return 0.0
    step = 10 ** (math.floor(math.log10(abs(value))) - 2)
    rounded = (math.floor if way == "down" else math.ceil)(value / step) * step
    return float(f"{rounded:.12g}")


def trial_catalog(data: SweepData, index: ResultIndex) -> dict[str, Any]:
    """What a hover shows about each trial: its label, params, where it ran, its
    outcome, and the key metrics of each workload level (formatted)."""
    params = swept_params(data)
    out: dict[str, Any] = {}
    for trial in data.trials:
        levels: dict[str, list[list[str]]] = {}
        for lvl in index.levels.get(trial.id, ()):
            shown = [m for m in KEY_METRICS if m in lvl.metrics]
            levels[f"{lvl.workload}.{lvl.level}"] = [
                [m, format_stats(lvl.metrics[m])] for m in shown
            ]
        failure = trial.evidence.summary() if trial.evidence else None
        out[str(trial.id)] = {
            "label": config_label(trial, params),
            "params": [[k, format_value(v)] for k, v in trial.params.items()],
            "outcome": outcome_text(trial),
            "where": trial.lane if trial.node or trial.slot is not None else "",
            "failure": failure[:300] if failure else None,
            "levels": levels,
        }
    return out


def fmt(value: float | None) -> str:
    """A number as the report writes it."""
    return format_number(value)
