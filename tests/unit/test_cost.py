"""Cost as an objective: the cost figures of a level, and best's ranking by them."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from helpers.report_data import T0, sweep_data, trial
from servesweep.decide.best import find_best
from servesweep.decide.cost import level_cost
from servesweep.decide.verdict import VerdictKind, judge
from servesweep.errors import ConfigError
from servesweep.models import LevelResult
from servesweep.records import SweepData
from servesweep.report.best_view import best_to_json, format_best
from servesweep.report.html import render_html
from servesweep.report.tables import render_markdown
from servesweep.search.base import goal_of
from servesweep.spec.constraints import resolve_objectives, validate_constraints
from servesweep.spec.load import load_sweep_text

pytestmark = pytest.mark.unit

SPEC = """
name: priced
server: {engine: sim, gpus: [0, 1, 2, 3]}
params: {grid: {tp: [1, 2, 4]}}
workloads: [{name: chat, concurrency: [8]}]
cost: {gpu_hour: 2.49, currency: USD}
"""


def test_the_cost_of_a_level_follows_its_throughput_and_gpus() -> None:
    values, bounds = level_cost(
        {"output_throughput": 1000.0}, {"output_throughput": (800.0, 1250.0)}, 2, 2.49
    )
    # 2 GPUs at 2.49 an hour: 4.98 an hour for 3.6 M tokens
    assert values["cost_per_mtok"] == pytest.approx(4.98 / 3.6)
    assert values["tokens_per_dollar"] == pytest.approx(3.6e6 / 4.98)
    # the bounds swap for the cost: the fastest end is the cheapest
    assert bounds["cost_per_mtok"] == pytest.approx((4.98 / 4.5, 4.98 / 2.88))
    assert bounds["tokens_per_dollar"] == pytest.approx((2.88e6 / 4.98, 4.5e6 / 4.98))
    assert level_cost({"output_throughput": 0.0}, {}, 2, 2.49) == ({}, {})
    assert level_cost({"output_throughput": 10.0}, {}, None, 2.49) == ({}, {})
    assert level_cost({"pass_rate": 1.0}, {}, 1, 2.49) == ({}, {})


def test_the_sweep_file_prices_a_gpu_hour_and_objectives_may_use_it() -> None:
    text = SPEC + "objective: {minimize: chat.c8.cost_per_mtok}\n"
    spec = load_sweep_text(text).spec
    assert spec.cost is not None and (spec.cost.gpu_hour, spec.cost.currency) == (2.49, "USD")
    ((ref, direction),) = resolve_objectives(spec)
    assert (ref.key, direction) == ("chat.c8.cost_per_mtok", "min")
    both = load_sweep_text(
        SPEC + "objective: [{minimize: gpus}, {minimize: cost_per_mtok}]\n"
        "constraints: ['chat.tokens_per_dollar > 1000', 'gpus <= 2']\n"
    ).spec
    assert [r.key for r, _ in resolve_objectives(both)] == ["gpus", "chat.c8.cost_per_mtok"]
    assert [str(c) for c in validate_constraints(both)] == [
        "chat.c8.tokens_per_dollar > 1000",
        "gpus <= 2",
    ]
    for bad in ("{gpu_hour: -1}", "{gpu_hour: 0}", "{gpu_hour: 1, currency: 'US D'}", "2.49"):
        with pytest.raises(ConfigError, match="cost"):
            load_sweep_text(SPEC.replace("{gpu_hour: 2.49, currency: USD}", bad))


def _level(throughput: float, ttft_p99: float) -> LevelResult:
    half = throughput * 0.01
    return LevelResult(
        "chat",
        "c8",
        0,
        {"output_throughput": throughput, "ttft_p99_ms": ttft_p99},
        started_at=T0,
        intervals={
            "output_throughput": (throughput - half, throughput + half),
            "ttft_p99_ms": (ttft_p99 - 1.0, ttft_p99 + 1.0),
        },
        confidence=0.95,
    )


def _priced(text: str = SPEC) -> SweepData:
    """1, 2, 2 and 4 GPUs: per GPU, #2 is the cheapest but misses the TTFT limit; #3
    the cheapest that meets it; #1 the fewest GPUs, too slow; #4 the fastest."""
    trials = [
        trial(1, {"tp": 1}, gpus=(0,)),
        trial(2, {"tp": 2, "b": 1}, gpus=(0, 1)),
        trial(3, {"tp": 2, "b": 2}, gpus=(0, 1)),
        trial(4, {"tp": 4}, gpus=(0, 1, 2, 3)),
    ]
    results = {
        1: [_level(400.0, 900.0)],
        2: [_level(1300.0, 700.0)],
        3: [_level(1100.0, 300.0)],
        4: [_level(1700.0, 200.0)],
    }
    data = sweep_data(trials, results, constraints=["chat.c8.ttft_p99_ms < 500"])
    return replace(data, sweep=replace(data.sweep, spec_text=text))


def _cost(gpus: int, throughput: float) -> float:
    return 2.49 * gpus / 3600 / throughput * 1e6


def test_best_minimizes_the_cost_per_million_tokens_under_the_constraints() -> None:
    best = find_best(_priced(), "chat.c8.cost_per_mtok", "min")
    assert best.trial is not None and best.trial.id == 3
    assert best.value == pytest.approx(_cost(2, 1100.0))
    assert [c.trial.id for c in best.ranking] == [3, 4]
    assert {e.trial.id: e.kind for e in best.excluded} == {1: "constraint", 2: "constraint"}
    # ranked by tokens per dollar the same way
    assert find_best(_priced(), "chat.c8.tokens_per_dollar", "max").trial.id == 3  # type: ignore[union-attr]
    text = format_best(best)
    assert "cost: 2 GPUs; at chat.c8 1.258 USD per million output tokens" in text
    assert "at 2.49 USD per GPU-hour" in text
    assert "[4 GPUs, 1.627 USD/Mtok]" in text
    out = best_to_json(best)
    assert out["cost"] == {"gpu_hour": 2.49, "currency": "USD", "level": "chat.c8"}
    assert out["best"]["gpus"] == 2
    assert out["best"]["cost_per_mtok"] == pytest.approx(_cost(2, 1100.0))
    assert out["best"]["tokens_per_dollar"] == pytest.approx(1100.0 * 3600 / (2 * 2.49))
    # a constraint on the cost
    capped = find_best(
        _priced(), "chat.c8.output_throughput", constraints=["chat.c8.cost_per_mtok < 1.5"]
    )
    assert capped.trial is not None and capped.trial.id == 2
    assert {e.trial.id for e in capped.excluded} == {1, 4}


def test_the_fewest_gpus_that_meet_the_constraints_tie_broken_by_the_objective() -> None:
    best = find_best(_priced(), objectives=[("gpus", "min"), ("chat.c8.output_throughput", "max")])
    # #1 holds one GPU but misses the limit; #2 and #3 hold two, #3 meets it
    assert best.trial is not None and best.trial.id == 3
    assert best.objectives == (("gpus", "min"), ("chat.c8.output_throughput", "max"))
    assert best.winner is not None and best.winner.values == (2.0, 1100.0)
    loose = find_best(
        _priced(),
        objectives=[("gpus", "min"), ("chat.c8.cost_per_mtok", "min")],
        constraints=["chat.c8.ttft_p99_ms < 800"],
    )
    # #2 and #3 both hold two GPUs: the cheaper per token (#2, faster) wins
    assert [c.trial.id for c in loose.ranking] == [2, 3, 4]
    assert loose.trial is not None and loose.trial.id == 2
    assert best_to_json(loose)["best"]["gpus"] == 2


def test_without_a_price_there_are_gpus_but_no_cost() -> None:
    data = _priced(SPEC.replace("cost: {gpu_hour: 2.49, currency: USD}\n", ""))
    best = find_best(data, "chat.c8.cost_per_mtok", "min")
    assert not best.feasible
    assert {e.kind for e in best.excluded} == {"missing_metric"}
    out = best_to_json(find_best(data, "gpus", "min"))
    assert out["best"]["gpus"] == 2 and out["best"]["cost_per_mtok"] is None
    assert math.isfinite(out["best"]["values"]["gpus"])


def test_tables_and_the_html_report_show_gpus_and_cost() -> None:
    data = _priced()
    table = render_markdown(data)
    head = next(line for line in table.splitlines() if line.startswith("| trial"))
    assert "| gpus |" in head and "cost\\_per\\_mtok" in head
    assert "1.258" in table
    page = render_html(data)
    assert "<th>gpus</th>" in page.replace(' class="n"', "") or ">gpus<" in page
    assert "cost_per_mtok" in page and "USD per million output tokens" in page


def test_the_sweep_files_objectives_all_rank_the_first_deciding() -> None:
    text = SPEC + "objective: [{minimize: gpus}, {maximize: chat.c8.output_throughput}]\n"
    best = find_best(_priced(text))
    assert best.objectives == (("gpus", "min"), ("chat.c8.output_throughput", "max"))
    assert best.trial is not None and best.trial.id == 3
    assert [c.trial.id for c in best.ranking] == [3, 4]
    assert [c.trial.id for c in best.pareto] == [3, 4]


def test_a_sampling_search_sees_the_cost_and_the_gpus_of_a_trial() -> None:
    spec = load_sweep_text(
        SPEC + "objective: [{minimize: gpus}, {minimize: chat.c8.cost_per_mtok}]\n"
        "constraints: ['chat.c8.tokens_per_dollar > 1000']\n"
    ).spec
    goal = goal_of(spec)
    assert goal.gpu_hour == 2.49
    verdict = judge(goal, trial(3, {"tp": 2}, gpus=(0, 1)), [_level(1100.0, 300.0)])
    assert verdict.kind is VerdictKind.COMPLETE and verdict.feasible
    assert verdict.values == (2.0, pytest.approx(_cost(2, 1100.0)))
    unpriced = replace(goal, gpu_hour=None)
    missing = judge(unpriced, trial(3, {"tp": 2}, gpus=(0, 1)), [_level(1100.0, 300.0)])
    assert missing.kind is VerdictKind.INFEASIBLE
