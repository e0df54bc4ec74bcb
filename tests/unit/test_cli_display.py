"""The live display of ``servesweep run``, fed typed events (plain, non-terminal mode)."""

from __future__ import annotations

import io

from rich.console import Console

from servesweep.cli.display import ProgressDisplay
from servesweep.models import Evidence, FailureClass, Outcome, Phase
from servesweep.sweep.events import (
    PhaseEntered,
    SweepStarted,
    SweepWarning,
    TrialFinished,
    TrialStarted,
)


def _display() -> tuple[ProgressDisplay, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200, no_color=True)
    return ProgressDisplay(console), out


def test_several_slots_show_where_each_trial_runs() -> None:
    display, out = _display()
    display.event(SweepStarted(sweep=1, name="s", store="s.db", trials=4, todo=4, slots=2))
    display.event(TrialStarted(trial=1, params={"tp": 2}, slot=0, gpus=(0, 1)))
    display.event(TrialStarted(trial=2, params={"tp": 2}, slot=1, gpus=(2, 3)))
    display.event(PhaseEntered(trial=2, phase=Phase.LOAD))
    display.event(
        TrialFinished(
            trial=2,
            outcome=Outcome.FAILED,
            failure_class=FailureClass.START_CRASH,
            evidence=Evidence("the instance exited", reason="oom"),
            phase_seconds={"stop": 0.000069, "load": 2.0614},
        )
    )
    display.event(SweepWarning(message="careful"))
    text = out.getvalue()
    assert "up to 2 at once" in text
    assert "[1/4] trial 1 on slot 0 gpus 0,1: tp=2" in text
    assert "[2/4] trial 2 on slot 1 gpus 2,3: tp=2" in text
    assert "trial 2: load" in text
    assert "trial 2 failed start_crash: (oom) the instance exited" in text
    assert "(stop 0s, load 2.061s)" in text
    assert "warning: careful" in text


def test_one_slot_says_nothing_of_slots_and_a_search_has_no_total() -> None:
    display, out = _display()
    display.event(SweepStarted(sweep=1, name="s", store="s.db", trials=0, todo=0, slots=1))
    display.event(TrialStarted(trial=7, params={}, slot=0, gpus=(0,)))
    text = out.getvalue()
    assert "[1/?] trial 7: (defaults)" in text
    assert "slot" not in text


def test_a_search_says_at_most_and_lines_use_the_sweeps_own_numbers() -> None:
    display, out = _display()
    display.event(
        SweepStarted(sweep=2, name="tpe", store="s.db", trials=0, todo=5, slots=1, at_most=True)
    )
    # the database's trial 12 is this sweep's trial 3
    display.event(TrialStarted(trial=12, number=3, params={"b": 4}, slot=0))
    display.event(PhaseEntered(trial=12, phase=Phase.LOAD))
    display.event(
        TrialFinished(
            trial=12,
            outcome=Outcome.FAILED,
            failure_class=FailureClass.INVALID_ARGS,
            evidence=Evidence("the server log has a fatal line", reason="invalid_args"),
        )
    )
    text = out.getvalue()
    assert "sweep tpe: 0 trials so far, 0 already done, at most 5 to run" in text
    assert "[1/5] trial 3: b=4" in text and "  trial 3: load" in text
    assert "trial 3 failed invalid_args: the server log has a fatal line" in text
    assert "12" not in text and "(invalid_args)" not in text


def test_a_retry_after_a_lost_node_does_not_pass_the_total() -> None:
    display, out = _display()
    display.event(SweepStarted(sweep=1, name="s", store="s.db", trials=2, todo=2, slots=1))
    display.event(TrialStarted(trial=1, number=1, params={"b": 1}, slot=0))
    display.event(TrialStarted(trial=2, number=2, params={"b": 2}, slot=0))
    display.event(TrialStarted(trial=2, number=2, params={"b": 2}, slot=0, attempt=2))
    text = out.getvalue()
    assert "[2/2] trial 2: b=2" in text
    assert "[2/2] trial 2 again (attempt 2): b=2" in text
    assert "[3/2]" not in text
