"""The search space of a sampling search: ranges (steps, log, int or float), categorical
lists, zipped rows, points, and what ``exclude``/``when`` forbid; the plan it prints."""

from __future__ import annotations

import pytest

from servesweep.errors import ConfigError
from servesweep.models import ServerConfig
from servesweep.spec import build_plan, format_plan, load_sweep_text
from servesweep.spec.constraints import resolve_objectives
from servesweep.spec.expand import expand_configs
from servesweep.spec.schema import ParamRange
from servesweep.spec.space import ZIP_DIMENSION, SearchSpace, build_space

HEAD = """\
name: s
server: {engine: sim}
workloads:
  - {name: chat, concurrency: [1, 8]}
"""


def space_of(params: str, search: str = "{strategy: tpe, trials: 10}") -> SearchSpace:
    spec = load_sweep_text(f"{HEAD}params:\n{params}\nsearch: {search}\n").spec
    return build_space(spec.params)


def test_int_range_with_step_lists_its_values() -> None:
    rng = ParamRange(low=1024, high=8192, step=1024)
    assert rng.is_int
    assert rng.size == 8
    assert rng.values() == [1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192]


def test_float_range_with_step_is_discrete_and_rounded() -> None:
    rng = ParamRange(low=0.8, high=0.95, step=0.05)
    assert not rng.is_int
    assert rng.size == 4
    assert rng.values() == [0.8, 0.85, 0.9, 0.95]


def test_continuous_float_range_has_no_size() -> None:
    rng = ParamRange(low=0.5, high=0.9)
    assert rng.size is None
    with pytest.raises(ValueError):
        rng.values()


def test_int_written_as_float_makes_a_float_range() -> None:
    assert ParamRange(low=1, high=8).is_int
    assert not ParamRange(low=1.0, high=8).is_int


def test_log_int_range_spans_every_integer() -> None:
    rng = ParamRange(low=16, high=512, log=True)
    assert rng.is_int and rng.log
    assert rng.size == 497


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"low": 8, "high": 4}, "low 8 is above high 4"),
        ({"low": 1, "high": 8, "step": 3}, "step 3 does not divide the range 1..8"),
        ({"low": 0.1, "high": 1.0, "step": 0.4}, "use high: 0.9 or high: 1.3"),
        ({"low": 0, "high": 8, "log": True}, "log: true needs low > 0"),
        ({"low": -2.0, "high": 8, "log": True}, "log: true needs low > 0"),
        ({"low": 1, "high": 8, "step": 0}, "step must be > 0"),
        ({"low": 1, "high": 8, "step": 1, "log": True}, "either step or log"),
        ({"low": True, "high": 8}, "expected a number"),
        ({"low": "1", "high": 8}, "expected a number"),
    ],
)
def test_bad_ranges_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        ParamRange.model_validate(kwargs)


def test_space_has_one_dimension_per_grid_param_and_one_for_the_zip() -> None:
    space = space_of(
        "  grid:\n"
        "    max-num-seqs: {low: 16, high: 256, step: 16}\n"
        "    gpu-memory-utilization: {low: 0.8, high: 0.95}\n"
        "    kv-cache-dtype: [auto, fp8]\n"
        "  zip:\n"
        "    budget: [8, 16]\n"
        "    topk: [4, 8]\n"
    )
    names = [d.name for d in space.dimensions]
    assert names == ["max-num-seqs", "gpu-memory-utilization", "kv-cache-dtype", ZIP_DIMENSION]
    assert space.size is None  # a continuous range
    config = space.config(
        {
            "max-num-seqs": 48,
            "gpu-memory-utilization": 0.873456789,
            "kv-cache-dtype": 1,
            ZIP_DIMENSION: 1,
        }
    )
    assert dict(config.params) == {
        "max-num-seqs": 48,
        "gpu-memory-utilization": 0.8735,
        "kv-cache-dtype": "fp8",
        "budget": 16,
        "topk": 8,
    }


def test_sample_of_inverts_config_and_refuses_points_outside() -> None:
    space = space_of(
        "  grid:\n"
        "    max-num-seqs: {low: 16, high: 256, step: 16}\n"
        "    mode: [{a: 1}, [1, 2], fast]\n"
    )
    assert space.size == 16 * 3
    for config in space.configs():
        sample = space.sample_of(config.params)
        assert sample is not None
        assert space.config(sample) == config
    assert space.sample_of({"max-num-seqs": 24, "mode": "fast"}) is None  # off the step
    assert space.sample_of({"max-num-seqs": 32, "mode": "slow"}) is None  # not a choice
    assert space.sample_of({"max-num-seqs": 32}) is None  # missing
    assert space.sample_of({"max-num-seqs": 32, "mode": "fast", "x": 1}) is None  # extra
    assert space.sample_of({"max_num_seqs": 32, "mode": "fast"}) is not None  # a_b == a-b


def test_when_and_exclude_forbid_sampled_points() -> None:
    space = space_of(
        "  grid:\n"
        "    budget: {low: 2, high: 16, step: 2}\n"
        "    topk: [1, 2, 4, 8]\n"
        "  exclude: [{topk: 8, budget: 16}]\n"
        "  when: [topk <= budget]\n"
    )
    allowed = space.allowed()
    assert {c.fingerprint for c in allowed} == {
        c.fingerprint for c in space.configs() if space.forbidden(c) is None
    }
    assert all(c.params["topk"] <= c.params["budget"] for c in allowed)
    assert not any(c.params == {"budget": 16, "topk": 8} for c in allowed)
    assert space.forbidden(ServerConfig.of({"budget": 2, "topk": 4})) == "removed by params.when"
    excluded = ServerConfig.of({"budget": 16, "topk": 8})
    assert space.forbidden(excluded) == "excluded by params.exclude"
    # when removes (2, 4), (2, 8), (4, 8), (6, 8); exclude removes (16, 8)
    assert len(allowed) == 8 * 4 - 4 - 1


def test_points_come_with_the_space() -> None:
    space = space_of(
        "  grid:\n    topk: [1, 2]\n  points:\n    - {topk: 2}\n    - {topk: 4, window: 2048}\n",
        "{strategy: random}",
    )
    assert [dict(p.params) for p in space.points] == [{"topk": 2}, {"topk": 4, "window": 2048}]
    assert [dict(c.params) for c in space.allowed()] == [
        {"topk": 2},
        {"topk": 4, "window": 2048},
        {"topk": 1},
    ]


def test_search_defaults_depend_on_the_strategy() -> None:
    grid = load_sweep_text(HEAD).spec.search
    assert (grid.strategy, grid.pruning, grid.startup, grid.samples) == ("grid", False, 0, False)
    tpe = load_sweep_text(HEAD + "search: {strategy: tpe, trials: 5}\n").spec.search
    assert (tpe.pruning, tpe.startup, tpe.seed) == (True, 6, 0)
    off = load_sweep_text(HEAD + "search: {strategy: tpe, prune: false, startup_trials: 2}\n")
    assert (off.spec.search.pruning, off.spec.search.startup) == (False, 2)


def test_budget_alone_is_a_time_and_both_limits_are_kept() -> None:
    spec = load_sweep_text(HEAD + "search: {strategy: random, budget: 90m}\n").spec
    assert spec.search.budget is not None
    assert spec.search.budget.time == 5400.0
    both = load_sweep_text(HEAD + "search: {budget: {time: 6h, gpu_hours: 40}}\n").spec
    assert both.search.budget is not None
    assert (both.search.budget.time, both.search.budget.gpu_hours) == (21600.0, 40.0)


def test_a_sampled_search_has_no_fixed_list_of_configs() -> None:
    spec = load_sweep_text(HEAD + "params: {grid: {a: [1, 2]}}\nsearch: {strategy: tpe}\n").spec
    with pytest.raises(ConfigError, match="proposes configurations while it runs"):
        expand_configs(spec)


def test_objective_as_a_list_resolves_every_objective() -> None:
    spec = load_sweep_text(
        HEAD
        + "objective:\n"
        + "  - {maximize: output_throughput, workload: chat, concurrency: 8}\n"
        + "  - {minimize: chat.c1.ttft_p99_ms}\n"
        + "search: {strategy: nsga2, trials: 10}\n"
    ).spec
    assert len(spec.objectives) == 2
    assert [(str(r), d) for r, d in resolve_objectives(spec)] == [
        ("chat.c8.output_throughput", "max"),
        ("chat.c1.ttft_p99_ms", "min"),
    ]


def test_plan_of_a_search_shows_space_size_strategy_and_budget() -> None:
    spec = load_sweep_text(
        HEAD
        + "params:\n"
        + "  grid:\n"
        + "    max-num-seqs: {low: 16, high: 512, log: true}\n"
        + "    kv-cache-dtype: [auto, fp8]\n"
        + "  when: [max_num_seqs <= 256 or kv_cache_dtype == 'fp8']\n"
        + "search: {strategy: tpe, trials: 30, budget: {time: 6h, gpu_hours: 40}, seed: 3}\n"
    ).spec
    plan = build_plan(spec)
    assert plan.search is not None and plan.trials == ()
    assert plan.restarts == 30
    text = format_plan(plan)
    assert "a tpe search, at most 30 trials" in text
    assert "tpe (6 random configurations first), seed 3" in text
    assert "6h 00m of wall time or 40 GPU-hours, whichever comes first" in text
    assert "search space: 994 configurations, 738 allowed by exclude/when" in text
    assert "max-num-seqs    int range    16..512 log" in text
    assert "kv-cache-dtype  categorical  ['auto', 'fp8']" in text
    assert "server starts: at most 30" in text
