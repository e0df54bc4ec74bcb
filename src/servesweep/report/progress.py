"""Search progress: how fast the sweep found its best configuration.

The best feasible objective so far against the trial number (trials in the order
they finished) and against the GPU-hours spent (each trial's wall time × its GPUs,
summed in that order): the curve a search strategy is judged by.
"""

from __future__ import annotations

from typing import Any

from servesweep.decide.best import BestResult
from servesweep.decide.refs import ResultIndex
from servesweep.decide.resources import trial_gpu_seconds
from servesweep.decide.standing import Status, best_so_far, objective_ref, standings
from servesweep.records import SweepData
from servesweep.report.charts import (
    FAILED_COLOR,
    INFEASIBLE_COLOR,
    PALETTE,
    Chart,
    fmt,
    value_band,
)

__all__ = ["progress_charts"]


def progress_charts(data: SweepData, index: ResultIndex, best: BestResult | None) -> list[Chart]:
    """Best so far against trial number and against GPU-hours (two charts), once
    at least two trials finished."""
    found = objective_ref(best)
    if found is None:
        return []
    ref, direction = found
    done = [s for s in standings(data, index, best) if s.trial.finished_at is not None]
    done.sort(key=lambda s: (s.trial.finished_at or 0.0, s.trial.id))
    if len(done) < 2:
        return []
    running = best_so_far(
        [s.value if s.status == Status.FEASIBLE else None for s in done], direction
    )
    hours: list[float] = []
    total = 0.0
    for s in done:
        total += trial_gpu_seconds(data, s.trial) / 3600.0
        hours.append(total)
    band = value_band([s.value for s in done if s.value is not None and s.status != Status.FAILED])
    floor = band[0] if band else 0.0
    charts = []
    for kind, xs, name in (
        ("trials", list(range(1, len(done) + 1)), "trials finished"),
        ("gpu-hours", hours, "GPU-hours spent"),
    ):
        groups: dict[str, list[dict[str, Any]]] = {"feasible": [], "infeasible": [], "failed": []}
        for x, s in zip(xs, done, strict=True):
            if s.status == Status.UNMEASURED:
                continue
            value = floor if s.status == Status.FAILED or s.value is None else s.value
            lines = [f"{name}: {fmt(x)}", f"{ref.key} = {fmt(s.value)}"]
            if s.why:
                lines.append(f"{s.status}: {s.why}")
            item = {"value": [x, value], "trial": s.trial.id, "lines": lines}
            groups[s.status if s.status in groups else "infeasible"].append(item)
        steps = [[x, v] for x, v in zip(xs, running, strict=True) if v is not None]
        series: list[dict[str, Any]] = [
            {"type": "line", "name": "best so far", "step": "end", "data": steps,
             "color": PALETTE[0], "symbol": "none", "silent": True, "lineStyle": {"width": 2.5}},
            {"type": "scatter", "name": "feasible", "data": groups["feasible"],
             "color": PALETTE[0], "symbolSize": 9},
            {"type": "scatter", "name": "infeasible", "data": groups["infeasible"],
             "color": INFEASIBLE_COLOR, "symbolSize": 9},
            {"type": "scatter", "name": "failed (at the bottom)", "data": groups["failed"],
             "color": FAILED_COLOR, "symbol": "triangle", "symbolSize": 9},
        ]  # fmt: skip
        option = {
            "grid": {"left": 70, "right": 30, "top": 50, "bottom": 55},
            "legend": {"top": 0},
            "xAxis": {"type": "value", "name": name, "nameLocation": "middle", "nameGap": 30,
                      "min": 0 if kind == "gpu-hours" else 1},
            # not from zero: the measured band fills the chart (ECharts picks nice ends)
            "yAxis": {"type": "value", "name": f"{ref.key} ({direction})", "scale": True},
            "series": series,
        }  # fmt: skip
        charts.append(
            Chart(f"chart-progress-{kind}", f"best {ref.key} so far vs {name}", option,
                  "point", 330)
        )  # fmt: skip
    return charts
