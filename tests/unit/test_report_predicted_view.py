"""The report's performance prediction (``report.predicted_view``): every launched
trial's prediction against its measurement (error, inside or not), the trials skipped
as predicted worse with their predictions, and the GPU-hours the skipping saved: the
skipped trials times the mean GPU-hours of a measured trial (issue 34)."""

from __future__ import annotations

import pytest

from servesweep.decide.perf import Prediction
from servesweep.decide.perf.gate import Leader, skip_evidence
from servesweep.models import Outcome
from servesweep.records import SweepData, SweepRecord, TrialRecord
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
