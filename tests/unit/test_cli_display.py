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
