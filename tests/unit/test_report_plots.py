"""Plot helpers: tick values, the Pareto front, and the SVG charts' content."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from helpers.report_data import sweep_data, throughput_sweep, trial
from servesweep.report.plots import memory_plot, pareto_front, timeline_plot
from servesweep.report.svg import Point, Series, nice_ticks, xy_chart


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    assert nice_ticks(0.0, 100.0) == [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
    ticks = nice_ticks(3.2, 17.9)
    assert ticks[0] <= 3.2 and ticks[-1] >= 17.9
    steps = {round(b - a, 9) for a, b in itertools.pairwise(ticks)}
    assert len(steps) == 1 and steps.pop() in (2.0, 2.5, 5.0)
    assert nice_ticks(5.0, 5.0)[0] <= 5.0 <= nice_ticks(5.0, 5.0)[-1]
    assert nice_ticks(math.nan, 1.0) == [0.0]


def test_pareto_front_keeps_only_undominated_points() -> None:
    # (latency, throughput): lower latency and higher throughput are better
    points = [(10.0, 100.0), (12.0, 90.0), (15.0, 300.0), (20.0, 250.0), (8.0, 50.0), (30.0, 400.0)]
    assert pareto_front(points) == [(8.0, 50.0), (10.0, 100.0), (15.0, 300.0), (30.0, 400.0)]
    assert pareto_front([]) == []
    assert pareto_front([(1.0, 1.0), (1.0, 2.0)]) == [(1.0, 2.0)]


def test_xy_chart_escapes_and_places_points() -> None:
    svg = xy_chart(
        "t<1>",
        "x&",
        'y"',
        [
            Series(
                "s<",
                [Point(0.0, 0.0, "tip<"), Point(10.0, 5.0), Point(5.0, math.nan, "f", "cross")],
            )
        ],
        legend=True,
    )
    assert svg.startswith('<svg class="plot"') and svg.endswith("</svg>")
    assert "t&lt;1&gt;" in svg and "x&amp;" in svg and "y&quot;" in svg and "tip&lt;" in svg
    assert "s&lt;" in svg
    assert svg.count('class="pt"') == 3  # two values and the failed point on the axis


def test_timeline_has_one_bar_per_phase_and_memory_one_line_per_gpu() -> None:
    data = throughput_sweep()
    timeline = timeline_plot(data)
    assert timeline is not None
    assert timeline.count("<rect x=") - 1 == 3 * 6 + 4  # minus the frame
    assert "#4 load: 12 s" in timeline
    memory = memory_plot(data)
    assert memory is not None and "GPU 0" in memory and "GPU 1" in memory
    empty = sweep_data([trial(1, {}, phases={})], {})
    assert timeline_plot(empty) is None and memory_plot(empty) is None


def test_running_trial_phase_lasts_until_now() -> None:
    done = trial(1, {"b": 1})
    running = trial(2, {"b": 2}, "running", phases={"stop": 1.0, "release": 0.5, "load": 9.0})
    live = replace(running, phase_seconds={"stop": 1.0, "release": 0.5}, finished_at=None)
    data = sweep_data([done, live], {})
    load_start = live.phase_started["load"]
    timeline = timeline_plot(data, now=load_start + 4.0)
    assert timeline is not None and "#2 load: 4 s so far (running)" in timeline
    assert "#2 load" not in (timeline_plot(data) or "")
