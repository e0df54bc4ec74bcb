"""The report's performance prediction (``report.predicted_view``): every launched
trial's prediction against its measurement (error, inside or not), the trials skipped
as predicted worse with their predictions, and the GPU-hours the skipping saved: the
skipped trials times the mean GPU-hours of a measured trial (issue 34); a trial
skipped and then launched before the end (reopened) shows its skip beside its
measurement and saved nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servesweep.decide.perf import Prediction
from servesweep.decide.perf.gate import Leader, skip_evidence
from servesweep.models import Outcome
from servesweep.records import ReopenedSkip, SweepData, SweepRecord, TrialRecord
from servesweep.report.html import render_html
from servesweep.report.predicted_view import predicted_json, predicted_lines, predicted_table

pytestmark = pytest.mark.unit

M = "chat.c1.output_throughput"


def _trial(
    id: int, budget: int, outcome: Outcome, seconds: float = 0.0, **kw: object
) -> TrialRecord:
    started = 1000.0 if seconds else None
    return TrialRecord(
        id=id,
        sweep_id=1,
        seq=id,
        fingerprint=f"f{id}",
        params={"budget": budget},
        outcome=outcome,
        started_at=started,
        finished_at=started + seconds if started is not None else None,
        gpus=(0, 1),
        **kw,  # type: ignore[arg-type]
    )


def _data(*trials: TrialRecord, performance: dict[int, dict[str, object]]) -> SweepData:
    sweep = SweepRecord(
        id=1,
        name="s",
        spec_path="s.yaml",
        spec_text="",
        spec_hash="h",
        created_at=0.0,
        servesweep_version="0",
    )
    return SweepData(sweep=sweep, trials=trials, results={}, performance=performance)


def test_predicted_against_measured_the_skipped_and_the_hours_saved() -> None:
    predicted = Prediction(M, 100.0, 90.0, 110.0, "speculative").to_json()
    worse = skip_evidence(
        "budget=16",
        {M: Prediction(M, 40.0, 30.0, 50.0, "speculative")},
        Leader(M, "max", 120.0, 1),
        0.01,
    )
    data = _data(
        _trial(1, 1, Outcome.OK, seconds=1800.0),  # 2 GPUs: 1 GPU-hour
        _trial(2, 4, Outcome.OK, seconds=5400.0),  # 3 GPU-hours
        _trial(3, 16, Outcome.SKIPPED, evidence=worse),
        performance={
            1: {"predicted": {M: Prediction(M).to_json()}, "measured": {M: 120.0}, "widen": {}},
            2: {"predicted": {M: predicted}, "measured": {M: 80.0}, "widen": {M: 2.5}},
        },
    )
    doc = predicted_json(data)
    assert doc is not None
    first, second = doc["launched"]
    assert first["metrics"][M]["error"] is None and first["metrics"][M]["measured"] == 120.0
    assert second["metrics"][M]["error"] == pytest.approx(0.25)  # (100 - 80) / 80
    assert second["metrics"][M]["inside"] is False
    (skipped,) = doc["skipped"]
    assert skipped["trial"] == 3 and skipped["predicted"][M]["high"] == 50.0
    assert skipped["leader"]["trial"] == 1
    assert doc["mean_launch_gpu_hours"] == pytest.approx(2.0)
    assert doc["saved_gpu_hours"] == pytest.approx(2.0)
    assert doc["trust"] == {M: 2.5}
    lines = predicted_lines(data)
    assert any("measured 80 (+25.0%, outside)" in line for line in lines), lines
    assert any(line.startswith("#3 budget=16: skipped (predicted_worse)") for line in lines)
    assert any(line.startswith("saved: 1 launch(es) not made, about 2 GPU-hours") for line in lines)
    table = predicted_table(data)
    assert table is not None
    assert (3, "budget=16", M, "40 [30-50] speculative", "skipped", "-") in table["rows"]


def test_nothing_predicted_is_no_section() -> None:
    data = _data(_trial(1, 1, Outcome.OK, seconds=10.0), performance={})
    assert predicted_json(data) is None and predicted_lines(data) == []
    assert predicted_table(data) is None


def _reopened_data(*, also_skipped: bool) -> SweepData:
    """Trial 3 (budget 16) was skipped on a prediction of 40 [30-50] against #1's 120,
    then launched before the end and measured 45; trial 4 (budget 12), when
    ``also_skipped``, is still skipped."""
    worse = skip_evidence(
        "budget=16",
        {M: Prediction(M, 40.0, 30.0, 50.0, "speculative")},
        Leader(M, "max", 120.0, 1),
        0.01,
    )
    assert worse is not None
    trials = [
        _trial(1, 1, Outcome.OK, seconds=1800.0),  # 2 GPUs: 1 GPU-hour
        _trial(2, 4, Outcome.OK, seconds=5400.0),  # 3 GPU-hours
        _trial(3, 16, Outcome.OK, seconds=3600.0),  # the late launch: 2 GPU-hours
    ]
    if also_skipped:
        trials.append(_trial(4, 12, Outcome.SKIPPED, evidence=worse))
    late = Prediction(M, 44.0, 20.0, 130.0, "speculative").to_json()
    data = _data(
        *trials,
        performance={
            1: {"predicted": {M: Prediction(M).to_json()}, "measured": {M: 120.0}, "widen": {}},
            3: {"predicted": {M: late}, "measured": {M: 45.0}, "widen": {M: 3.0}},
        },
    )
    # skipped at 1970-01-01 00:10:00 UTC, launched at 1000 s (_trial's start)
    return replace(data, reopened={3: (ReopenedSkip(3, 600.0, worse),)})


def test_a_reopened_trial_shows_its_skip_beside_its_measurement() -> None:
    data = _reopened_data(also_skipped=True)
    doc = predicted_json(data)
    assert doc is not None
    (row,) = doc["reopened"]
    assert row["trial"] == 3 and row["params"] == {"budget": 16}
    assert row["skipped_at"] == 600.0 and row["launched_at"] == 1000.0
    assert row["outcome"] == "ok" and row["reason"] == "predicted_worse"
    assert row["leader"] == {"trial": 1, "metric": M, "value": 120.0}
    cell = row["predicted"][M]
    assert (cell["value"], cell["low"], cell["high"]) == (40.0, 30.0, 50.0)
    assert cell["measured"] == 45.0 and cell["inside"] is True
    assert cell["error"] == pytest.approx(-5.0 / 45.0)
    # its late launch is among the launched, with the prediction made at that placement
    assert 3 in {r["trial"] for r in doc["launched"]}
    # the saving counts only what is still skipped (#4), at the mean of 1, 3 and 2 GPU-h
    assert [r["trial"] for r in doc["skipped"]] == [4]
    assert doc["mean_launch_gpu_hours"] == pytest.approx(2.0)
    assert doc["saved_gpu_hours"] == pytest.approx(2.0)
    lines = predicted_lines(data)
    assert (
        "#3 budget=16: skipped 1970-01-01 00:10:00 UTC as predicted worse than #1 "
        f"({M} 120): {M} 40 [30-50] speculative; measured 45 (-11.1%); reopened (its "
        "interval still reached the leader) and launched 1970-01-01 00:16:40 UTC, ok"
    ) in lines, lines
    assert any(
        line.startswith("saved: 1 launch(es) not made, about 2 GPU-hours")
        and line.endswith("; 1 reopened (skipped, then launched) saved nothing and are not counted")
        for line in lines
    ), lines
    table = predicted_table(data)
    assert table is not None
    assert table["reopened"] == [
        (
            3,
            "budget=16",
            f"skipped 1970-01-01 00:10:00 UTC as predicted worse than #1 ({M} 120)",
            M,
            "40 [30-50] speculative",
            "launched 1970-01-01 00:16:40 UTC, ok",
            "45",
            "-11.1%",
        )
    ]
    html = render_html(data)
    assert 'id="reopened-table"' in html and "Skipped, then launched" in html


def test_a_sweep_whose_every_skip_was_reopened_saved_nothing() -> None:
    data = _reopened_data(also_skipped=False)
    doc = predicted_json(data)
    assert doc is not None
    assert doc["skipped"] == [] and len(doc["reopened"]) == 1
    assert doc["saved_gpu_hours"] == 0.0
    assert (
        "saved: nothing, every trial skipped as predicted worse was launched before the "
        "end (1 reopened)"
    ) in predicted_lines(data)


def test_a_reopened_trial_not_launched_yet_says_so() -> None:
    data = _reopened_data(also_skipped=False)
    pending = replace(data.trials[2], outcome=Outcome.PENDING, started_at=None, finished_at=None)
    data = replace(
        data,
        trials=(*data.trials[:2], pending),
        performance={k: v for k, v in data.performance.items() if k != 3},
    )
    doc = predicted_json(data)
    assert doc is not None
    (row,) = doc["reopened"]
    assert row["outcome"] == "pending" and row["predicted"][M]["measured"] is None
    assert any(
        line.startswith("#3 budget=16: skipped") and line.endswith("and not launched yet")
        for line in predicted_lines(data)
    )
