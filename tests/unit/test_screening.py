"""Screening: the short workloads a sweep screens with, the pure decision (can a
configuration measured on short levels still win?) and the saving from the records."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from helpers.report_data import level, sweep_data, trial
from servesweep.decide.best import find_best
from servesweep.decide.screened import screening_note, summarise_screening
from servesweep.decide.screening import Figure, Reference, ScreenPolicy, screen_reason
from servesweep.errors import ConfigError
from servesweep.models import Evidence, LevelResult
from servesweep.records import SweepData
from servesweep.report.best_view import best_to_json
from servesweep.spec.constraints import parse_constraint, parse_metric_ref
from servesweep.spec.load import load_sweep_text
from servesweep.spec.schema import SweepSpec
from servesweep.spec.screening import ScreeningPlan, screening_plan

BASE = """
name: s
server: {engine: sim}
params: {grid: {a: [1, 2]}}
workloads:
  - {name: chat, concurrency: [1, 8], requests: 40, repeats: 2}
  - {name: long, concurrency: [4], duration: 60s}
  - {name: code, eval: {suite: builtin:coding}}
"""


def _spec(extra: str) -> SweepSpec:
    return load_sweep_text(BASE + extra, "s.yaml").spec


def _plan(extra: str) -> ScreeningPlan:
    plan = screening_plan(_spec(extra))
    assert plan is not None
    return plan


def test_screening_is_off_unless_asked_and_takes_a_count_or_a_fraction() -> None:
    assert screening_plan(_spec("")) is None
    plan = screening_plan(
        _spec("objective: {maximize: chat.c8.output_throughput}\nscreening: true\n")
    )
    assert plan is not None
    (chat,) = plan.workloads
    # only the named level, one repeat, 25 % of its requests by default
    assert (chat.name, chat.concurrency, chat.repeats, chat.requests) == ("chat", [8], 1, 10)
    count = screening_plan(_spec("screening: {requests: 8}\n"))
    assert count is not None and count.workloads[0].requests == 8
    assert count.workloads[0].concurrency == [1]  # the default objective: chat's first level
    big = screening_plan(_spec("screening: {requests: 500}\n"))
    assert big is not None and big.workloads[0].requests == 40  # never more than its own
    pct = screening_plan(_spec("screening: {requests: 10%, threshold: 3%}\n"))
    assert pct is not None and pct.workloads[0].requests == 4 and pct.threshold == 0.03
    # 5 % by default, whatever the decision's threshold: a screening level's interval
    # holds one launch's noise, not the launch-to-launch variation
    assert _plan("screening: {}\ndecision: {threshold: 2%}\n").threshold == 0.05


def test_a_duration_workload_is_screened_for_a_fraction_of_its_duration() -> None:
    spec = _spec(
        "objective: {maximize: long.c4.output_throughput}\n"
        "constraints: ['chat.c1.ttft_p99_ms < 500']\nscreening: {requests: 0.5}\n"
    )
    plan = screening_plan(spec)
    assert plan is not None
    by_name = {w.name: w for w in plan.workloads}
    assert by_name["long"].duration == 30.0 and by_name["long"].requests is None
    assert by_name["chat"].concurrency == [1] and by_name["chat"].requests == 20


def test_screening_needs_an_objective_on_a_load_level() -> None:
    with pytest.raises(ConfigError, match="screening") as err:
        _spec("objective: {maximize: code.pass_rate}\nscreening: true\n")
    assert "drop 'screening'" in str(err.value)
    for bad in ("0", "1.5", "150%", "true"):
        with pytest.raises(ConfigError, match="screening"):
            _spec(f"screening: {{requests: {bad}}}\n")


def _screen(value: float, half: float, **info: object) -> LevelResult:
    return dataclasses.replace(
        level("chat", "c8", output_throughput=value, ttft_p99_ms=300.0, completed=8, failed=0),
        intervals={"output_throughput": (value - half, value + half)},
        confidence=0.95,
        screening=True,
    )


THROUGHPUT = parse_metric_ref("chat.c8.output_throughput")


def _policy(*refs: tuple[float, float], threshold: float = 0.01, **kw: object) -> ScreenPolicy:
    references = tuple(
        Reference(i + 1, i + 1, (Figure(mean, mean - half, mean + half),))
        for i, (mean, half) in enumerate(refs)
    )
    return ScreenPolicy(((THROUGHPUT, "max"),), references=references, threshold=threshold, **kw)


def test_screened_out_only_beyond_both_intervals_and_the_threshold() -> None:
    policy = _policy((1000.0, 20.0))  # the reference's lower bound: 980
    why = screen_reason(policy, [_screen(900.0, 30.0)])  # upper bound 930
    assert why is not None and "cannot reach #1's 1000 (980..1020)" in why
    # overlapping intervals: kept, however low the mean
    assert screen_reason(policy, [_screen(900.0, 85.0)]) is None
    # apart, but by less than the threshold of the reference's bound (980 - 975 < 1 %)
    assert screen_reason(policy, [_screen(965.0, 10.0)]) is None
    assert screen_reason(_policy((1000.0, 20.0), threshold=0.0), [_screen(965.0, 10.0)])
    # no reference yet (the first configuration): kept
    assert screen_reason(_policy(), [_screen(10.0, 1.0)]) is None
    # any reference that beats it decisively will do, not only the leader
    assert screen_reason(_policy((800.0, 5.0), (1000.0, 20.0)), [_screen(900.0, 30.0)])


def test_minimised_objectives_and_several_objectives() -> None:
    ttft = parse_metric_ref("chat.c8.ttft_p99_ms")
    lat = ScreenPolicy(((ttft, "min"),), references=(Reference(1, 1, (Figure(200.0),)),))
    assert screen_reason(lat, [_screen(900.0, 30.0)]) is not None  # 300 ms against 200 ms
    both = ScreenPolicy(
        ((THROUGHPUT, "max"), (ttft, "min")),
        references=(Reference(1, 1, (Figure(1000.0, 990.0, 1010.0), Figure(400.0))),),
    )
    # slower, but better on latency: on the Pareto front, kept
    assert screen_reason(both, [_screen(900.0, 10.0)]) is None
    beaten = dataclasses.replace(both, references=(
        Reference(1, 1, (Figure(1000.0, 990.0, 1010.0), Figure(200.0))),))  # fmt: skip
    why = screen_reason(beaten, [_screen(900.0, 10.0)])
    assert why is not None and "every objective" in why


def test_constraints_screen_out_only_when_certainly_violated() -> None:
    con = parse_constraint("chat.c8.output_throughput >= 950")
    policy = dataclasses.replace(_policy(), constraints=(con,))
    why = screen_reason(policy, [_screen(900.0, 30.0)])
    assert why is not None and "constraint chat.c8.output_throughput >= 950 is violated" in why
    assert screen_reason(policy, [_screen(930.0, 30.0)]) is None  # uncertain: kept
    load = dataclasses.replace(_policy(), constraints=(parse_constraint("load_s < 60"),))
    assert screen_reason(load, [_screen(900.0, 30.0)], {"load": 75.0}) is not None
    assert screen_reason(load, [_screen(900.0, 30.0)], {"load": 45.0}) is None
    # a figure screening did not measure decides nothing
    pass_rate = dataclasses.replace(
        _policy(), constraints=(parse_constraint("code.pass_rate > 0.9"),)
    )
    assert screen_reason(pass_rate, [_screen(900.0, 30.0)]) is None


def test_an_unreliable_screening_level_decides_nothing() -> None:
    shaky = dataclasses.replace(_screen(900.0, 30.0), unreliable="loop lag")
    assert screen_reason(_policy((1000.0, 20.0)), [shaky]) is None
    assert screen_reason(_policy((1000.0, 20.0), include_unreliable=True), [shaky]) is not None


def _screened_sweep() -> SweepData:
    """Three configurations: #1 and #2 measured in full after screening, #3 screened out."""
    out = Evidence(message="chat.c8.output_throughput = 500 cannot reach #1's", reason="screened")
    trials = [
        trial(1, {"a": 1}, gpus=(0,)),
        trial(2, {"a": 2}, gpus=(0,)),
        trial(3, {"a": 3}, "pruned", evidence=out, gpus=(0,)),
    ]
    full = {
        1: [level("chat", "c8", output_throughput=1000.0, completed=40, failed=0)],
        2: [level("chat", "c8", output_throughput=950.0, completed=38, failed=2)],
        3: [],
    }
    data = sweep_data(trials, full, objective={"maximize": "chat.c8.output_throughput"})
    screening = {
        t: (dataclasses.replace(_screen(v, 5.0), duration_s=2.5),)
        for t, v in ((1, 990.0), (2, 940.0), (3, 500.0))
    }
    events = (
        {"trial": 1, "kept": True, "reason": "", "attempt": 1},
        {"trial": 2, "kept": True, "reason": "", "attempt": 1},
        {"trial": 3, "kept": False, "reason": "cannot reach #1", "attempt": 1},
        {"trial": 2, "kept": False, "reason": "stale", "attempt": 0},  # of an earlier attempt
    )
    return dataclasses.replace(data, screening=screening, screened=events)


def test_the_saving_is_measured_from_the_sweeps_records() -> None:
    data = _screened_sweep()
    summary = summarise_screening(data)
    assert summary is not None
    assert (summary.screened, summary.out, summary.kept) == ((1, 2, 3), (3,), (1, 2))
    # each full measurement: 40 requests in 10 s on one GPU; screening: 3 x 8 in 2.5 s
    assert summary.full_requests == 40.0 and summary.full_gpu_s == 10.0
    assert summary.screening_requests == 24 and summary.screening_gpu_s == 7.5
    assert summary.requests_saved == 16.0 and summary.gpu_s_saved == 2.5
    note = screening_note(summary)
    assert note.startswith("screening: 3 configurations on short levels, 1 screened out (#3)")
    assert "not spent: 16 requests, 2.5 GPU-s of measurement" in note
    assert "8% of measuring all 3 in full" in note


def test_best_excludes_the_screened_out_and_says_what_screening_saved() -> None:
    data = _screened_sweep()
    best = find_best(data)
    assert best.trial is not None and best.trial.id == 1
    # screening levels never count as a measurement: #1's full 1000, not its screening 990
    assert best.value == 1000.0
    gone = {e.trial.id: e for e in best.excluded}
    assert gone[3].kind == "screened" and gone[3].reason.startswith("screened out: ")
    assert any(n.startswith("screening: 3 configurations") for n in best.notes)
    doc = best_to_json(best)
    assert doc["screening"]["screened_out"] == [3] and doc["screening"]["gpu_seconds_saved"] == 2.5
    assert find_best(dataclasses.replace(data, screened=())).screening is None


def test_a_slower_configuration_screened_out_saved_more_than_the_kept_ones_cost() -> None:
    data = _screened_sweep()
    slow = dataclasses.replace(data.screening[3][0], duration_s=10.0)  # 4x the kept ones' 2.5 s
    summary = summarise_screening(
        dataclasses.replace(data, screening={**data.screening, 3: (slow,)})
    )
    assert summary is not None
    # its full measurement would have taken 4x the kept ones' 10 GPU-s
    assert summary.out_gpu_s == 40.0 and summary.screening_gpu_s == 15.0
    assert summary.gpu_s_saved == 25.0 and summary.unscreened_gpu_s == 60.0
    # a pass whose screening cost more than it saved says so
    costly = dataclasses.replace(summary, screening_gpu_s=50.0)
    assert "cost more than it saved: 16 requests, -10 GPU-s" in screening_note(costly)


def test_the_launch_warms_up_once_with_the_screening_levels_first() -> None:
    from servesweep.sweep.slots.measure import launch_workloads, screening_workloads

    spec = _spec("objective: {maximize: chat.c8.output_throughput}\nscreening: true\n")
    (short,) = screening_workloads(spec)
    # the launch's warm-up goes with the first screening level ...
    assert (short.name, short.warmup, short.requests) == ("chat", "launch", 10)
    # ... and the full measurement after it in the same launch has none of its own
    full = launch_workloads(spec, 0, warmed=True)
    assert [w.warmup for w in full if w.name == "chat"] == ["auto"]
    assert [w.warmup for w in launch_workloads(spec, 0) if w.name == "chat"] == ["launch"]
    assert screening_workloads(_spec("")) == []


def test_the_snapshot_lets_ctrl_c_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C raises Interrupted wherever the run is: while the driver ranks the
    references it must stop the run, never leave the snapshot without references."""
    import servesweep.sweep.core.screen_run as screen_run
    from servesweep.errors import Interrupted
    from servesweep.spec.screening import screening_plan as plan_of
    from servesweep.store import open_store

    spec = _spec("screening: true\n")
    plan = plan_of(spec)
    assert plan is not None
    with open_store(tmp_path / "s.db") as store:
        sweep = store.create_sweep("s", "s.yaml", "", "hash", "0.1.0")
        assert screen_run.screen_policy(store, sweep.id, spec, plan).references == ()

        def interrupted(*args: object, **kwargs: object) -> None:
            raise Interrupted("received SIGINT")

        monkeypatch.setattr(screen_run, "find_best", interrupted)
        with pytest.raises(Interrupted):
            screen_run.screen_policy(store, sweep.id, spec, plan)
