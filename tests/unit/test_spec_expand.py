"""Expansion of params into server configs: grid, points, zip, exclude, when, dedup."""

from __future__ import annotations

from typing import Any

import pytest

from servesweep.errors import ConfigError
from servesweep.models import fingerprint
from servesweep.spec import SweepSpec, expand_configs, load_sweep_text
from servesweep.spec.expand import expand_params


def spec_with(params: dict[str, Any]) -> SweepSpec:
    return SweepSpec.model_validate(
        {
            "name": "t",
            "server": {"engine": "sim"},
            "params": params,
            "workloads": [{"name": "chat"}],
        }
    )


def configs(params: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(c.params) for c in expand_configs(spec_with(params))]


def test_grid_product_in_written_order_last_key_fastest() -> None:
    got = configs({"grid": {"budget": [8, 12], "topk": [4, 6, 8]}})
    assert got == [
        {"budget": 8, "topk": 4},
        {"budget": 8, "topk": 6},
        {"budget": 8, "topk": 8},
        {"budget": 12, "topk": 4},
        {"budget": 12, "topk": 6},
        {"budget": 12, "topk": 8},
    ]


def test_key_order_of_the_grid_decides_which_varies_fastest() -> None:
    got = configs({"grid": {"topk": [4, 6], "budget": [8, 12]}})
    assert [c["budget"] for c in got] == [8, 12, 8, 12]
    assert list(got[0]) == ["topk", "budget"]


def test_no_params_is_one_default_config() -> None:
    got = expand_configs(spec_with({}))
    assert len(got) == 1
    assert dict(got[0].params) == {}
    assert got[0].label() == "(defaults)"


def test_points_follow_the_grid() -> None:
    got = configs({"grid": {"budget": [8]}, "points": [{"budget": 16, "window": 2048}, {}]})
    assert got == [{"budget": 8}, {"budget": 16, "window": 2048}, {}]


def test_points_alone() -> None:
    assert configs({"points": [{"a": 1}, {"a": 2, "b": True}]}) == [{"a": 1}, {"a": 2, "b": True}]


def test_zip_alone_pairs_values() -> None:
    got = configs({"zip": {"budget": [8, 16], "window": [1024, 2048]}})
    assert got == [{"budget": 8, "window": 1024}, {"budget": 16, "window": 2048}]


def test_grid_times_zip() -> None:
    got = configs({"grid": {"tp": [4, 8]}, "zip": {"budget": [8, 16], "window": [1, 2]}})
    assert got == [
        {"tp": 4, "budget": 8, "window": 1},
        {"tp": 4, "budget": 16, "window": 2},
        {"tp": 8, "budget": 8, "window": 1},
        {"tp": 8, "budget": 16, "window": 2},
    ]


def test_exclude_matches_when_all_keys_match_dash_underscore_blind() -> None:
    got = configs(
        {
            "grid": {"num-draft-tokens": [4, 8], "eagle_topk": [4, 6]},
            "exclude": [{"num_draft_tokens": 4, "eagle-topk": 6}],
        }
    )
    assert {"num-draft-tokens": 4, "eagle_topk": 6} not in got
    assert len(got) == 3


def test_exclusion_with_one_key_removes_every_match() -> None:
    got = configs({"grid": {"a": [1, 2], "b": [1, 2]}, "exclude": [{"a": 1}]})
    assert got == [{"a": 2, "b": 1}, {"a": 2, "b": 2}]


def test_exclude_does_not_confuse_true_with_one() -> None:
    got = configs({"grid": {"a": [1, True]}, "exclude": [{"a": True}]})
    assert got == [{"a": 1}]


def test_exclude_does_not_match_a_point_without_the_key() -> None:
    got = configs({"grid": {"a": [1]}, "points": [{"b": 1}], "exclude": [{"a": 1}]})
    assert got == [{"b": 1}]


def test_when_filters_with_underscored_names() -> None:
    got = configs(
        {
            "grid": {"speculative-num-draft-tokens": [4, 8], "speculative-eagle-topk": [4, 6]},
            "when": ["speculative_eagle_topk <= speculative_num_draft_tokens"],
        }
    )
    assert got == [
        {"speculative-num-draft-tokens": 4, "speculative-eagle-topk": 4},
        {"speculative-num-draft-tokens": 8, "speculative-eagle-topk": 4},
        {"speculative-num-draft-tokens": 8, "speculative-eagle-topk": 6},
    ]


def test_every_when_must_hold() -> None:
    got = configs({"grid": {"a": [1, 2, 3]}, "when": ["a > 1", "a != 3"]})
    assert got == [{"a": 2}]


def test_when_names_a_param_some_config_lacks() -> None:
    with pytest.raises(ConfigError) as info:
        configs({"grid": {"a": [1]}, "points": [{"b": 2}], "when": ["a > 0"]})
    assert info.value.key == "params.when.0"
    assert "{b=2}" in info.value.message


def test_duplicates_are_dropped_first_kept() -> None:
    got = expand_configs(
        spec_with({"grid": {"a-b": [1, 2]}, "points": [{"a_b": 1}, {"c": 1}, {"c": 1.0}]})
    )
    assert [dict(c.params) for c in got] == [{"a-b": 1}, {"a-b": 2}, {"c": 1}]


def test_expansion_counts_what_each_step_removed() -> None:
    spec = spec_with(
        {
            "grid": {"a": [1, 2, 3, 4]},
            "points": [{"a": 4}],
            "exclude": [{"a": 1}],
            "when": ["a != 2"],
        }
    )
    expansion = expand_params(spec.params)
    assert [dict(c.params) for c in expansion.configs] == [{"a": 3}, {"a": 4}]
    assert (expansion.candidates, expansion.excluded, expansion.filtered) == (5, 1, 1)
    assert expansion.duplicates == 1


def test_fingerprint_is_stable_under_key_order_and_spelling() -> None:
    first = fingerprint({"speculative-eagle-topk": 4, "speculative-num-draft-tokens": 8})
    second = fingerprint({"speculative_num_draft_tokens": 8, "speculative_eagle_topk": 4})
    third = fingerprint({"speculative-num-draft-tokens": 8.0, "speculative-eagle-topk": 4})
    assert first == second == third
    assert first != fingerprint({"speculative-eagle-topk": 6, "speculative-num-draft-tokens": 8})


def test_fingerprints_of_a_file_do_not_depend_on_how_it_is_written() -> None:
    base = "name: t\nserver: {engine: sim}\nworkloads: [{name: chat}]\n"
    one = load_sweep_text(base + "params: {grid: {a-b: [1, 2], c: [x]}}\n")
    two = load_sweep_text(base + "params:\n  grid:\n    c: [x]\n    a_b: [1, 2]\n")
    fps_one = {c.fingerprint for c in expand_configs(one.spec)}
    fps_two = {c.fingerprint for c in expand_configs(two.spec)}
    assert fps_one == fps_two
    assert len(fps_one) == 2


def test_list_and_mapping_values_are_params_too() -> None:
    got = configs({"grid": {"cuda-graph-sizes": [[1, 2, 4], [8]], "cfg": [{"x": 1}]}})
    assert got[0] == {"cuda-graph-sizes": [1, 2, 4], "cfg": {"x": 1}}
    assert len(got) == 2


def test_errors_carry_their_key_without_a_file() -> None:
    with pytest.raises(ConfigError) as info:
        configs({"zip": {"a": [1, 2], "b": [1]}})
    assert info.value.key == "params.zip.b"
    assert info.value.file is None
