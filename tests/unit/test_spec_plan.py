"""The plan: trials in order, what each changes, workloads and levels, the estimate."""

from __future__ import annotations

import dataclasses

import pytest

from servesweep.spec import (
    Plan,
    build_plan,
    estimate_duration,
    format_duration,
    format_plan,
    load_sweep_text,
)

SWEEP = """\
name: ddtree-budget
server: {engine: sim}
params:
  grid: {budget: [8, 12], topk: [4, 6]}
  exclude: [{budget: 8, topk: 6}]
  points: [{budget: 16}]
workloads:
  - {name: chat, concurrency: [1, 8], requests: 64, max_tokens: 256}
  - {name: open, rate: [2.5, 10], duration: 90s, arrival: constant, repeats: 2}
  - {name: coding, eval: {suite: builtin:coding, limit: 5}}
"""


def plan_of(text: str = SWEEP) -> Plan:
    return build_plan(load_sweep_text(text).spec)


def test_trials_in_expansion_order_with_changes() -> None:
    plan = plan_of()
    assert [t.seq for t in plan.trials] == [1, 2, 3, 4]
    assert [dict(t.params) for t in plan.trials] == [
        {"budget": 8, "topk": 4},
        {"budget": 12, "topk": 4},
        {"budget": 12, "topk": 6},
        {"budget": 16},
    ]
    assert [t.changes for t in plan.trials] == [
        ("budget", "topk"),
        ("budget",),
        ("topk",),
        ("budget", "topk"),
    ]
    assert plan.restarts == 4
    assert plan.params == ("budget", "topk")
    assert plan.trials[0].fingerprint == plan.trials[0].config.fingerprint


def test_workloads_and_levels() -> None:
    plan = plan_of()
    assert [(w.name, w.levels) for w in plan.workloads] == [
        ("chat", ("c1", "c8")),
        ("open", ("r2.5", "r10")),
        ("coding", ()),
    ]
    assert plan.workloads[2].is_eval
    assert plan.measurements == 4 * (2 + 2 * 2 + 1)


def test_plan_is_frozen() -> None:
    plan = plan_of()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.restarts = 1  # type: ignore[misc]


def test_format_plan_shows_trials_changes_workloads_restarts_and_estimate() -> None:
    plan = plan_of()
    text = format_plan(plan, estimate_s=3725.0, history_note="from 4 trials measured earlier")
    assert "sweep ddtree-budget: 4 trials x 3 workloads = 28 measurements" in text
    lines = text.splitlines()
    trial_2 = next(line for line in lines if line.strip().startswith("2 "))
    assert plan.trials[1].fingerprint in trial_2
    assert "budget=12 topk=4" in trial_2
    assert "budget 8 -> 12" in trial_2
    trial_4 = next(line for line in lines if line.strip().startswith("4 "))
    assert "topk 6 -> (unset)" in trial_4
    assert "first start" in next(line for line in lines if line.strip().startswith("1 "))
    assert "c1, c8" in text
    assert "r2.5, r10" in text
    assert "eval builtin:coding" in text
    assert "server starts: 4" in text
    assert "estimated duration: 1h 02m (from 4 trials measured earlier)" in text


def test_format_plan_without_history() -> None:
    text = format_plan(plan_of())
    assert "estimated duration: unknown (no earlier sweep of this file)" in text


def test_format_plan_of_defaults_only() -> None:
    plan = plan_of("name: x\nserver: {engine: sim}\nworkloads: [{name: chat}]\n")
    text = format_plan(plan)
    assert "params swept: none (server defaults)" in text
    assert "(defaults)" in text
    assert "sweep x: 1 trial x 1 workload = 1 measurements" in text


def test_estimate_adds_phase_means_per_trial() -> None:
    plan = plan_of()
    history = {"stop": 2.0, "release": 1.0, "start": 0.5, "load": 100.0, "ready": 1.5, "bench": 45}
    assert estimate_duration(plan, history) == pytest.approx(4 * 150.0)


def test_estimate_ignores_unknown_phases_and_negative_means() -> None:
    plan = plan_of()
    assert estimate_duration(plan, {"load": 10.0, "done": 99.0, "stop": -3.0}) == 40.0


def test_no_history_no_estimate() -> None:
    assert estimate_duration(plan_of(), {}) is None
    assert estimate_duration(plan_of(), {"done": 1.0}) is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (42.4, "42s"), (59.6, "1m 0s"), (725, "12m 5s"), (3725, "1h 02m")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
