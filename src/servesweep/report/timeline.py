"""Where the sweep's time and GPU memory went.

- The timeline: one lane per node and slot (``TrialRecord.lane``), one bar per phase
  of every trial that ran there, coloured by phase (a legend entry per phase).
- GPU memory: one strip per GPU (per node), on one shared time axis, so that no
  GPU's line hides another's; release phases are shaded, so a release that fell
  between two samples still shows where it happened.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from servesweep.decide.stats import config_label, swept_params
from servesweep.models import Outcome
from servesweep.records import SweepData, TelemetryPoint, TrialRecord
from servesweep.report.charts import FAILED_COLOR, PALETTE, Chart, fmt, outcome_text

__all__ = [
    "MAX_MEMORY_POINTS",
    "PHASE_COLORS",
    "memory_chart",
    "reduce_extremes",
    "sweep_origin",
    "timeline_chart",
]

PHASE_COLORS: dict[str, str] = {
    "stop": "#7f7f7f",
    "release": "#d62728",
    "start": "#ff7f0e",
    "load": "#9467bd",
    "ready": "#17becf",
    "bench": "#2ca02c",
}

MAX_MEMORY_POINTS = 3000
"""Per GPU; a longer series keeps the lowest and the highest sample of each stretch."""


def sweep_origin(data: SweepData) -> float:
    starts = [s for t in data.trials for s in t.phase_started.values()]
    starts += [p.t for p in data.telemetry]
    return min(starts, default=data.sweep.created_at)


def _lane_name(trial: TrialRecord, single_node: bool) -> str:
    if not trial.node and trial.slot is None:
        return "this machine"
    if single_node and trial.slot is not None:
        return f"slot {trial.slot}"
    return trial.lane


def _phase_spans(trial: TrialRecord, now: float | None) -> list[tuple[str, float, float, str]]:
    """(phase, start, seconds, note) of each phase the trial went through."""
    spans = []
    for phase, started in trial.phase_started.items():
        if phase == "done":
            continue
        secs = trial.phase_seconds.get(phase)
        note = ""
        if secs is None and trial.finished_at is not None:
            secs = max(trial.finished_at - started, 0.0)
        elif secs is None and trial.outcome is Outcome.RUNNING and now is not None:
            secs, note = max(now - started, 0.0), " so far (running)"
        if secs is not None and math.isfinite(secs):
            spans.append((phase, started, secs, note))
    return spans


def timeline_chart(data: SweepData, now: float | None = None) -> Chart | None:
    """Lanes (node/slot) × time; the phase a running trial is in lasts until ``now``."""
    trials = [t for t in sorted(data.trials, key=lambda t: (t.seq, t.id)) if t.phase_started]
    if not trials:
        return None
    origin = sweep_origin(data)
    single_node = len({t.node for t in trials}) <= 1
    lanes = sorted({_lane_name(t, single_node) for t in trials})
    params = swept_params(data)
    by_phase: dict[str, list[dict[str, Any]]] = {p: [] for p in PHASE_COLORS}
    end = 0.0
    for trial in trials:
        lane = lanes.index(_lane_name(trial, single_node))
        failed = trial.outcome is Outcome.FAILED
        for phase, started, secs, note in _phase_spans(trial, now):
            begin = started - origin
            end = max(end, begin + secs)
            item: dict[str, Any] = {
                "value": [lane, begin, begin + secs],
                "trial": trial.id,
                "lines": [
                    f"{config_label(trial, params)}",
                    f"{phase}: {fmt(secs)} s{note}",
                    f"outcome: {outcome_text(trial)}",
                ],
            }
            if failed:
                item["itemStyle"] = {"borderColor": FAILED_COLOR, "borderWidth": 2}
            by_phase.setdefault(phase, []).append(item)
    minutes = end > 600
    scale = 60.0 if minutes else 1.0
    series = []
    for phase, items in by_phase.items():
        if not items:
            continue
        for item in items:
            lane, a, b = item["value"]
            item["value"] = [lane, a / scale, b / scale]
        series.append(
            {"type": "custom", "name": phase, "renderItem": "lane-bar",
             "color": PHASE_COLORS.get(phase, "#bbbbbb"), "encode": {"x": [1, 2], "y": 0},
             "data": items}
        )  # fmt: skip
    unit = "minutes" if minutes else "seconds"
    option = {
        "grid": {"left": 110, "right": 30, "top": 40, "bottom": 70},
        "legend": {"top": 0},
        "xAxis": {"type": "value", "name": f"{unit} since the sweep started",
                  "nameLocation": "middle", "nameGap": 28, "min": 0},
        "yAxis": {"type": "category", "data": lanes, "inverse": True},
        "dataZoom": [{"type": "slider", "xAxisIndex": 0, "height": 16, "bottom": 8},
                     {"type": "inside", "xAxisIndex": 0}],
        "series": series,
    }  # fmt: skip
    return Chart(
        "chart-timeline",
        "where the sweep's time went",
        option,
        "item",
        height=150 + 44 * len(lanes),
        note="One lane per node and slot; one bar per phase of each trial (a red outline: "
        "the trial failed). Drag the slider or scroll on the chart to zoom in time.",
    )


def reduce_extremes(points: Sequence[TelemetryPoint], limit: int) -> list[TelemetryPoint]:
    """At most about ``limit`` points in time order, keeping the lowest and the highest
    sample of each stretch, so that no dip (a release) or peak disappears."""
    if len(points) <= limit:
        return list(points)
    size = math.ceil(len(points) / max(limit // 2, 1))
    kept: list[TelemetryPoint] = []
    for start in range(0, len(points), size):
        chunk = points[start : start + size]
        low = min(chunk, key=lambda p: p.used_bytes)
        high = max(chunk, key=lambda p: p.used_bytes)
        kept.extend(sorted({id(low): low, id(high): high}.values(), key=lambda p: p.t))
    return kept


def _sample_interval(points: Sequence[TelemetryPoint]) -> float | None:
    gaps = sorted(b.t - a.t for a, b in itertools.pairwise(points) if b.t > a.t)
    return gaps[len(gaps) // 2] if gaps else None


IDLE_GAP_S = 5.0
"""A stretch this long (or ten sampling intervals) without samples breaks the line."""


def _with_breaks(
    points: Sequence[TelemetryPoint],
    idle: float,
    origin: float,
    scale: float,
    name: str,
    numbers: dict[int, int],
) -> list[dict[str, Any]]:
    """The memory series' data, with an empty point where no sample was taken for
    longer than ``idle`` seconds (the line breaks there instead of ramping)."""
    out: list[dict[str, Any]] = []
    before: TelemetryPoint | None = None
    for p in points:
        if before is not None and p.t - before.t > idle:
            out.append({"value": [((before.t + p.t) / 2 - origin) / scale, None], "lines": []})
        number = numbers.get(p.trial_id, p.trial_id)
        out.append(
            {
                "value": [(p.t - origin) / scale, p.used_bytes / 2**30],
                "trial": p.trial_id,
                "lines": [
                    f"{name}: {fmt(p.used_bytes / 2**30)} GiB",
                    f"at {fmt(p.t - origin)} s, trial #{number}",
                ],
            }
        )
        before = p
    return out


def memory_chart(data: SweepData) -> Chart | None:
    """Used memory of every GPU over the sweep (GiB), one strip per GPU."""
    if not data.telemetry:
        return None
    origin = sweep_origin(data)
    last = max(p.t for p in data.telemetry) - origin
    minutes = last > 600
    scale = 60.0 if minutes else 1.0
    gpus = sorted({(p.node, p.gpu) for p in data.telemetry})
    numbers = {t.id: t.number for t in data.trials}
    many_nodes = len({n for n, _ in gpus}) > 1
    releases = [
        [{"xAxis": (s - origin) / scale, "name": f"#{t.number} release"},
         {"xAxis": (s - origin + t.phase_seconds.get("release", 0.0)) / scale}]
        for t in data.trials
        if (s := t.phase_started.get("release")) is not None
    ]  # fmt: skip
    strip, gap, top = 90, 28, 40
    end = math.ceil(last / scale) or 1
    grids, xaxes, yaxes, series = [], [], [], []
    intervals: list[float] = []
    peak = max(p.used_bytes for p in data.telemetry) / 2**30
    for i, (node, gpu) in enumerate(gpus):
        name = f"{node} GPU {gpu}" if many_nodes else f"GPU {gpu}"
        points = sorted((p for p in data.telemetry if (p.node, p.gpu) == (node, gpu)),
                        key=lambda p: p.t)  # fmt: skip
        if (step := _sample_interval(points)) is not None:
            intervals.append(step)
        shown = reduce_extremes(points, MAX_MEMORY_POINTS)
        # no line across a stretch without samples (between two runs of the sweep): it
        # would draw a slow ramp that looks like a slow release
        idle = max(10 * step, IDLE_GAP_S) if step is not None else IDLE_GAP_S
        grids.append({"left": 90, "right": 30, "top": top + i * (strip + gap), "height": strip})
        xaxes.append(
            {
                "type": "value",
                "gridIndex": i,
                "min": 0,
                "max": end,
                "axisLabel": {"show": i == len(gpus) - 1},
                "name": f"{'minutes' if minutes else 'seconds'} since the sweep started"
                if i == len(gpus) - 1
                else "",
                "nameLocation": "middle",
                "nameGap": 26,
            }
        )
        yaxes.append({"type": "value", "gridIndex": i, "name": name, "min": 0,
                      "max": math.ceil(peak * 1.05) or 1, "nameLocation": "middle",
                      "nameGap": 55, "splitNumber": 2})  # fmt: skip
        series.append(
            {"type": "line", "name": name, "xAxisIndex": i, "yAxisIndex": i, "showSymbol": False,
             "color": PALETTE[i % len(PALETTE)], "lineStyle": {"width": 1.8},
             "areaStyle": {"opacity": 0.12},
             "connectNulls": False,
             "data": _with_breaks(shown, idle, origin, scale, name, numbers),
             "markArea": {"silent": True, "itemStyle": {"color": "rgba(214,39,40,0.12)"},
                          "label": {"show": False}, "data": releases}}
        )  # fmt: skip
    option = {
        "grid": grids,
        "xAxis": xaxes,
        "yAxis": yaxes,
        "legend": {"top": 0, "type": "scroll"},
        "axisPointer": {"link": [{"xAxisIndex": "all"}]},
        "dataZoom": [{"type": "inside", "xAxisIndex": list(range(len(gpus)))}],
        "series": series,
    }
    note = (
        "Used memory per GPU in GiB, one strip each; shaded: release phases; a gap in a "
        "line: no samples (between runs)."
    )
    if intervals:
        every = sorted(intervals)[len(intervals) // 2]
        note += (
            f" Sampled every {fmt(every)} s: a release shorter than that can fall between "
            "two samples (the shading still shows when it happened)."
        )
    return Chart(
        "chart-memory",
        "GPU memory used",
        option,
        "axis",
        height=top + len(gpus) * (strip + gap) + 40,
        note=note,
    )
