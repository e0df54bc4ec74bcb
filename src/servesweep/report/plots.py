"""The HTML report's plots, built from a SweepData: the objective against each
swept parameter, throughput against latency with the Pareto front, the timeline
of every trial's phases, and GPU memory over time."""

from __future__ import annotations

import math
from collections.abc import Sequence

from servesweep.models import Outcome
from servesweep.report.best import BestResult
from servesweep.report.data import config_label, format_number, format_value, swept_params
from servesweep.report.refs import ResultIndex
from servesweep.report.svg import PALETTE, Bar, Point, Series, timeline_chart, xy_chart
from servesweep.spec.constraints import MetricRef
from servesweep.store.records import SweepData, TrialRecord

__all__ = [
    "PHASE_COLORS",
    "memory_plot",
    "objective_plots",
    "pareto_front",
    "throughput_latency_plots",
    "timeline_plot",
]

PHASE_COLORS: dict[str, str] = {
    "stop": "#7f7f7f",
    "release": "#d62728",
    "start": "#ff7f0e",
    "load": "#9467bd",
    "ready": "#17becf",
    "bench": "#2ca02c",
}

MAX_MEMORY_POINTS = 2000
"""Per GPU; longer series are thinned evenly."""
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


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def objective_plots(
    data: SweepData, index: ResultIndex, best: BestResult | None, objective: MetricRef | None
) -> list[str]:
    """One chart per swept param: the objective of each trial against the param's
    value. Hollow: excluded by a constraint; cross: failed; ringed: the best."""
    if objective is None or best is None:
        return []
    excluded = {e.trial.id: e for e in best.excluded}
    winner = best.trial.id if best.trial else None
    direction = best.objectives[0][1] if best.objectives else "max"
    charts: list[str] = []
    for name in swept_params(data):
        values = [t.params.get(name) for t in data.trials]
        numeric = all(_is_number(v) for v in values if v is not None) and any(
            v is not None for v in values
        )
        ok_points: list[Point] = []
        failed_points: list[Point] = []
        for trial in sorted(data.trials, key=lambda t: (t.seq, t.id)):
            raw = trial.params.get(name)
            x: float | str = float(raw) if numeric and raw is not None else format_value(raw)
            value = index.value(trial, objective)
            label = config_label(trial)
            if value is None or not math.isfinite(value):
                if trial.outcome is Outcome.FAILED:
                    cls = trial.failure_class.value if trial.failure_class else "failed"
                    failed_points.append(Point(x, math.nan, f"{label}: failed {cls}", "cross"))
                continue
            why = excluded.get(trial.id)
            marker = "star" if trial.id == winner else ("ring" if why else "dot")
            tip = f"{label}: {objective.key} = {format_number(value)}"
            if why:
                tip += f" (excluded: {why.reason})"
            ok_points.append(Point(x, value, tip, marker))
        if not ok_points:
            continue
        categories = None
        if not numeric:
            categories = list(dict.fromkeys(format_value(v) for v in values))
        charts.append(
            xy_chart(
                f"{objective.key} ({direction}) vs {name}",
                name,
                objective.key,
                [Series("trials", ok_points), Series("failed", failed_points, "#d62728")],
                categories=categories,
                element_id=f"plot-objective-{len(charts)}",
            )
        )
    return charts


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points (latency, throughput) that no other point beats on both (lower
    latency and higher throughput), sorted by latency."""
    front: list[tuple[float, float]] = []
    best_tp = -math.inf
    for lat, tp in sorted(points, key=lambda p: (p[0], -p[1])):
        if tp > best_tp:
            front.append((lat, tp))
            best_tp = tp
    return front


def _latency_metric(index: ResultIndex, workload: str) -> str | None:
    seen: set[str] = set()
    for levels in index.levels.values():
        for lvl in levels:
            if lvl.workload == workload:
                seen.update(lvl.metrics)
    if THROUGHPUT not in seen:
        return None
    return next((m for m in LATENCY_PREFERENCE if m in seen), None)


def throughput_latency_plots(data: SweepData, index: ResultIndex) -> list[str]:
    """Per load workload: each configuration's levels as a line of (latency,
    throughput) points, the Pareto front across all of them dashed, front points
    ringed."""
    charts: list[str] = []
    params = swept_params(data)
    for workload in index.workloads():
        latency = _latency_metric(index, workload)
        if latency is None:
            continue
        raw: list[tuple[TrialRecord, str, float, float]] = []
        for trial in sorted(data.trials, key=lambda t: (t.seq, t.id)):
            for lvl in index.levels.get(trial.id, ()):
                tp, lat = lvl.metrics.get(THROUGHPUT), lvl.metrics.get(latency)
                if lvl.workload != workload or tp is None or lat is None:
                    continue
                if math.isfinite(tp.mean) and math.isfinite(lat.mean):
                    raw.append((trial, lvl.level, lat.mean, tp.mean))
        if not raw:
            continue
        front = pareto_front([(lat, tp) for _, _, lat, tp in raw])
        on_front = set(front)
        series: list[Series] = []
        trials = list(dict.fromkeys(t.id for t, *_ in raw))
        for i, tid in enumerate(trials):
            pts = [
                Point(
                    lat,
                    tp,
                    f"{config_label(t, params)} {level}: {format_number(tp)} tok/s, "
                    f"{latency} {format_number(lat)}"
                    + (" (Pareto front)" if (lat, tp) in on_front else ""),
                    "star" if (lat, tp) in on_front else "dot",
                )
                for t, level, lat, tp in raw
                if t.id == tid
            ]
            label = config_label(next(t for t, *_ in raw if t.id == tid), params)
            series.append(Series(label, pts, PALETTE[i % len(PALETTE)], line=True))
        charts.append(
            xy_chart(
                f"{workload}: throughput vs latency (dashed: Pareto front)",
                latency,
                THROUGHPUT,
                series,
                front=front,
                width=560,
                element_id=f"plot-pareto-{len(charts)}",
                legend=True,
            )
        )
    return charts


def sweep_origin(data: SweepData) -> float:
    starts = [s for t in data.trials for s in t.phase_started.values()]
    starts += [p.t for p in data.telemetry]
    return min(starts, default=data.sweep.created_at)


def timeline_plot(data: SweepData, now: float | None = None) -> str | None:
    """One row per trial, one bar per phase it went through; the phase a running
    trial is in lasts until ``now`` (the time the report is rendered)."""
    origin = sweep_origin(data)
    rows: list[str] = []
    bars: list[Bar] = []
    for trial in sorted(data.trials, key=lambda t: (t.seq, t.id)):
        if not trial.phase_started:
            continue
        row = f"#{trial.id} {trial.outcome.value}"
        rows.append(row)
        for phase, started in trial.phase_started.items():
            if phase == "done":
                continue
            secs = trial.phase_seconds.get(phase)
            note = ""
            if secs is None and trial.finished_at is not None:
                secs = max(trial.finished_at - started, 0.0)
            elif secs is None and trial.outcome is Outcome.RUNNING and now is not None:
                secs, note = max(now - started, 0.0), " so far (running)"
            if secs is None or not math.isfinite(secs):
                continue
            bars.append(
                Bar(
                    row,
                    started - origin,
                    secs,
                    PHASE_COLORS.get(phase, "#bbbbbb"),
                    f"#{trial.id} {phase}: {format_number(secs)} s{note}",
                )
            )
    if not bars:
        return None
    return timeline_chart(
        "where the sweep's time went (phases per trial)", rows, bars, element_id="plot-timeline"
    )


def memory_plot(data: SweepData) -> str | None:
    """Used GPU memory of each GPU over the sweep (GiB)."""
    if not data.telemetry:
        return None
    origin = sweep_origin(data)
    minutes = (max(p.t for p in data.telemetry) - origin) > 600
    scale = 60.0 if minutes else 1.0
    series: list[Series] = []
    for i, gpu in enumerate(sorted({p.gpu for p in data.telemetry})):
        pts = [
            Point(
                (p.t - origin) / scale,
                p.used_bytes / 2**30,
                f"GPU {gpu} trial #{p.trial_id}: {p.used_bytes / 2**30:.1f} GiB",
            )
            for p in sorted(data.telemetry, key=lambda p: p.t)
            if p.gpu == gpu
        ]
        step = max(len(pts) // MAX_MEMORY_POINTS, 1)
        pts = pts[::step]
        markers = len(pts) <= 200
        series.append(Series(f"GPU {gpu}", pts, PALETTE[i % len(PALETTE)], True, markers))
    return xy_chart(
        "GPU memory used",
        f"{'minutes' if minutes else 'seconds'} since the sweep started",
        "GiB",
        series,
        width=1100,
        element_id="plot-memory",
        legend=True,
    )
