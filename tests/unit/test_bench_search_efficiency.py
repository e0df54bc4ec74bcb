"""bench/search_efficiency.py: where a strategy's GPU-hours up to the best go, and
which of its false skips met the constraint (the figures docs/benchmarks.md quotes)."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("search_efficiency")
    finally:
        sys.path.remove(str(BENCH))


def test_the_breakdown_adds_up_to_the_hours_to_the_best(bench: ModuleType) -> None:
    one_trial = (bench.STOP_RELEASE_S + bench.LOAD_S + sum(s for _, s in bench.LEVELS)) * 8
    for strategy, predict in (("tpe", True), ("random", False)):
        for seed in (0, 1):
            reach = bench.run_search(strategy, seed, predict=predict)
            assert reach.gpu_hours is not None
            assert math.isclose(sum(reach.hours), reach.gpu_hours, rel_tol=1e-9)
            assert math.isclose(reach.hours[3], one_trial / 3600, rel_tol=1e-9)
            assert reach.skipped_winners <= reach.skipped_feasible <= reach.skipped


def test_the_grid_in_its_order_spends_its_hours_on_what_it_meets(bench: ModuleType) -> None:
    reach = bench.run_search("grid", 0)
    oom, missed, explored, reached = reach.hours
    assert oom == 0.0  # its first near-best configuration comes before any OOM one
    assert missed > 0.0 and explored > missed and reached > 0.0
    summary = bench.summarize([reach], bench.grid_cost())
    assert list(summary["hours_mean"]) == list(bench.HOURS)
    assert summary["skipped_winners_total"] == 0


def test_the_oracle_skips_exactly_what_does_not_fit(bench: ModuleType) -> None:
    for seed in (0, 1, 2):
        reach = bench.run_search("tpe", seed, oracle=True)
        assert reach.oom_started == 0 and reach.hours[0] == 0.0
        assert reach.skipped_feasible == 0
