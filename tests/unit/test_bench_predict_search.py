"""bench/predict_search.py: the policy "predict, then launch only what can still win"
on the search landscape and on the ``curves`` landscape (the figures docs/benchmarks.md
quotes)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCH))
    try:
        module = importlib.import_module("predict_search")
    finally:
        sys.path.remove(str(BENCH))
    yield module
    module.landscape("original")  # the shared landscape as bench/search_efficiency has it


def test_the_curves_landscape_is_not_the_predictors_acceptance_model(bench: ModuleType) -> None:
    # log-logistic cumulative rates: the conditional acceptance falls and then rises
    # with the position, which no curve of the predictor's family (a * d**i, d <= 1) does
    from servesweep.decide.perf.speculative import alphas_from_rates

    alphas = alphas_from_rates([bench.curves_rate(i) for i in range(1, 9)])
    assert alphas[0] > alphas[3] < alphas[7]
    land = bench.landscape("curves")
    assert len(land.truth) == 80 and land.drafts == (0, 1, 2, 4, 8)
    assert any(t.oom for t in land.truth.values())
    assert any(not t.oom and not t.feasible for t in land.truth.values())


@pytest.mark.parametrize("name", ["original", "curves"])
def test_the_policy_reaches_the_best_and_names_it(bench: ModuleType, name: str) -> None:
    land = bench.landscape(name)
    full = bench.se.grid_cost()
    for seed in (0, 1):
        run = bench.run_policy(land, seed)
        assert run.gpu_hours is not None and run.restarts is not None
        assert run.gpu_hours <= run.total_gpu_hours < full
        assert run.restarts <= run.launched < len(land.truth)
        assert not run.wrong_winner
        assert run.seconds / run.launched < 1.0  # the search's own time per launch


def test_a_warm_start_from_a_drifted_earlier_sweep(bench: ModuleType) -> None:
    land = bench.landscape("original")
    earlier: list[Any] = []
    first = bench.run_policy(bench.drifted(land), 1000, out=earlier)
    assert 1 <= len(earlier) <= first.launched  # an OOM crash measured nothing
    assert all(bench.OBJECTIVE in m.metrics for m in earlier)
    run = bench.run_policy(land, 0, earlier)
    assert run.gpu_hours is not None and not run.wrong_winner
    # the earlier trials predict the configurations: no random first launch, and the
    # best is reached with fewer GPU-hours than the earlier sweep needed from cold
    assert run.gpu_hours < first.gpu_hours


def test_servesweep_runs_tpe_through_both_gates_to_the_best(bench: ModuleType) -> None:
    land = bench.landscape("original")
    full = bench.se.grid_cost()
    for guided in (True, False):  # guided by the prediction (as now), and as before
        run = bench.run_sweep(land, 0, guided)
        assert run.gpu_hours is not None and run.restarts is not None
        assert run.gpu_hours <= run.total_gpu_hours < full
        assert run.restarts <= run.launched <= len(land.truth)
        assert not run.wrong_winner
        assert run.search_seconds > 0  # the search's own time is measured


def test_curves_levels_carry_the_engines_per_position_counters(bench: ModuleType) -> None:
    import random

    from servesweep.decide.perf.inputs import level_rates

    bench.landscape("curves")
    result = bench._curves_level("c8", (64, 8192, 4), random.Random(0))
    rates = level_rates(result.info)
    assert len(rates) == 4
    assert rates == pytest.approx([bench.curves_rate(i) for i in range(1, 5)], rel=0.05)
    assert bench._curves_level("c8", (64, 8192, 0), random.Random(0)).info == {}
