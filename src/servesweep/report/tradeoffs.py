"""Trade-offs between speed for the user and speed for the fleet.

- Throughput against latency, per load level: each configuration is a point, and
  the Pareto front of each level (no other configuration has both lower latency and
  higher throughput at that level) is drawn as a dashed step line.
- Output tokens/s per user (1000 / median TPOT) against output tokens/s per GPU
  (output throughput / the trial's GPUs): the field's standard view of what a
  configuration costs for the interactivity it gives; one line per configuration
  through its load levels, and the front across all of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from servesweep.decide.refs import ResultIndex
from servesweep.decide.resources import trial_gpus
from servesweep.decide.stats import config_label, level_sort_key, swept_params
from servesweep.records import SweepData, TrialRecord
from servesweep.report.charts import PALETTE, Chart, fmt

__all__ = [
    "LATENCY_PREFERENCE",
    "THROUGHPUT",
    "pareto_front",
    "per_user_per_gpu_charts",
    "throughput_latency_charts",
]

THROUGHPUT = "output_throughput"
LATENCY_PREFERENCE = (
    "tpot_median_ms",
    "e2e_median_ms",
    "ttft_median_ms",
    "ttft_p99_ms",
    "itl_median_ms",
    "tpot_mean_ms",
    "e2e_mean_ms",
)
PER_USER = "tpot_median_ms"


def pareto_front(
    points: Sequence[tuple[float, float]], *, x_better: str = "min", y_better: str = "max"
) -> list[tuple[float, float]]:
    """The points that no other point beats on both coordinates (``x_better`` and
    ``y_better``: ``min`` or ``max``), sorted by x as a front is drawn."""
    sx = 1.0 if x_better == "min" else -1.0
    sy = 1.0 if y_better == "max" else -1.0
    front: list[tuple[float, float]] = []
    best_y = -math.inf
    for x, y in sorted(set(points), key=lambda p: (sx * p[0], -sy * p[1])):
        if sy * y > best_y:
            front.append((x, y))
            best_y = sy * y
    return sorted(front)


def staircase(
    front: Sequence[tuple[float, float]],
    everything: Sequence[tuple[float, float]],
    *,
    x_better: str = "min",
) -> list[list[float]]:
    """The boundary of what the front dominates (y is maximised), as a step line
    that starts and ends on the extremes of ``everything``: visible even when the
    front is a single point."""
    if not front:
        return []
    xs = [x for x, _ in everything]
    ys = [y for _, y in everything]
    pts = sorted(front)
    out: list[list[float]] = []
    if x_better == "min":  # region right of and below the front: climb from the bottom
        out.append([pts[0][0], min(ys)])
        for i, (x, y) in enumerate(pts):
            if i:
                out.append([x, pts[i - 1][1]])
            out.append([x, y])
        out.append([max(xs), pts[-1][1]])
    else:  # region left of and below the front: walk down to the bottom
        out.append([min(xs), pts[0][1]])
        for i, (x, y) in enumerate(pts):
            if i:
                out.append([pts[i - 1][0], y])
            out.append([x, y])
        out.append([pts[-1][0], min(ys)])
    return out


FRONT_STYLE = {"width": 6, "opacity": 0.3, "cap": "round", "join": "round"}
"""A wide translucent band: it stays visible under a configuration's own line."""


def _seen(index: ResultIndex, workload: str) -> set[str]:
    seen: set[str] = set()
    for levels in index.levels.values():
        for lvl in levels:
            if lvl.workload == workload:
                seen.update(lvl.metrics)
    return seen


def _ordered(data: SweepData) -> list[TrialRecord]:
    return sorted(data.trials, key=lambda t: (t.seq, t.id))


def throughput_latency_charts(data: SweepData, index: ResultIndex) -> list[Chart]:
    """One chart per load workload: output throughput against its latency metric
    (the first measured of :data:`LATENCY_PREFERENCE`), a colour per load level."""
    charts: list[Chart] = []
    for workload in index.workloads():
        seen = _seen(index, workload)
        latency = next((m for m in LATENCY_PREFERENCE if m in seen), None)
        if THROUGHPUT not in seen or latency is None:
            continue
        series: list[dict[str, Any]] = []
        for i, level in enumerate(index.workload_levels(workload)):
            color = PALETTE[i % len(PALETTE)]
            points: list[dict[str, Any]] = []
            for trial in _ordered(data):
                lvl = index.level(trial.id, workload, level)
                if lvl is None:
                    continue
                tp, lat = lvl.metrics.get(THROUGHPUT), lvl.metrics.get(latency)
                if tp is None or lat is None or not math.isfinite(tp.mean + lat.mean):
                    continue
                points.append(
                    {"value": [lat.mean, tp.mean], "trial": trial.id,
                     "level": f"{workload}.{level}",
                     "lines": [f"{level}: {fmt(tp.mean)} tok/s at {latency} {fmt(lat.mean)}"]}
                )  # fmt: skip
            if not points:
                continue
            values = [(p["value"][0], p["value"][1]) for p in points]
            front = pareto_front(values)
            for p in points:
                if (p["value"][0], p["value"][1]) in front:
                    p["lines"].append(f"on the {level} Pareto front")
                    p["symbolSize"] = 14
            series.append(
                {"type": "scatter", "name": level, "color": color, "symbolSize": 9,
                 "data": points}
            )  # fmt: skip
            series.append(
                {"type": "line", "name": f"{level} Pareto front", "color": color,
                 "symbol": "none", "silent": True, "z": 1, "lineStyle": FRONT_STYLE,
                 "data": staircase(front, values)}
            )  # fmt: skip
        if not series:
            continue
        option = {
            "grid": {"left": 70, "right": 30, "top": 60, "bottom": 55},
            "legend": {"top": 0, "type": "scroll"},
            "xAxis": {"type": "value", "name": f"{latency} (lower is better)",
                      "nameLocation": "middle", "nameGap": 30, "scale": True},
            "yAxis": {"type": "value", "name": f"{THROUGHPUT} (tok/s)", "scale": True},
            "dataZoom": [{"type": "inside", "xAxisIndex": 0}, {"type": "inside", "yAxisIndex": 0}],
            "series": series,
        }  # fmt: skip
        charts.append(
            Chart(
                f"chart-tradeoff-{len(charts)}",
                f"{workload}: throughput vs latency per load level",
                option,
                "point",
                400,
                "Each point is a configuration at one load level. The wide band of a "
                "level's colour is its Pareto front: no configuration has both lower "
                "latency and higher throughput than a point on it (front points are "
                "larger); everything below and right of it is dominated. Click a legend "
                "entry to hide it.",
            )
        )
    return charts


def per_user_per_gpu_charts(data: SweepData, index: ResultIndex) -> list[Chart]:
    """Per load workload with TPOT: tokens/s per user against tokens/s per GPU."""
    params = swept_params(data)
    charts: list[Chart] = []
    unknown_gpus = False
    for workload in index.workloads():
        seen = _seen(index, workload)
        if THROUGHPUT not in seen or PER_USER not in seen:
            continue
        series: list[dict[str, Any]] = []
        everything: list[tuple[float, float]] = []
        for i, trial in enumerate(_ordered(data)):
            gpus = trial_gpus(data, trial)
            unknown_gpus = unknown_gpus or gpus is None
            points: list[tuple[tuple[int, float, str], dict[str, Any]]] = []
            for lvl in index.levels.get(trial.id, ()):
                tp, tpot = lvl.metrics.get(THROUGHPUT), lvl.metrics.get(PER_USER)
                if lvl.workload != workload or tp is None or tpot is None:
                    continue
                if not (math.isfinite(tp.mean) and math.isfinite(tpot.mean)) or tpot.mean <= 0:
                    continue
                per_gpu = tp.mean / (gpus or 1)
                per_user = 1000.0 / tpot.mean
                everything.append((per_user, per_gpu))
                points.append(
                    (level_sort_key(lvl.level),
                     {"value": [per_user, per_gpu], "trial": trial.id,
                      "level": f"{workload}.{lvl.level}",
                      "lines": [f"{lvl.level}: {fmt(per_user)} tok/s per user, "
                                f"{fmt(per_gpu)} tok/s per GPU ({gpus or '1?'} GPUs)"]})
                )  # fmt: skip
            if points:
                points.sort(key=lambda p: p[0])
                series.append(
                    {"type": "line", "name": config_label(trial, params),
                     "color": PALETTE[i % len(PALETTE)], "symbol": "circle", "symbolSize": 8,
                     "data": [p for _, p in points]}
                )  # fmt: skip
        if not series:
            continue
        front = pareto_front(everything, x_better="max", y_better="max")
        series.append(
            {"type": "line", "name": "Pareto front", "color": "#111111", "symbol": "none",
             "silent": True, "z": 1, "lineStyle": FRONT_STYLE,
             "data": staircase(front, everything, x_better="max")}
        )  # fmt: skip
        option = {
            "grid": {"left": 80, "right": 30, "top": 60, "bottom": 55},
            "legend": {"top": 0, "type": "scroll"},
            "xAxis": {"type": "value", "name": "output tok/s per user (1000 / median TPOT)",
                      "nameLocation": "middle", "nameGap": 30, "scale": True},
            "yAxis": {"type": "value", "name": "output tok/s per GPU", "scale": True},
            "dataZoom": [{"type": "inside", "xAxisIndex": 0}, {"type": "inside", "yAxisIndex": 0}],
            "series": series,
        }  # fmt: skip
        note = (
            "One line per configuration through its load levels (more load: less per "
            "user, more per GPU). The wide grey band is the Pareto front: no point "
            "beats a point on it on both axes."
        )
        if unknown_gpus:
            note += " A trial whose GPUs are unknown counts as one GPU."
        charts.append(
            Chart(f"chart-per-gpu-{len(charts)}", f"{workload}: tokens/s per user vs per GPU",
                  option, "point", 400, note)
        )  # fmt: skip
    return charts
