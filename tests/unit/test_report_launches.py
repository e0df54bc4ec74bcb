"""Results of several launches: within-launch and between-launch variation kept apart,
and the interval of the mean holding both."""

from __future__ import annotations

import csv
import io
from dataclasses import replace

import pytest

from helpers.report_data import T0, sweep_data, trial
from servesweep.decide.stats import MetricStats, aggregate_levels
from servesweep.models import LevelResult
from servesweep.report import render
from servesweep.report.export import report_document

pytestmark = pytest.mark.unit


def _run(value: float, launch: int, repeat: int, half: float = 1.0) -> LevelResult:
    return LevelResult(
        "chat",
        "c1",
        repeat,
        {"output_throughput": value},
        started_at=T0,
        intervals={"output_throughput": (value - half, value + half)},
        confidence=0.95,
        launch=launch,
    )


def test_launches_keep_their_variation_apart() -> None:
    # two repeats per launch agree within 1; the launches differ by 20
    runs = [_run(100.0, 0, 0), _run(101.0, 0, 1), _run(120.0, 1, 0), _run(121.0, 1, 1)]
    data = sweep_data([trial(1, {"b": 1})], {1: runs})
    (lvl,) = aggregate_levels(data, 1)
    stats = lvl.metrics["output_throughput"]
    assert stats.launches == 2 and stats.n == 4
    assert stats.repeat_sd == pytest.approx(0.7071, abs=1e-3)
    assert stats.launch_sd == pytest.approx(14.142, abs=1e-2)
    # the launches' spread decides: 110.5 ± 1.96 x 14.14 / sqrt(2)
    assert stats.lo is not None and stats.hi is not None
    assert (stats.hi - stats.lo) / 2 == pytest.approx(1.96 * 14.142 / 2**0.5, rel=1e-3)
    # the same four values as repeats of one launch would look much tighter
    one = MetricStats.of([100.0, 101.0, 120.0, 121.0], [(99.0, 101.0)] * 4)
    assert one.half_width is not None and one.half_width < (stats.hi - stats.lo) / 2
    doc = report_document(data)
    agg = doc["trials"][0]["aggregates"][0]["metrics"]["output_throughput"]
    assert agg["launches"] == 2 and agg["launch_sd"] == pytest.approx(14.142, abs=1e-2)
    rows = list(csv.DictReader(io.StringIO(render(data, "csv"))))
    assert [r["launch"] for r in rows] == ["0", "0", "1", "1"]


def test_one_launch_reads_as_before() -> None:
    runs = [_run(100.0, 0, 0), _run(102.0, 0, 1)]
    (lvl,) = aggregate_levels(sweep_data([trial(1, {"b": 1})], {1: runs}), 1)
    stats = lvl.metrics["output_throughput"]
    assert stats.launches == 1 and stats.launch_sd is None
    assert stats == replace(stats, launches=1)
    assert "launches" not in stats.to_dict()
