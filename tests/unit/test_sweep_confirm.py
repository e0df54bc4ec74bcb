"""The confirm phase's decisions (successive elimination under a budget), its place in
the sweep file, and what ``best`` says about it."""

from __future__ import annotations

import dataclasses

import pytest

from helpers.report_data import T0, sweep_data, trial
from servesweep.errors import ConfigError
from servesweep.models import LevelResult
from servesweep.report.best import best_to_json, find_best, format_best
from servesweep.spec.load import load_sweep_text
from servesweep.spec.schema import ConfirmSpec
from servesweep.sweep.confirm import Done, Relaunch, Round, decide, spent_launches

SPEC = ConfirmSpec(top=3, launches=2)  # budget: 2 x 3 x 2 = 12 extra launches


def test_the_first_round_relaunches_the_top_of_the_tie_set() -> None:
    step = decide(SPEC, [5, 7, 2, 9], {5: 1, 7: 1, 2: 1, 9: 1}, [], base=1)
    assert isinstance(step, Relaunch) and step.new
    assert step.round == 1
    assert step.more == {5: 2, 7: 2, 2: 2}  # at most top, in ranking order
    assert step.targets == {5: 3, 7: 3, 2: 3}


def test_no_tie_nothing_to_confirm() -> None:
    assert decide(SPEC, [5], {5: 1, 7: 1}, [], base=1) == Done("no_tie")


def test_a_candidate_once_beaten_is_not_relaunched_again() -> None:
    rounds = [Round(1, {5: 3, 7: 3, 2: 3}, done=True)]
    launches = {5: 3, 7: 3, 2: 3, 9: 1}
    # the leader now beats #2; #9 (never a candidate) entered the tie set: not taken
    step = decide(SPEC, [7, 5, 9], launches, rounds, base=1)
    assert isinstance(step, Relaunch) and step.round == 2
    assert step.more == {7: 2, 5: 2}
    # everyone separated from the leader: done
    assert decide(SPEC, [7, 9], launches, rounds, base=1) == Done("separated")


def test_the_budget_ends_it_and_splits_what_is_left_evenly() -> None:
    rounds = [Round(1, {5: 3, 7: 3, 2: 3}, True), Round(2, {5: 4, 7: 4, 2: 4}, True)]
    launches = {5: 4, 7: 4, 2: 4}
    assert spent_launches(launches, 1) == 9
    step = decide(SPEC, [5, 7, 2], launches, rounds, base=1)
    assert isinstance(step, Relaunch) and step.more == {5: 1, 7: 1, 2: 1}  # 3 left of 12
    spent = {5: 5, 7: 5, 2: 5}
    assert decide(SPEC, [5, 7, 2], spent, [*rounds, Round(3, spent, True)], base=1) == Done(
        "budget"
    )
    # two candidates, one launch of budget left: no fair round
    small = ConfirmSpec(top=2, launches=1, budget=3)  # type: ignore[arg-type]
    assert decide(small, [1, 2], {1: 3, 2: 2}, [Round(1, {1: 3, 2: 2}, True)], base=1) == Done(
        "budget"
    )
    timed = ConfirmSpec(budget="10m")  # type: ignore[arg-type]
    done = [Round(1, {1: 3, 2: 3}, True, seconds=601.0)]
    assert decide(timed, [1, 2], {1: 3, 2: 3}, done, base=1, elapsed_s=601.0) == Done("budget")
    assert isinstance(decide(timed, [1, 2], {1: 3, 2: 3}, done, base=1, elapsed_s=60.0), Relaunch)


def test_a_round_a_stopped_run_began_is_finished_first() -> None:
    rounds = [Round(1, {5: 3, 7: 3}, done=False)]
    # #5 got both launches before the kill, #7 one
    step = decide(SPEC, [5, 7], {5: 3, 7: 2}, rounds, base=1)
    assert isinstance(step, Relaunch) and not step.new
    assert (step.round, step.more) == (1, {7: 1})
    # everything stored already (killed before the round was marked done): go on
    after = decide(SPEC, [5, 7], {5: 3, 7: 3}, rounds, base=1)
    assert isinstance(after, Relaunch) and after.new and after.round == 2


def test_a_failed_relaunch_drops_the_candidate() -> None:
    rounds = [Round(1, {5: 3, 7: 3}, done=False)]
    assert decide(SPEC, [5, 7], {5: 3, 7: 2}, rounds, base=1, dropped=frozenset({7})) == Done(
        "failed"
    )


_SWEEP = """
name: s
server: {engine: sim, port: 18999}
workloads: [{name: chat, concurrency: [1], requests: 4}]
"""


def test_confirm_is_on_for_a_search_and_off_for_a_grid_unless_set() -> None:
    grid = load_sweep_text(_SWEEP, "s.yaml").spec
    assert grid.confirm_phase is None
    assert load_sweep_text(_SWEEP + "confirm: true\n", "s.yaml").spec.confirm_phase == SPEC
    search = load_sweep_text(
        _SWEEP + "params: {grid: {budget: [1, 8]}}\nsearch: {strategy: random, trials: 4}\n",
        "s.yaml",
    ).spec
    assert search.confirm_phase == ConfirmSpec()
    off = load_sweep_text(
        _SWEEP + "params: {grid: {budget: [1, 8]}}\nsearch: {strategy: random, trials: 4}\n"
        "confirm: false\n",
        "s.yaml",
    ).spec
    assert off.confirm_phase is None
    spec = load_sweep_text(
        _SWEEP + "confirm: {top: 2, launches: 1, budget: 30m}\n", "s.yaml"
    ).spec.confirm_phase
    assert spec is not None and spec.max_seconds == 1800.0 and spec.top == 2
    counted = load_sweep_text(_SWEEP + "confirm: {budget: 8}\n", "s.yaml").spec.confirm_phase
    assert counted is not None and counted.max_launches == 8 and counted.max_seconds is None
    with pytest.raises(ConfigError, match="confirm"):
        load_sweep_text(_SWEEP + "confirm: {budget: soon}\n", "s.yaml")
    with pytest.raises(ConfigError, match="confirm"):
        load_sweep_text(_SWEEP + "confirm: {top: 1}\n", "s.yaml")


def _measured(value: float, half: float, launch: int = 0) -> LevelResult:
    return LevelResult(
        "chat",
        "c1",
        0,
        {"output_throughput": value},
        started_at=T0,
        intervals={"output_throughput": (value - half, value + half)},
        confidence=0.95,
        launch=launch,
    )


def _round(targets: dict[str, int], relaunches: int) -> dict[str, object]:
    return {"step": "round", "round": 1, "targets": targets, "relaunches": relaunches}


def test_best_says_what_the_confirmation_changed() -> None:
    trials = [trial(5, {"b": 1}), trial(7, {"b": 2})]
    results = {5: [_measured(221.0, 1.0)], 7: [_measured(230.0, 1.0)]}
    steps = (
        _round({"5": 2, "7": 2}, 2),
        {"step": "round_done", "round": 1, "seconds": 3.0},
        {"step": "done", "reason": "separated"},
    )
    data = dataclasses.replace(sweep_data(trials, results), confirm=steps)
    best = find_best(data, "chat.c1.output_throughput")
    assert best.decided and best.trial is not None and best.trial.id == 7
    assert best.confirm_note.startswith(
        "confirm: 1 round, 2 relaunches of #5, #7; #7 now beats #5: leads by 4.1% (±"
    )
    assert "note: confirm: 1 round" in format_best(best)
    out = best_to_json(best)["confirm"]
    assert out["rounds"] == 1 and out["reason"] == "separated" and out["finished"]
    # still tied when the budget was spent
    tied = {5: [_measured(221.0, 3.0)], 7: [_measured(222.0, 3.0)]}
    steps = (_round({"5": 2, "7": 2}, 2), {"step": "done", "reason": "budget"})
    best = find_best(
        dataclasses.replace(sweep_data(trials, tied), confirm=steps), "chat.c1.output_throughput"
    )
    assert best.confirm_note.endswith("#7 and #5 still tied after the budget")
    # killed during its round: said so; a reset makes the old steps count no more
    best = find_best(
        dataclasses.replace(sweep_data(trials, tied), confirm=steps[:1]),
        "chat.c1.output_throughput",
    )
    assert "under way when the run stopped" in best.confirm_note
    reset = (*steps, {"step": "reset"})
    best = find_best(
        dataclasses.replace(sweep_data(trials, tied), confirm=reset), "chat.c1.output_throughput"
    )
    assert best.confirm is None and best_to_json(best)["confirm"] is None


def test_plan_says_what_the_confirm_phase_may_add() -> None:
    from servesweep.spec.plan import build_plan, format_plan

    grid = format_plan(build_plan(load_sweep_text(_SWEEP, "s.yaml").spec))
    assert "confirm" not in grid
    text = format_plan(
        build_plan(load_sweep_text(_SWEEP + "confirm: {top: 2, launches: 1}\n", "s.yaml").spec)
    )
    assert (
        "then confirm: the leaders still tied (up to 2) relaunched 1 time each per round, "
        "at most 4 more server starts"
    ) in text
    timed = format_plan(
        build_plan(load_sweep_text(_SWEEP + "confirm: {budget: 30m}\n", "s.yaml").spec)
    )
    assert "relaunched 2 times each per round, at most 30m" in timed
