"""report --watch: the report is rewritten when the sweep changes, live until the
sweep is finished, and a stopped watcher leaves a page that no longer reloads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from helpers.report_data import throughput_sweep
from servesweep.models import Outcome
from servesweep.records import SweepData
from servesweep.report.watch import watch_report


def _states() -> list[SweepData]:
    data = throughput_sweep()
    first = replace(data, trials=(replace(data.trials[0], outcome=Outcome.RUNNING),))
    second = replace(data, trials=data.trials[:1])
    done = replace(data, sweep=replace(data.sweep, finished_at=data.sweep.created_at + 900))
    return [first, first, second, second, done, done]


def test_rewrites_on_change_until_finished(tmp_path: Path) -> None:
    states = iter(_states())
    written: list[tuple[int, bool]] = []
    sleeps: list[float] = []

    def render(data: SweepData, live: bool) -> str:
        written.append((len(data.trials), live))
        return f"{len(data.trials)} {live}"

    out = tmp_path / "report.html"
    writes = watch_report(lambda: next(states), render, out, interval_s=0.5,
                          sleep=sleeps.append)  # fmt: skip
    assert writes == 3
    assert written == [(1, True), (1, True), (4, False)]  # unchanged states skipped
    assert out.read_text() == "4 False"
    assert sleeps == [0.5] * 4  # it stopped looking once the sweep was finished
    assert list(tmp_path.iterdir()) == [out]  # no temporary file left


def test_an_interrupted_watcher_leaves_a_page_that_stops_reloading(tmp_path: Path) -> None:
    states = iter(_states()[:2])

    def load() -> SweepData:
        try:
            return next(states)
        except StopIteration:
            raise KeyboardInterrupt from None

    out = tmp_path / "report.html"
    with pytest.raises(KeyboardInterrupt):
        watch_report(load, lambda d, live: f"live={live}", out, sleep=lambda s: None)
    assert out.read_text() == "live=False"
