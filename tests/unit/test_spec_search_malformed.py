"""Mistakes in the search parts of a sweep file (ranges, ``search``, objectives as a
list, ``capacity``): each one clear line naming the file, the line and the key.

One YAML file per mistake lives in tests/unit/malformed_search/."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from servesweep.cli.main import main
from servesweep.errors import ConfigError
from servesweep.spec import load_sweep

MALFORMED = Path(__file__).parent / "malformed_search"


class Case(NamedTuple):
    file: str
    key: str
    line: int
    fragment: str


CASES = [
    # ranges
    Case(
        "range_low_above_high",
        "params.grid.gpu-memory-utilization",
        8,
        "low 0.95 is above high 0.8",
    ),
    Case(
        "range_step_not_dividing",
        "params.grid.max-num-batched-tokens",
        8,
        "step 1024 does not divide the range 1024..8000 (8000 - 1024 = 6976); "
        "use high: 7168 or high: 8192",
    ),
    Case("range_log_non_positive", "params.grid.swap-space", 8, "log: true needs low > 0 (got 0)"),
    Case("range_bound_not_a_number", "params.grid.swap-space.high", 8, "expected a number"),
    Case("range_typo_in_key", "params.grid.swap-space.hihg", 8, "did you mean 'high'?"),
    Case(
        "range_in_a_grid_search",
        "params.grid.max-num-batched-tokens",
        8,
        "needs a sampling search: add 'search: {strategy: tpe, trials: N}' (or random), "
        "or list the values",
    ),
    # the search section
    Case(
        "search_unknown_strategy",
        "search.strategy",
        11,
        "'bayesian' is not one of 'grid', 'random', 'tpe' or 'nsga2'",
    ),
    Case("search_nsga2_one_objective", "search.strategy", 12, "nsga2 is a Pareto search"),
    Case("search_budget_not_a_duration", "search.budget.time", 12, "not a duration: 'six hours'"),
    Case(
        "search_budget_alone_not_a_duration",
        "search.budget",
        12,
        "not a duration: 'overnight' (write e.g. budget: 6h",
    ),
    Case(
        "search_budget_gpu_hours_not_a_number",
        "search.budget.gpu_hours",
        12,
        "not a number of GPU-hours: '40h'",
    ),
    Case("search_continuous_without_limit", "search", 11, "give 'trials' or 'budget'"),
    Case(
        "search_space_all_forbidden", "params", 5, "the search space has no allowed configuration"
    ),
    # objectives as a list
    Case("objective_list_item_typo", "objective.1.minimise", 12, "did you mean 'minimize'?"),
    Case("objective_list_same_metric_twice", "objective.1", 12, "is already an objective"),
    # capacity
    Case("capacity_with_levels", "workloads.0", 9, "drop 'concurrency'"),
    Case("capacity_unknown_slo", "workloads.0.capacity.slo", 11, "did you mean 'ttft_ms'?"),
    Case("capacity_high_not_above_low", "workloads.0.capacity", 10, "high 4 must be above low 8"),
    Case("capacity_fractional_concurrency", "workloads.0.capacity", 10, "a whole number >= 1"),
    Case("capacity_objective_with_level", "objective.rate", 11, "has no load levels"),
    Case(
        "capacity_constraint_on_a_level",
        "constraints.0",
        12,
        "'ttft_p99_ms' is not a metric of capacity workload 'cap'",
    ),
]


def test_every_file_has_a_case() -> None:
    assert {p.stem for p in MALFORMED.glob("*.yaml")} == {c.file for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.file for c in CASES])
def test_mistake_gives_one_line_with_file_line_and_key(case: Case) -> None:
    path = MALFORMED / f"{case.file}.yaml"
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    err = info.value
    text = str(err)
    assert "\n" not in text
    assert "~" not in text  # no union tag leaks into a key or message
    assert text.startswith(f"{path}:{case.line}: {case.key}: "), text
    assert case.fragment in err.message, err.message


@pytest.mark.parametrize("case", CASES, ids=[c.file for c in CASES])
def test_plan_exits_2_with_the_line(capsys: pytest.CaptureFixture[str], case: Case) -> None:
    path = MALFORMED / f"{case.file}.yaml"
    with pytest.raises(SystemExit) as info:
        main(["plan", str(path)])
    _, err = capsys.readouterr()
    assert info.value.code == 2
    assert "Traceback" not in err
    assert err.strip().splitlines() == [err.strip()]
    assert f"{path}:{case.line}: {case.key}: " in err
