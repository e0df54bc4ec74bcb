"""The confirm phase's decisions (successive elimination under a budget), its place in
the sweep file, and what ``best`` says about it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from helpers.report_data import T0, sweep_data, trial
from servesweep.decide.best import find_best
from servesweep.decide.confirm import Done, Relaunch, Round, cost, decide, spent_launches
from servesweep.decide.confirmed import ConfirmSummary, confirm_note
from servesweep.errors import ConfigError
from servesweep.models import LevelResult, Outcome, ServerConfig
from servesweep.report.best_view import best_to_json, format_best
from servesweep.spec.load import load_sweep_text
from servesweep.spec.schema import ConfirmSpec
from servesweep.store import open_store
from servesweep.sweep.core.confirm_run import ConfirmRun
from servesweep.sweep.core.store_writer import StoreWriter
from servesweep.sweep.events import NullObserver

SPEC = ConfirmSpec(top=3, launches=2)  # budget: 2 x 3 x 2 = 12 extra launches


def test_the_first_round_relaunches_the_top_of_the_tie_set() -> None:
    step = decide(SPEC, [5, 7, 2, 9], {5: 1, 7: 1, 2: 1, 9: 1}, [])
    assert isinstance(step, Relaunch) and step.new
    assert step.round == 1
    assert step.more == {5: 2, 7: 2, 2: 2}  # at most top, in ranking order
    assert step.targets == {5: 3, 7: 3, 2: 3}


def test_no_tie_nothing_to_confirm() -> None:
    assert decide(SPEC, [5], {5: 1, 7: 1}, []) == Done("no_tie")


def test_a_candidate_once_beaten_is_not_relaunched_again() -> None:
    rounds = [Round(1, {5: 3, 7: 3, 2: 3}, done=True)]
    launches = {5: 3, 7: 3, 2: 3, 9: 1}
    # the leader now beats #2; #9 (never a candidate) entered the tie set: not taken
    step = decide(SPEC, [7, 5, 9], launches, rounds)
    assert isinstance(step, Relaunch) and step.round == 2
    assert step.more == {7: 2, 5: 2}
    # everyone separated from the leader: done
    assert decide(SPEC, [7, 9], launches, rounds) == Done("separated")


def test_the_budget_ends_it_and_splits_what_is_left_evenly() -> None:
    rounds = [
        Round(1, {5: 3, 7: 3, 2: 3}, True, relaunches=6),
        Round(2, {5: 4, 7: 4, 2: 4}, True, relaunches=3),
    ]
    launches = {5: 4, 7: 4, 2: 4}
    assert spent_launches(launches, 1) == 9
    step = decide(SPEC, [5, 7, 2], launches, rounds)
    assert isinstance(step, Relaunch) and step.more == {5: 1, 7: 1, 2: 1}  # 3 left of 12
    assert cost(step) == 3
    spent = {5: 5, 7: 5, 2: 5}
    third = Round(3, spent, True, relaunches=3)
    assert decide(SPEC, [5, 7, 2], spent, [*rounds, third]) == Done("budget")
    # two candidates, one launch of budget left: no fair round
    small = ConfirmSpec(top=2, launches=1, budget=3)  # type: ignore[arg-type]
    first = [Round(1, {1: 3, 2: 3}, True, relaunches=2)]
    assert decide(small, [1, 2], {1: 3, 2: 3}, first) == Done("budget")
    # the budget is what the phase's own rounds added: launches a trial had before
    # (its own launches, an earlier phase's) cost nothing of it
    assert isinstance(decide(small, [1, 2], {1: 9, 2: 9}, []), Relaunch)
    timed = ConfirmSpec(budget="10m")  # type: ignore[arg-type]
    done = [Round(1, {1: 3, 2: 3}, True, seconds=601.0, relaunches=4)]
    assert decide(timed, [1, 2], {1: 3, 2: 3}, done, elapsed_s=601.0) == Done("budget")
    assert isinstance(decide(timed, [1, 2], {1: 3, 2: 3}, done, elapsed_s=60.0), Relaunch)


def test_a_round_a_stopped_run_began_is_finished_first() -> None:
    rounds = [Round(1, {5: 3, 7: 3}, done=False)]
    # #5 got both launches before the kill, #7 one
    step = decide(SPEC, [5, 7], {5: 3, 7: 2}, rounds)
    assert isinstance(step, Relaunch) and not step.new
    assert (step.round, step.more) == (1, {7: 1})
    # everything stored already (killed before the round was marked done): go on
    after = decide(SPEC, [5, 7], {5: 3, 7: 3}, rounds)
    assert isinstance(after, Relaunch) and after.new and after.round == 2


def test_a_failed_relaunch_drops_the_candidate() -> None:
    rounds = [Round(1, {5: 3, 7: 3}, done=False)]
    assert decide(SPEC, [5, 7], {5: 3, 7: 2}, rounds, dropped=frozenset({7})) == Done("failed")


def test_equivalent_candidates_are_not_relaunched_and_end_the_phase() -> None:
    # every candidate left is equivalent to the leader: done, nothing relaunched
    assert decide(SPEC, [5, 7, 2], {5: 1, 7: 1, 2: 1}, [], equivalent=frozenset({7, 2})) == Done(
        "equivalent"
    )
    rounds = [Round(1, {5: 3, 7: 3, 2: 3}, done=True, relaunches=6)]
    assert decide(
        SPEC, [5, 7, 2], {5: 3, 7: 3, 2: 3}, rounds, equivalent=frozenset({7, 2})
    ) == Done("equivalent")
    # one equivalent, one still undecided: only the undecided one goes on with the leader
    step = decide(SPEC, [5, 7, 2], {5: 3, 7: 3, 2: 3}, rounds, equivalent=frozenset({7}))
    assert isinstance(step, Relaunch) and step.more == {5: 2, 2: 2}
    # without the equivalence, the same standing spends the budget on all three
    step = decide(SPEC, [5, 7, 2], {5: 3, 7: 3, 2: 3}, rounds)
    assert isinstance(step, Relaunch) and step.more == {5: 2, 7: 2, 2: 2}


def test_best_says_the_candidates_are_equivalent() -> None:
    trials = [trial(5, {"b": 1}), trial(7, {"b": 2})]
    # sixteen launches each that agree, 0.2 % apart: the difference is inside ± 1 %
    # (launches measured to vary little: the stated 2 % gives way to what they show)
    same = {
        5: [_measured(221.0 + 0.1 * (k % 2), 0.2, launch=k) for k in range(16)],
        7: [_measured(221.4 + 0.1 * (k % 2), 0.2, launch=k) for k in range(16)],
    }
    steps = (
        _round({"5": 16, "7": 16}, 30),
        {"step": "round_done", "round": 1, "seconds": 3.0},
        {"step": "done", "reason": "equivalent"},
    )
    best = find_best(
        dataclasses.replace(sweep_data(trials, same), confirm=steps), "chat.c1.output_throughput"
    )
    assert not best.decided and [c.trial.id for c in best.equivalent] == [5]
    assert "are equivalent within ±1% on chat.c1.output_throughput" in best.why
    assert best.confirm_note.endswith("#7 and #5 equivalent within ±1%")
    assert "still tied" not in best.confirm_note
    assert best_to_json(best)["decision"]["equivalent"] == [5]
    # the same means with one launch each: launches vary by 2 %, so equivalence
    # within 1 % is not shown; a tie, as before
    one = {5: [_measured(221.1, 0.2)], 7: [_measured(221.5, 0.2)]}
    best = find_best(sweep_data(trials, one), "chat.c1.output_throughput")
    assert not best.decided and best.equivalent == ()
    assert "equivalent" not in best.why
    # a threshold below 1 % is said as it is
    summary = ConfirmSummary(0, 0, (), "equivalent")
    assert confirm_note(summary, 5, [5, 7], [], equivalent=[7], threshold=0.005) == (
        "confirm: nothing to confirm (#5 and #7 are equivalent within ±0.5%)"
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
    # the first launch and the round's two relaunches of each, stored as its launches
    results = {
        5: [_measured(221.0, 1.0, launch=k) for k in range(3)],
        7: [_measured(230.0, 1.0, launch=k) for k in range(3)],
    }
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


def test_the_phase_reads_its_rounds_from_the_store_and_starts_anew_after_a_reset(
    tmp_path: Path,
) -> None:
    """What a rerun sees: the rounds stored, the launches stored, the tie set now."""
    with open_store(tmp_path / "s.db") as store:
        sweep = store.create_sweep("s", "s.yaml", "", "hash", "0.1.0")
        configs = [ServerConfig.of({"seed": s}) for s in (1, 2)]
        trials = store.sync_trials(sweep.id, configs)
        for n, rec in enumerate(trials):
            store.begin_attempt(rec.id, T0 + n, None)
            store.add_result(rec.id, _measured(220.0 + n, 3.0))
            store.finish_trial(rec.id, Outcome.OK, T0 + n + 1)
        writer = StoreWriter(store, sweep.id, NullObserver())
        phase = ConfirmRun(store, sweep.id, ConfirmSpec(top=3, launches=1, budget=2), writer.note)  # type: ignore[arg-type]
        step = phase.next()
        assert isinstance(step, Relaunch) and step.more == {trials[1].id: 1, trials[0].id: 1}
        phase.begin(step)
        # killed after one of the two relaunches was stored: the rerun finishes the round
        store.add_result(trials[1].id, _measured(221.0, 3.0, launch=1))
        again = ConfirmRun(store, sweep.id, ConfirmSpec(top=3, launches=1, budget=2), writer.note)  # type: ignore[arg-type]
        rest = again.next()
        assert isinstance(rest, Relaunch) and not rest.new and rest.more == {trials[0].id: 1}
        assert again.launches[trials[0].id] == 1  # its next launch is number 1
        store.add_result(trials[0].id, _measured(220.0, 3.0, launch=1))
        again.round_done(rest, 2.0)
        done = again.next()
        assert done == Done("budget")
        assert not again.done_before(done)
        again.finish(done)
        assert again.done_before(done)
        # trials ran since (an edited sweep): the stored rounds no longer count
        again.reset()
        fresh = again.next()
        assert isinstance(fresh, Relaunch) and fresh.new and fresh.round == 1
        best = find_best(store.load_sweep_data(sweep.id, with_samples=False))
        assert best.confirm is None  # the reset phase says nothing yet


def test_ctrl_c_while_the_phase_reads_its_standing_stops_the_run(tmp_path: Path) -> None:
    """The signal handler raises Interrupted wherever the run is; inside the phase's
    reading of the store it must stop the run, not end the phase as undecidable."""
    from servesweep.errors import Interrupted

    with open_store(tmp_path / "s.db") as store:
        sweep = store.create_sweep("s", "s.yaml", "", "hash", "0.1.0")
        writer = StoreWriter(store, sweep.id, NullObserver())
        phase = ConfirmRun(store, sweep.id, ConfirmSpec(), writer.note)  # type: ignore[arg-type]

        def interrupted(*args: object, **kwargs: object) -> None:
            raise Interrupted("received SIGINT")

        store_load = store.load_sweep_data
        store.load_sweep_data = interrupted  # type: ignore[method-assign, assignment]
        try:
            with pytest.raises(Interrupted):
                phase.next()
        finally:
            store.load_sweep_data = store_load  # type: ignore[method-assign]
        assert not store.events(sweep.id, "confirm")  # nothing recorded as decided
