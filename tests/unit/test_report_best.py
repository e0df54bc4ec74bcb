"""find_best: the right configuration under objectives and constraints, with reasons."""

from __future__ import annotations

import json

import pytest

from helpers.report_data import level, sweep_data, throughput_sweep, trial
from servesweep.errors import ConfigError
from servesweep.report.best import best_to_json, find_best, format_best


def test_sweep_objective_and_constraint_by_default() -> None:
    data = throughput_sweep()
    best = find_best(data)
    # #3 is faster at c1 but violates ttft_p99 < 500; #4 failed.
    assert best.feasible
    assert best.trial is not None and best.trial.id == 2
    assert best.value == 150.0
    assert best.objectives == (("chat.c1.output_throughput", "max"),)
    reasons = {e.trial.id: e for e in best.excluded}
    assert reasons[3].kind == "constraint"
    assert reasons[3].value == 650.0
    assert "chat.c1.ttft_p99_ms < 500 violated" in reasons[3].reason
    assert reasons[4].kind == "failed"
    assert "start_crash" in reasons[4].reason and "oom" in reasons[4].reason
    assert [c.trial.id for c in best.ranking] == [2, 1]


def test_explicit_constraints_replace_the_sweeps() -> None:
    data = throughput_sweep()
    assert find_best(data, constraints=["chat.c8.ttft_p99_ms <= 1000"]).trial.id == 3  # type: ignore[union-attr]
    best = find_best(data, constraints=["chat.c8.ttft_p99_ms < 400"])
    assert best.trial is not None and best.trial.id == 1
    both = find_best(data, constraints=["chat.c1.ttft_p99_ms < 500", "coding.pass_rate >= 1"])
    assert both.trial is not None and both.trial.id == 2
    assert {e.trial.id: e.kind for e in both.excluded} == {
        1: "constraint",
        3: "constraint",
        4: "failed",
    }


def test_minimize_and_trial_metrics() -> None:
    data = throughput_sweep()
    best = find_best(data, "chat.c8.tpot_median_ms", "min", constraints=["coding.pass_rate >= 0.6"])
    assert best.trial is not None and best.trial.id == 2
    assert best.value == 9.0
    fastest_load = find_best(data, "load_s", "min", constraints=["chat.c1.ttft_p99_ms < 10000"])
    assert fastest_load.trial is not None and fastest_load.trial.id == 1  # all 20 s: tie


def test_none_feasible_gives_reasons() -> None:
    data = throughput_sweep()
    best = find_best(data, constraints=["chat.c1.ttft_p99_ms < 50"])
    assert not best.feasible and best.trial is None and best.value is None
    assert len(best.excluded) == 4
    text = format_best(best)
    assert text.startswith("no feasible configuration")
    assert "chat.c1.ttft_p99_ms < 50 violated: chat.c1.ttft_p99_ms = 120" in text
    assert "start_crash" in text
    assert "try:" in text
    payload = best_to_json(best)
    assert payload["feasible"] is False and payload["best"] is None
    json.dumps(payload)


def test_unknown_metric_is_missing_and_explained() -> None:
    data = throughput_sweep()
    best = find_best(data, "chat.c64.output_throughput")
    assert not best.feasible
    assert {e.kind for e in best.excluded} == {"missing_metric", "failed"}
    assert any("has no level c64 (levels: c1, c8)" in n for n in best.notes)
    wrong = find_best(data, "chatt.c1.output_throughput")
    assert any("no workload 'chatt'" in n for n in wrong.notes)


def test_ties_are_said_and_broken_by_run_order() -> None:
    trials = [trial(7, {"b": 1}, seq=2), trial(5, {"b": 2}, seq=1), trial(6, {"b": 3}, seq=3)]
    results = {
        7: [level("chat", "c1", output_throughput=200.0)],
        5: [level("chat", "c1", output_throughput=200.0 * (1 + 1e-9))],
        6: [level("chat", "c1", output_throughput=150.0)],
    }
    best = find_best(sweep_data(trials, results), "chat.c1.output_throughput")
    assert best.trial is not None and best.trial.id == 5  # first in run order (seq 1)
    assert [c.trial.id for c in best.ties] == [7]
    assert any(n.startswith("tie: #5 and #7") for n in best.notes)
    assert "note: tie" in format_best(best)


def test_secondary_objective_breaks_ties_and_pareto_set() -> None:
    trials = [trial(i, {"b": i}) for i in (1, 2, 3, 4)]
    results = {
        1: [level("chat", "c1", output_throughput=200.0, ttft_p99_ms=300.0)],
        2: [level("chat", "c1", output_throughput=200.0, ttft_p99_ms=250.0)],
        3: [level("chat", "c1", output_throughput=150.0, ttft_p99_ms=100.0)],
        4: [level("chat", "c1", output_throughput=140.0, ttft_p99_ms=120.0)],
    }
    best = find_best(
        sweep_data(trials, results),
        objectives=[("chat.c1.output_throughput", "max"), ("chat.c1.ttft_p99_ms", "min")],
    )
    assert best.trial is not None and best.trial.id == 2
    assert not best.ties
    assert sorted(c.trial.id for c in best.pareto) == [2, 3]
    assert "Pareto set" in format_best(best)
    assert [p["trial"] for p in best_to_json(best)["pareto"]] == [2, 3]


def test_repeats_use_the_mean_and_flag_noise() -> None:
    trials = [trial(1, {"b": 1}), trial(2, {"b": 2})]
    results = {
        1: [
            level("chat", "c1", r, output_throughput=v) for r, v in enumerate((100.0, 110.0, 90.0))
        ],
        2: [
            level("chat", "c1", r, output_throughput=v) for r, v in enumerate((104.0, 99.0, 103.0))
        ],
    }
    best = find_best(sweep_data(trials, results), "chat.c1.output_throughput")
    assert best.trial is not None and best.trial.id == 2
    assert best.value == pytest.approx(102.0)
    assert any("within run-to-run noise" in n for n in best.notes)
    assert "repeats 3: 99..104" in format_best(best)


def test_skipped_and_unplanned_trials_are_excluded() -> None:
    trials = [trial(1, {"b": 1}, "skipped"), trial(2, {"b": 2}, in_plan=False), trial(3, {"b": 3})]
    results = {
        2: [level("chat", "c1", output_throughput=999.0)],
        3: [level("chat", "c1", output_throughput=10.0)],
    }
    best = find_best(sweep_data(trials, results), "chat.c1.output_throughput")
    assert best.trial is not None and best.trial.id == 3
    assert {e.trial.id: e.kind for e in best.excluded} == {1: "not_measured", 2: "not_in_plan"}


def test_bad_input_is_a_config_error() -> None:
    data = throughput_sweep()
    with pytest.raises(ConfigError, match="not a constraint"):
        find_best(data, constraints=["chat.c1.ttft_p99_ms <"])
    with pytest.raises(ConfigError, match="direction"):
        find_best(data, "chat.c1.output_throughput", "up")
    empty = sweep_data([], {})
    with pytest.raises(ConfigError, match="no objective"):
        find_best(empty)


def test_objective_dict_with_parts() -> None:
    data = throughput_sweep()
    split = sweep_data(
        data.trials,
        {k: tuple(v) for k, v in data.results.items()},
        objective={"minimize": "ttft_p99_ms", "workload": "chat", "concurrency": 8},
    )
    best = find_best(split)
    assert best.objectives == (("chat.c8.ttft_p99_ms", "min"),)
    assert best.trial is not None and best.trial.id == 1
    default = find_best(sweep_data(data.trials, data.results))
    assert default.objectives == (("chat.c1.output_throughput", "max"),)


def test_a_configuration_without_swept_params_is_labelled_by_what_it_sets() -> None:
    # #1 sets only what every trial sets: not "(defaults)", which it is not
    same = {"max-num-seqs": 16, "max-model-len": 2048}
    data = sweep_data(
        [
            trial(1, same),
            trial(2, {**same, "speculative_config": "x"}),
            trial(3, {**same, "speculative_config": "y"}),
        ],
        {
            1: [level("chat", "c1", output_throughput=100.0)],
            2: [level("chat", "c1", output_throughput=90.0)],
            3: [level("chat", "c1", output_throughput=80.0)],
        },
        objective={"maximize": "chat.c1.output_throughput"},
    )
    best = find_best(data)
    assert best.winner is not None
    assert best.winner.label == "#1 (fixed: max-num-seqs=16 max-model-len=2048)"
    assert [c.label for c in best.ranking][1:] == [
        "#2 speculative_config=x",
        "#3 speculative_config=y",
    ]


def test_a_configuration_that_sets_nothing_is_the_defaults() -> None:
    data = sweep_data(
        [trial(1, {}), trial(2, {"max-num-seqs": 1})],
        {
            1: [level("chat", "c1", output_throughput=100.0)],
            2: [level("chat", "c1", output_throughput=90.0)],
        },
        objective={"maximize": "chat.c1.output_throughput"},
    )
    assert [c.label for c in find_best(data).ranking] == ["#1 (defaults)", "#2 max-num-seqs=1"]
