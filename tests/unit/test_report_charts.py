"""The HTML report's chart data: what each chart is built from, checked on crafted
sweeps with known numbers (the browser tests check that it is drawn)."""

from __future__ import annotations

from dataclasses import replace

from helpers.report_data import T0, level, sweep_data, throughput_sweep, trial
from servesweep.decide.best import find_best
from servesweep.decide.refs import ResultIndex
from servesweep.records import SweepData, TelemetryPoint
from servesweep.report.charts import value_band
from servesweep.report.effects import acceptance_charts, heatmap_chart, parallel_chart
from servesweep.report.importance import MIN_TRIALS, importance_chart, param_importances
from servesweep.report.progress import progress_charts
from servesweep.report.timeline import memory_chart, reduce_extremes, timeline_chart
from servesweep.report.tradeoffs import pareto_front, per_user_per_gpu_charts, staircase


def _parts(data: SweepData):  # type: ignore[no-untyped-def]
    return data, ResultIndex(data), find_best(data)


def test_pareto_front_and_its_staircase() -> None:
    points = [(10.0, 100.0), (12.0, 90.0), (15.0, 300.0), (20.0, 250.0), (8.0, 50.0), (30.0, 400.0)]
    assert pareto_front(points) == [(8.0, 50.0), (10.0, 100.0), (15.0, 300.0), (30.0, 400.0)]
    assert pareto_front([]) == []
    assert pareto_front([(1.0, 1.0), (1.0, 2.0)]) == [(1.0, 2.0)]
    both = [(1.0, 5.0), (2.0, 4.0), (3.0, 1.0), (1.5, 2.0)]
    assert pareto_front(both, x_better="max") == [(1.0, 5.0), (2.0, 4.0), (3.0, 1.0)]
    # a front of one point is still a line: up from the lowest point, across to the last
    assert staircase([(5.0, 170.0)], [(5.0, 170.0), (9.0, 100.0)]) == [
        [5.0, 100.0], [5.0, 170.0], [9.0, 170.0],
    ]  # fmt: skip
    assert staircase([(1.0, 5.0), (3.0, 1.0)], both, x_better="max") == [
        [1.0, 5.0], [1.0, 5.0], [1.0, 1.0], [3.0, 1.0], [3.0, 1.0],
    ]  # fmt: skip


def test_heatmap_cells_carry_values_failures_and_infeasibility() -> None:
    chart = heatmap_chart(*_parts(throughput_sweep()))
    assert chart is not None
    option = chart.option
    assert option["xAxis"]["data"] == ["4", "8", "12", "16"]
    assert option["yAxis"]["data"] == ["2", "4", "6", "8"]
    feasible, infeasible, failed = (s["data"] for s in option["series"])
    assert [(c["value"], c["text"], c["trial"]) for c in feasible] == [
        ([0, 0, 100.0], "100", 1), ([1, 1, 150.0], "150", 2),
    ]  # fmt: skip
    assert [(c["value"][:2], c["text"], c["trial"]) for c in infeasible] == [
        ([2, 2], "170\ninfeasible", 3)
    ]
    assert "infeasible: chat.c1.ttft_p99_ms < 500" in infeasible[0]["lines"]
    assert [(c["value"][:2], c["text"]) for c in failed] == [([3, 3], "start_crash\n(oom)")]


def test_parallel_coordinates_and_acceptance() -> None:
    chart = parallel_chart(*_parts(throughput_sweep()))
    assert chart is not None
    axes = chart.option["parallelAxis"]
    assert [a["name"] for a in axes] == ["budget", "topk", "chat.c1.output_throughput (max)"]
    feasible, grey = (s["data"] for s in chart.option["series"])
    assert sorted(i["trial"] for i in feasible) == [1, 2] and [i["trial"] for i in grey] == [3]
    assert "1 failed trial(s) are not drawn" in chart.note
    assert acceptance_charts(*_parts(throughput_sweep())) == []
    data = sweep_data(
        [trial(1, {"budget": 4, "tp": 1}), trial(2, {"budget": 8, "tp": 2})],
        {1: [level("chat", "c1", output_throughput=1.0, acceptance_length=2.5)],
         2: [level("chat", "c1", output_throughput=2.0, acceptance_length=3.5)]},
        objective={"maximize": "chat.c1.output_throughput"},
    )  # fmt: skip
    charts = acceptance_charts(*_parts(data))
    assert [c.title for c in charts] == ["chat.c1.acceptance_length vs budget"]  # not tp
    points = [p["value"] for s in charts[0].option["series"] for p in s["data"]]
    assert sorted(points) == [[4, 2.5], [8, 3.5]]


def test_timeline_lanes_follow_node_and_slot() -> None:
    base = throughput_sweep()
    placed = [replace(t, node="box-a" if t.id % 2 else "box-b", slot=t.id % 2) for t in base.trials]
    chart = timeline_chart(replace(base, trials=tuple(placed)))
    assert chart is not None
    assert chart.option["yAxis"]["data"] == ["box-a/1", "box-b/0"]
    bars = {(i["trial"], s["name"]): i["value"] for s in chart.option["series"] for i in s["data"]}
    assert bars[(1, "load")][0] == 0 and bars[(2, "load")][0] == 1
    assert bars[(4, "load")][2] - bars[(4, "load")][1] == 12.0
    single = timeline_chart(base)
    assert single is not None and single.option["yAxis"]["data"] == ["this machine"]


def test_memory_one_strip_per_gpu_and_node_and_no_release_lost() -> None:
    points = [
        TelemetryPoint(1, T0 + i * 0.1, g, (0 if i == 5000 else 70) * 2**30, node=n)
        for i in range(10_000)
        for n in ("a", "b")
        for g in (0, 1)
    ]
    kept = reduce_extremes([p for p in points if (p.node, p.gpu) == ("a", 0)], 3000)
    assert len(kept) <= 3100 and min(p.used_bytes for p in kept) == 0  # the dip survived
    data = sweep_data([trial(1, {})], {}, telemetry=points)
    chart = memory_chart(data)
    assert chart is not None
    assert [s["name"] for s in chart.option["series"]] == [
        "a GPU 0", "a GPU 1", "b GPU 0", "b GPU 1",
    ]  # fmt: skip
    assert len({s["color"] for s in chart.option["series"]}) == 4
    assert len(chart.option["grid"]) == 4  # one strip each: no line hides another
    assert "Sampled every 0.1 s" in chart.note


def test_progress_best_so_far_by_trial_and_gpu_hours() -> None:
    charts = progress_charts(*_parts(throughput_sweep()))
    by_trial, by_hours = (c.option["series"] for c in charts)
    assert by_trial[0]["data"] == [[1, 100.0], [2, 150.0], [3, 150.0], [4, 150.0]]
    # every trial held 2 GPUs: 53 s each (the failed one 14 s)
    hours = [round(x, 6) for x, _ in by_hours[0]["data"]]
    assert hours == [round(h * 2 / 3600, 6) for h in (53.0, 106.0, 159.0, 173.0)]
    assert [p["trial"] for p in by_trial[3]["data"]] == [4]  # failed, drawn at 0


def test_importance_needs_enough_trials() -> None:
    assert importance_chart(*_parts(throughput_sweep())) is None
    trials, results = [], {}
    for n in range(12):
        a, b = n % 4, n // 4
        trials.append(trial(n + 1, {"a": a, "b": b}))
        results[n + 1] = [level("chat", "c1", output_throughput=100.0 * a + b)]
    data = sweep_data(trials, results, objective={"maximize": "chat.c1.output_throughput"})
    found = param_importances(*_parts(data))
    assert found is not None and found[1] == 12 >= MIN_TRIALS
    importances = found[0]
    assert set(importances) == {"a", "b"} and importances["a"] > importances["b"]
    chart = importance_chart(*_parts(data))
    assert chart is not None and chart.option["yAxis"]["data"] == ["b", "a"]


def test_per_user_per_gpu_uses_the_trials_gpus() -> None:
    data = throughput_sweep()
    charts = per_user_per_gpu_charts(data, ResultIndex(data))
    first = charts[0].option["series"][0]["data"]
    # trial 1 at c1: 1000 / 9 ms per user, 100 tok/s over 2 GPUs
    assert first[0]["value"] == [1000.0 / 9.0, 50.0]


def test_a_failed_trial_is_never_drawn_as_a_measurement() -> None:
    """bench_errors: the trial measured its levels, then failed on its error rate."""
    from servesweep.report.effects import metric_vs_param_charts

    data = sweep_data(
        [trial(1, {"rate": 0.0, "b": 1}), trial(2, {"rate": 0.3, "b": 1}, "failed",
                                              failure="bench_errors")],
        {1: [level("chat", "c1", output_throughput=500.0)],
         2: [level("chat", "c1", output_throughput=470.0)]},
        objective={"maximize": "chat.c1.output_throughput"},
    )  # fmt: skip
    parts = _parts(data)
    found = parts[2].objectives[0][0]
    from servesweep.spec.constraints import parse_metric_ref

    charts = metric_vs_param_charts(*parts, parse_metric_ref(found), ["rate"], id_prefix="x")
    by_series = {s["name"]: [p["value"] for p in s["data"]] for s in charts[0].option["series"]}
    assert by_series[found] == [[0.0, 500.0]]  # one series: b is not swept
    # drawn at the bottom of the axis, which spans the measured band, not from 0
    assert by_series["failed (at the bottom)"] == [[0.3, 475.0]]
    assert charts[0].option["yAxis"]["scale"] is True
    progress = progress_charts(*parts)[0].option["series"]
    assert [p["value"] for p in progress[3]["data"]] == [[2, 475.0]]


def test_trials_no_longer_in_the_sweep_file_are_not_drawn_as_infeasible() -> None:
    """An edited grid: trials 5 and 6 (budget=14) were measured, met the constraint and
    are no longer in the sweep file; no chart draws them and no importance counts them."""
    trials, results = [], {}
    for n in range(6):
        budget, topk = (4, 8, 14)[n // 2], 1 + n % 2
        trials.append(trial(n + 1, {"budget": budget, "topk": topk}, in_plan=budget != 14))
        results[n + 1] = [level("chat", "c1", output_throughput=100.0 + 10 * n, ttft_p99_ms=50.0)]
    data = sweep_data(
        trials,
        results,
        objective={"maximize": "chat.c1.output_throughput"},
        constraints=["chat.c1.ttft_p99_ms < 500"],
    )
    heat = heatmap_chart(*_parts(data))
    assert heat is not None
    assert heat.option["xAxis"]["data"] == ["4", "8"], "no column for the removed budget"
    feasible, infeasible, failed = (s["data"] for s in heat.option["series"])
    assert sorted(c["trial"] for c in feasible) == [1, 2, 3, 4]
    assert infeasible == [] and failed == []
    parallel = parallel_chart(*_parts(data))
    assert parallel is not None
    drawn, grey = (s["data"] for s in parallel.option["series"])
    assert sorted(i["trial"] for i in drawn) == [1, 2, 3, 4] and grey == []
    for chart in progress_charts(*_parts(data)):
        points = [p["trial"] for s in chart.option["series"][1:] for p in s["data"]]
        assert sorted(points) == [1, 2, 3, 4], chart.id
    many, measured = [], {}
    for n in range(12):
        many.append(trial(n + 1, {"a": n % 4, "b": n // 4}, in_plan=n < 10))
        measured[n + 1] = [level("chat", "c1", output_throughput=100.0 * (n % 4) + n // 4)]
    found = param_importances(
        *_parts(sweep_data(many, measured, objective={"maximize": "chat.c1.output_throughput"}))
    )
    assert found is not None and found[1] == 10, "the 2 removed trials are not counted"


def test_value_axes_span_the_measured_band_and_memory_lines_break_between_runs() -> None:
    assert value_band([812.0, 994.2, 985.6]) == (797.0, 1010.0)
    assert value_band([3.0, 5.0]) == (2.84, 5.16)
    assert value_band([0.5, 40.0]) == (0.0, 43.2)  # near zero: from zero, never below
    assert value_band([]) is None
    # two runs of the sweep, 10 minutes apart, sampled every 0.1 s
    points = [TelemetryPoint(1, T0 + i * 0.1, 0, 70 * 2**30) for i in range(50)]
    points += [TelemetryPoint(2, T0 + 600 + i * 0.1, 0, 10 * 2**30) for i in range(50)]
    chart = memory_chart(sweep_data([trial(1, {}), trial(2, {})], {}, telemetry=points))
    assert chart is not None
    data = chart.option["series"][0]["data"]
    gaps = [d for d in data if d["value"][1] is None]
    assert len(gaps) == 1 and 4.9 < gaps[0]["value"][0] < 600
    assert chart.option["series"][0]["connectNulls"] is False
