"""Parameter effects: how the objective (and the acceptance length of speculative
decoding) moves with each swept parameter.

- a heatmap of the objective over two swept parameters, failed and infeasible cells
  marked with their class;
- the objective against each parameter, one colour per value of another parameter;
- parallel coordinates over every swept parameter and the objective;
- the acceptance length against the draft parameters, when it was measured.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from servesweep.decide.best import BestResult
from servesweep.decide.refs import ResultIndex
from servesweep.decide.standing import Standing, Status, objective_ref, standings
from servesweep.decide.stats import format_value, swept_params
from servesweep.records import SweepData
from servesweep.report.charts import (
    FAILED_COLOR,
    INFEASIBLE_COLOR,
    PALETTE,
    Chart,
    axis_for,
    fmt,
    is_number,
    value_band,
)
from servesweep.spec.constraints import MetricRef

__all__ = [
    "DRAFT_PARAM",
    "acceptance_charts",
    "heatmap_chart",
    "metric_vs_param_charts",
    "parallel_chart",
]

DRAFT_PARAM = re.compile(
    r"spec|draft|budget|top.?k|lookahead|ngram|eagle|mtp|window|num.?speculative", re.I
)
"""Names of params that steer speculative decoding (the acceptance plot's x axes)."""


def _key(value: object) -> str:
    return format_value(value)


def _sorted_values(values: Sequence[object]) -> list[object]:
    present = list(dict.fromkeys(v for v in values if v is not None))
    if present and all(is_number(v) for v in present):
        return sorted(present, key=lambda v: float(v))  # type: ignore[arg-type]
    return present


def _better(a: Standing, b: Standing, direction: str) -> bool:
    rank = {Status.FEASIBLE: 0, Status.INFEASIBLE: 1, Status.FAILED: 2, Status.UNMEASURED: 3}
    if rank[a.status] != rank[b.status]:
        return rank[a.status] < rank[b.status]
    if a.value is None or b.value is None:
        return False
    return a.value > b.value if direction == "max" else a.value < b.value


def heatmap_chart(
    data: SweepData, index: ResultIndex, best: BestResult | None, params: Sequence[str] = ()
) -> Chart | None:
    """The objective over the first two swept params (or ``params``). With more
    swept params a cell shows the best trial among those that share its two values."""
    found = objective_ref(best)
    names = list(params) or swept_params(data)
    if found is None or len(names) < 2:
        return None
    ref, direction = found
    px, py = names[0], names[1]
    rows = standings(data, index, best)
    xs = _sorted_values([s.trial.params.get(px) for s in rows])
    ys = _sorted_values([s.trial.params.get(py) for s in rows])
    cells: dict[tuple[int, int], tuple[Standing, int]] = {}
    for s in rows:
        if px not in s.trial.params or py not in s.trial.params:
            continue
        at = (xs.index(s.trial.params[px]), ys.index(s.trial.params[py]))
        held = cells.get(at)
        count = held[1] + 1 if held else 1
        if held is None or _better(s, held[0], direction):
            cells[at] = (s, count)
        else:
            cells[at] = (held[0], count)
    measured, infeasible, failed = [], [], []
    for (xi, yi), (s, count) in sorted(cells.items()):
        item: dict[str, Any] = {"trial": s.trial.id, "level": _level_key(ref)}
        lines = [f"{ref.key} = {fmt(s.value)}" if s.value is not None else ref.key + ": -"]
        if count > 1:
            lines.append(f"best of {count} trials with these two values")
        if s.status == Status.FEASIBLE:
            item.update(value=[xi, yi, s.value], text=fmt(s.value))
            measured.append(item | {"lines": lines})
        elif s.status == Status.INFEASIBLE:
            text = f"{fmt(s.value)}\ninfeasible"
            item.update(value=[xi, yi, 0], text=text)
            infeasible.append(item | {"lines": [*lines, f"infeasible: {s.why}"]})
        else:
            item.update(value=[xi, yi, 0], text=s.why.replace(" (", "\n("))
            failed.append(item | {"lines": [*lines, f"{s.status}: {s.why}"]})
    values = [c["value"][2] for c in measured]
    label = {"show": True, "fromData": True, "fontSize": 11, "lineHeight": 15}
    option = {
        "grid": {"left": 80, "right": 30, "top": 40, "bottom": 60},
        "xAxis": {"type": "category", "data": [_key(v) for v in xs], "name": px,
                  "nameLocation": "middle", "nameGap": 30, "axisLabel": {"interval": 0}},
        "yAxis": {"type": "category", "data": [_key(v) for v in ys], "name": py,
                  "axisLabel": {"interval": 0}},
        "visualMap": {
            "seriesIndex": 0, "min": min(values, default=0), "max": max(values, default=1),
            "calculable": False, "orient": "horizontal", "left": "center", "top": 0,
            "itemHeight": 120,
            "inRange": {"color": ["#f7fbff", "#6baed6", "#08306b"] if direction == "max"
                        else ["#08306b", "#6baed6", "#f7fbff"]},
            "text": ["better", "worse"] if direction == "max" else ["worse", "better"],
        },
        "series": [
            {"type": "heatmap", "name": "feasible", "data": measured, "label": label},
            {"type": "heatmap", "name": "infeasible", "data": infeasible, "label": label,
             "itemStyle": {"color": "#e0e0e0"}},
            {"type": "heatmap", "name": "failed", "data": failed, "label": label,
             "itemStyle": {"color": "#f4c7c3"}},
        ],
    }  # fmt: skip
    note = (
        f"Cells: {ref.key} ({direction}), the mean over repeats. Grey: measured but "
        "infeasible (a constraint was violated); red: the trial failed, with its class; "
        "empty: no trial with these two values."
    )
    if len(names) > 2:
        note += f" Other swept params ({', '.join(names[2:])}): each cell shows its best trial."
    return Chart(
        "chart-heatmap", f"{ref.key} over {px} × {py}", option, "cell", height=120 + 46 * len(ys),
        note=note,
    )  # fmt: skip


def _level_key(ref: MetricRef) -> str | None:
    return f"{ref.workload}.{ref.level}" if ref.workload and ref.level else None


def metric_vs_param_charts(
    data: SweepData,
    index: ResultIndex,
    best: BestResult | None,
    ref: MetricRef,
    params: Sequence[str],
    *,
    id_prefix: str,
    direction: str | None = None,
) -> list[Chart]:
    """``ref`` against each param of ``params``, one series (colour, line) per value
    of another swept param. Hollow: infeasible; large diamond: the best; red cross:
    failed (drawn at zero)."""
    swept = swept_params(data)
    rows = standings(data, index, best, ref)
    charts: list[Chart] = []
    for n, name in enumerate(params):
        others = [p for p in swept if p != name]
        colour_by = others[0] if others else None
        axis, categories = axis_for([s.trial.params.get(name) for s in rows])
        groups: dict[str, list[Standing]] = {}
        for s in rows:
            if s.value is None or s.status == Status.FAILED or name not in s.trial.params:
                continue  # a failed trial is a red cross, whatever it measured first
            key = f"{colour_by}={_key(s.trial.params.get(colour_by))}" if colour_by else ref.key
            groups.setdefault(key, []).append(s)
        if not groups:
            continue
        series: list[dict[str, Any]] = []
        # a line only joins points that differ in `name` alone
        joined = len(others) <= 1
        for i, (key, members) in enumerate(groups.items()):
            color = PALETTE[i % len(PALETTE)]
            ordered = sorted(members, key=lambda s: _x_sort(s.trial.params.get(name)))
            points = [_point(s, name, ref, categories, color) for s in ordered]
            series.append(
                {"type": "line" if joined else "scatter", "name": key, "data": points,
                 "color": color, "symbol": "circle", "symbolSize": 10, "showAllSymbol": True,
                 "lineStyle": {"width": 1.5, "opacity": 0.7}}
            )  # fmt: skip
            bars = error_bars(index, ref, ordered, name, categories)
            if bars:
                series.append(
                    {"type": "custom", "name": key, "renderItem": "error-bar", "data": bars,
                     "color": color, "silent": True, "z": 1,
                     "encode": {"x": 0, "y": [1, 2]}}
                )  # fmt: skip
        band = value_band([s.value for g in groups.values() for s in g if s.value is not None])
        floor = band[0] if band else 0.0
        failed = [s for s in rows if s.status == Status.FAILED and name in s.trial.params]
        if failed:
            series.append(
                {"type": "scatter", "name": "failed (at the bottom)", "color": FAILED_COLOR,
                 "symbol": "path://M0,0L10,10M10,0L0,10", "symbolSize": 12,
                 "itemStyle": {"borderColor": FAILED_COLOR, "borderWidth": 2.5},
                 "data": [{"value": [_x(s.trial.params.get(name), categories), floor],
                           "trial": s.trial.id, "lines": [f"failed: {s.why}"]}
                          for s in failed]}
            )  # fmt: skip
        how = f" ({direction})" if direction else ""
        option = {
            "grid": {"left": 70, "right": 30, "top": 50, "bottom": 55},
            "legend": {"top": 0, "type": "scroll"},
            "xAxis": axis | {"name": name, "nameLocation": "middle", "nameGap": 30},
            # not from zero: the measured band fills the chart (ECharts picks nice ends)
            "yAxis": {"type": "value", "name": ref.key + how, "scale": True},
            "dataZoom": [{"type": "inside"}],
            "series": series,
        }
        charts.append(
            Chart(f"{id_prefix}-{n}", f"{ref.key} vs {name}", option, "point", height=340)
        )
    return charts


def error_bars(
    index: ResultIndex,
    ref: MetricRef,
    members: Sequence[Standing],
    name: str,
    categories: list[str] | None,
) -> list[list[object]]:
    """``[x, lo, hi]`` of each member's confidence interval on ``ref`` (members
    without one are left out): drawn by the page as error bars (``error-bar``)."""
    out: list[list[object]] = []
    for s in members:
        stats = index.stats(s.trial, ref)
        if stats is None or stats.lo is None or stats.hi is None:
            continue
        out.append([_x(s.trial.params.get(name), categories), stats.lo, stats.hi])
    return out


def _x_sort(value: object) -> tuple[int, float, str]:
    return (0, float(value), "") if is_number(value) else (1, 0.0, _key(value))  # type: ignore[arg-type]


def _x(value: object, categories: list[str] | None) -> object:
    return _key(value) if categories is not None else value


def _point(
    s: Standing, name: str, ref: MetricRef, categories: list[str] | None, color: str
) -> dict[str, Any]:
    lines = [f"{ref.key} = {fmt(s.value)}"]
    if s.interval is not None:
        lo, hi, confidence = s.interval
        lines[0] += f" ({confidence:.0%} interval {fmt(lo)}..{fmt(hi)})"
    item: dict[str, Any] = {
        "value": [_x(s.trial.params.get(name), categories), s.value],
        "trial": s.trial.id,
        "level": _level_key(ref),
    }
    if s.status == Status.INFEASIBLE:
        lines.append(f"infeasible: {s.why}")
        item["symbol"] = "emptyCircle"
        item["symbolSize"] = 11
        item["itemStyle"] = {"borderWidth": 2.5}
    if s.best:
        lines.append("the best configuration")
        item["symbol"] = "diamond"
        item["symbolSize"] = 20
        item["itemStyle"] = {"borderColor": "#111111", "borderWidth": 2}
    item["lines"] = lines
    return item


def parallel_chart(data: SweepData, index: ResultIndex, best: BestResult | None) -> Chart | None:
    """One line per measured trial across every swept param and the objective,
    coloured by the objective; infeasible trials grey."""
    found = objective_ref(best)
    names = swept_params(data)
    if found is None or not names:
        return None
    ref, direction = found
    everything = standings(data, index, best)
    rows = [s for s in everything if s.value is not None and s.status != Status.FAILED]
    if len(rows) < 2:
        return None
    # a param the drawn trials all share (one only failed trials vary) is no axis
    names = [n for n in names if len({repr(s.trial.params.get(n)) for s in rows}) > 1] or names
    axes: list[dict[str, Any]] = []
    for i, name in enumerate(names):
        axis, _ = axis_for([s.trial.params.get(name) for s in everything])
        axes.append(axis | {"dim": i, "name": name})
    axes.append({"dim": len(names), "name": f"{ref.key} ({direction})", "type": "value",
                 "scale": True})  # fmt: skip
    feasible: list[dict[str, Any]] = []
    grey: list[dict[str, Any]] = []
    for s in rows:
        values = [
            _key(s.trial.params.get(n)) if axes[i].get("data") else s.trial.params.get(n)
            for i, n in enumerate(names)
        ]
        lines = [f"{ref.key} = {fmt(s.value)}"]
        if s.interval is not None:
            lo, hi, confidence = s.interval
            lines[0] += f" ({confidence:.0%} interval {fmt(lo)}..{fmt(hi)})"
        item = {"value": [*values, s.value], "trial": s.trial.id, "level": _level_key(ref),
                "lines": lines}  # fmt: skip
        if s.status == Status.FEASIBLE:
            feasible.append(item)
        else:
            lines.append(f"infeasible: {s.why}")
            grey.append(item)
    objective = [s.value for s in rows if s.status == Status.FEASIBLE and s.value is not None]
    option = {
        "parallelAxis": axes,
        "parallel": {"left": 60, "right": 90, "top": 50, "bottom": 40},
        "legend": {"top": 0},
        "visualMap": {
            "seriesIndex": 0, "dimension": len(names), "min": min(objective, default=0),
            "max": max(objective, default=1), "show": False,
            "inRange": {"color": ["#fdae61", "#abd9e9", "#2c7bb6"] if direction == "max"
                        else ["#2c7bb6", "#abd9e9", "#fdae61"]},
        },
        "series": [
            {"type": "parallel", "name": "feasible", "data": feasible,
             "lineStyle": {"width": 2.5, "opacity": 0.85}, "emphasis": {"lineStyle": {"width": 5}}},
            {"type": "parallel", "name": "infeasible", "data": grey, "color": INFEASIBLE_COLOR,
             "lineStyle": {"width": 1.5, "type": "dashed", "opacity": 0.8}},
        ],
    }  # fmt: skip
    failed = sum(1 for s in everything if s.status == Status.FAILED)
    note = "Drag along an axis to keep only the lines that cross it there (brush)."
    if failed:
        note += f" {failed} failed trial(s) are not drawn (the heatmap shows their class)."
    return Chart("chart-parallel", "parallel coordinates", option, "point", 380, note)


def acceptance_charts(data: SweepData, index: ResultIndex, best: BestResult | None) -> list[Chart]:
    """Acceptance length of speculative decoding against each draft param, at the
    objective's level when it was measured there (else the first level with it)."""
    where: list[tuple[str, str]] = []
    for levels in index.levels.values():
        for lvl in levels:
            if "acceptance_length" in lvl.metrics and (lvl.workload, lvl.level) not in where:
                where.append((lvl.workload, lvl.level))
    if not where:
        return []
    found = objective_ref(best)
    workload, level = where[0]
    if found and (found[0].workload, found[0].level) in where:
        workload, level = found[0].workload or workload, found[0].level or level
    ref = MetricRef(workload, level, "acceptance_length", f"{workload}.{level}.acceptance_length")
    swept = swept_params(data)
    draft = [p for p in swept if DRAFT_PARAM.search(p)] or swept
    return metric_vs_param_charts(
        data, index, best, ref, draft, id_prefix="chart-acceptance", direction="max"
    )
