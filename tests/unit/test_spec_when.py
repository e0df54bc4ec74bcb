"""The safe ``when`` evaluator: what it computes and what it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from servesweep.errors import ConfigError
from servesweep.spec import compile_when


def holds(text: str, **params: Any) -> bool:
    return compile_when(text, frozenset(params)).evaluate(params)


@pytest.mark.parametrize(
    ("text", "params", "expected"),
    [
        ("topk <= budget", {"topk": 4, "budget": 8}, True),
        ("topk <= budget", {"topk": 8, "budget": 4}, False),
        ("1 < topk < budget", {"topk": 4, "budget": 8}, True),
        ("1 < topk < budget", {"topk": 8, "budget": 8}, False),
        ("topk in [4, 6]", {"topk": 6}, True),
        ("topk not in (4, 6)", {"topk": 6}, False),
        ("mode == 'fast' or budget > 8", {"mode": "slow", "budget": 12}, True),
        ("not (mode == 'fast') and budget > 8", {"mode": "fast", "budget": 12}, False),
        ("budget % topk == 0", {"budget": 12, "topk": 4}, True),
        ("budget // topk * topk + 1 - 1 == budget", {"budget": 13, "topk": 4}, False),
        ("budget / topk >= 2.5", {"budget": 10, "topk": 4}, True),
        ("-topk < 0", {"topk": 4}, True),
        ("flag == True", {"flag": True}, True),
        ("flag == 1", {"flag": True}, False),
        ("x == None", {"x": None}, True),
        ("enable", {"enable": False}, False),
    ],
)
def test_evaluates(text: str, params: dict[str, Any], expected: bool) -> None:
    assert holds(text, **params) is expected


def test_dashed_and_dotted_params_are_written_with_underscores() -> None:
    expr = compile_when(
        "speculative_eagle_topk <= env_NUM", frozenset({"speculative-eagle-topk"}) | {"env.NUM"}
    )
    assert expr.evaluate({"speculative-eagle-topk": 4, "env.NUM": 8})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("__import__('os').system('id')", "function calls"),
        ("topk.real > 1", "attribute access"),
        ("topk[0] > 1", "subscripts"),
        ("(lambda: 1)()", "function calls"),
        ("(lambda: 1) == 1", "lambdas"),
        ("topk ** 2 > 1", "'**'"),
        ("[x for x in topk]", "comprehensions"),
        ("topk is None", "'is'"),
        ("topk if topk else 1", "'x if c else y'"),
        ("topk in budget", "[list] literal"),
        ("[topk] == [1]", "a list outside"),
        ("{'a': 1} == topk", "dict literals"),
        ("~topk", "'~'"),
        ("topk <<", "invalid when expression"),
        ("", "empty when expression"),
    ],
)
def test_refuses(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        compile_when(text, frozenset({"topk", "budget", "x"}))
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_name_is_refused_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match="did you mean 'topk'"):
        compile_when("top_k < 4", frozenset({"topk"}))


def test_string_arithmetic_is_refused_at_evaluation() -> None:
    expr = compile_when("mode * 100000000 == 'x'", frozenset({"mode"}))
    with pytest.raises(ConfigError, match="needs numbers"):
        expr.evaluate({"mode": "fast"})


def test_incomparable_values_are_a_config_error() -> None:
    expr = compile_when("mode < 3", frozenset({"mode"}))
    with pytest.raises(ConfigError, match="cannot be computed for the config"):
        expr.evaluate({"mode": "fast"})


def test_division_by_zero_is_a_config_error() -> None:
    expr = compile_when("a / b > 1", frozenset({"a", "b"}))
    with pytest.raises(ConfigError, match="division by zero"):
        expr.evaluate({"a": 1, "b": 0})


def test_names_are_recorded() -> None:
    assert compile_when("a < b and c in [1]").names == frozenset({"a", "b", "c"})
