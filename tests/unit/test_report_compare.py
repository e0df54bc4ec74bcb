"""compare: two sweeps or two configurations, changes judged against repeat noise."""

from __future__ import annotations

import pytest

from helpers.report_data import eval_level, level, sweep_data, trial
from servesweep.errors import ConfigError
from servesweep.records import SweepData
from servesweep.report import compare, format_comparison


def _sweep(
    sweep_id: int, values: dict[int, tuple[float, ...]], extra: int | None = None
) -> SweepData:
    trials = [trial(tid, {"budget": tid * 4}) for tid in values]
    if extra is not None:
        trials.append(trial(extra, {"budget": 999}))
    results = {
        tid: [
            level("chat", "c1", r, output_throughput=v, ttft_p99_ms=100.0 + r)
            for r, v in enumerate(vals)
        ]
        for tid, vals in values.items()
    }
    return sweep_data(trials, results, name=f"s{sweep_id}", sweep_id=sweep_id)


def test_sweeps_matched_by_fingerprint_with_noise() -> None:
    a = _sweep(1, {1: (100.0, 104.0, 102.0), 2: (200.0, 201.0, 199.0)}, extra=3)
    b = _sweep(2, {1: (103.0, 101.0, 105.0), 2: (150.0, 151.0, 149.0)})
    result = compare(a, b)
    assert [(p.a.id, p.b.id) for p in result.pairs] == [(1, 1), (2, 2)]
    assert [t.id for t in result.only_a] == [3] and result.only_b == ()
    small = next(c for c in result.pairs[0].changes if c.metric == "output_throughput")
    assert small.delta == pytest.approx(1.0)
    assert small.noise == pytest.approx(4.0)
    assert small.significant is False
    big = next(c for c in result.pairs[1].changes if c.metric == "output_throughput")
    assert big.delta == pytest.approx(-50.0) and big.relative == pytest.approx(-0.25)
    assert big.significant is True
    text = format_comparison(result)
    assert "A = s1 (#1), B = s2 (#2)" in text
    # the objective leads every pair, whatever its change; the other metrics only
    # beyond the noise, marked by the metric's direction
    lines = text.splitlines()
    small_line = next(ln for ln in lines if "within noise 4" in ln)
    assert small_line.startswith("  objective (max chat.c1.output_throughput): A 102")
    assert "ttft_p99_ms" not in text
    line = next(ln for ln in text.splitlines() if "exceeds noise 2" in ln)
    assert "chat.c1.output_throughput" in line and "-25.0%" in line and " worse, " in line
    assert line.startswith("  objective (max chat.c1.output_throughput): ")
    assert "only in A: #3 budget=999 (ok)" in text
    assert "2 metric change(s) within the noise" in text  # both ttft (the objective leads)
    everything = format_comparison(result, show_all=True)
    assert "chat.c1.ttft_p99_ms" in everything and "not shown" not in everything


def test_without_repeats_noise_is_unknown() -> None:
    a = _sweep(1, {1: (100.0,)})
    b = _sweep(2, {1: (150.0,)})
    result = compare(a, b)
    change = result.pairs[0].changes[0]
    assert change.noise is None and change.significant is None
    assert not result.noise_known
    text = format_comparison(result)
    assert "noise unknown: no repeats" in text and "changes above 5% are shown" in text
    line = next(ln for ln in text.splitlines() if "output_throughput" in ln)
    assert "+50" in line and line.endswith("better (noise unknown)")
    assert "ttft_p99_ms" not in text  # unchanged: 100 on both sides


def test_two_configurations_of_one_sweep_and_flipped_tasks() -> None:
    data = sweep_data(
        [trial(1, {"b": 1}), trial(2, {"b": 2})],
        {
            1: [
                level("chat", "c1", output_throughput=10.0),
                eval_level("code", {"t1": "pass", "t2": "pass"}),
            ],
            2: [
                level("chat", "c1", output_throughput=12.0),
                eval_level("code", {"t1": "pass", "t2": "timeout"}),
            ],
        },
    )
    result = compare(data, data, trial_a=1, trial_b=2)
    assert len(result.pairs) == 1
    pair = result.pairs[0]
    assert {c.metric for c in pair.changes} >= {"output_throughput", "pass_rate"}
    assert [(f.task_id, f.statuses) for f in pair.flips] == [("t2", ((1, "pass"), (2, "timeout")))]
    assert "flipped code/t2: #1 pass, #2 timeout" in format_comparison(result)


def test_bad_trial_ids() -> None:
    data = _sweep(1, {1: (1.0,)})
    with pytest.raises(ConfigError, match="no trial 9"):
        compare(data, data, trial_a=1, trial_b=9)
    with pytest.raises(ConfigError, match="both trials"):
        compare(data, data, trial_a=1)


def test_outcome_change_is_shown() -> None:
    a = sweep_data([trial(1, {"b": 1})], {1: [level("chat", "c1", output_throughput=1.0)]})
    b = sweep_data([trial(1, {"b": 1}, "failed", failure="ready_timeout")], {1: []}, sweep_id=2)
    text = format_comparison(compare(a, b))
    assert "outcome: ok -> failed" in text
    assert "no metric measured on both sides" in text


def test_direction_and_chosen_metrics() -> None:
    a = sweep_data(
        [trial(1, {"b": 1})],
        {1: [level("chat", "c1", r, output_throughput=100.0 + r, ttft_p99_ms=100.0 + r,
                   completion_tokens_mean=48.0) for r in range(2)]},
    )  # fmt: skip
    b = sweep_data(
        [trial(1, {"b": 1})],
        {1: [level("chat", "c1", r, output_throughput=90.0 + r, ttft_p99_ms=80.0 + r,
                   completion_tokens_mean=60.0) for r in range(2)]},
        sweep_id=2,
    )  # fmt: skip
    result = compare(a, b)
    changes = {c.metric: c for c in result.pairs[0].changes}
    assert changes["output_throughput"].direction == "worse"  # higher is better, it fell
    assert changes["ttft_p99_ms"].direction == "better"  # lower is better, it fell
    assert changes["completion_tokens_mean"].direction == "changed"  # no better way
    chosen = format_comparison(result, metrics=["ttft_p99_ms"])
    # the objective leads whatever is chosen; of the rest, only what was chosen
    assert "ttft_p99_ms" in chosen and "completion_tokens_mean" not in chosen
    assert "1 metric change(s) not chosen not shown" in chosen
    full = format_comparison(result, metrics=["chat.c1.output_throughput"])
    assert "output_throughput" in full and "ttft_p99_ms" not in full
    with pytest.raises(ConfigError, match="no metric 'bogus'"):
        format_comparison(result, metrics=["bogus"])


def test_the_objective_and_constraints_lead_and_the_clients_health_stands_apart() -> None:
    """A small change of the objective (under 5 %, no repeats) is still shown first,
    with the constraint; the load generator's lag is listed apart, without a verdict."""
    results = {
        1: [level("chat", "c1", output_throughput=994.2, ttft_p99_ms=30.0, loop_lag_p99_ms=2.0,
                  schedule_lag_p99_ms=1.0)],
        4: [level("chat", "c1", output_throughput=985.6, ttft_p99_ms=31.0, loop_lag_p99_ms=9.0,
                  schedule_lag_p99_ms=4.0)],
    }  # fmt: skip
    data = sweep_data(
        [trial(1, {"budget": 4}), trial(4, {"budget": 8})],
        results,
        objective={"maximize": "chat.c1.output_throughput"},
        constraints=["chat.c1.ttft_p99_ms < 500"],
    )
    lines = format_comparison(compare(data, data, trial_a=1, trial_b=4)).splitlines()
    assert lines[2] == "A #1 budget=4 <-> B #4 budget=8"
    assert lines[3] == (
        "  objective (max chat.c1.output_throughput): A 994.2, B 985.6  -8.6 (-0.9%)  "
        "worse (noise unknown)"
    )
    assert lines[4] == "  chat.c1.ttft_p99_ms < 500: A 30 (met), B 31 (met)"
    health = next(ln for ln in lines if "load generator health" in ln)
    assert "chat.c1.loop_lag_p99_ms 2 -> 9" in health and "better" not in health
    assert "worse" not in health
    assert not any("loop_lag" in ln for ln in lines if ln is not health)
