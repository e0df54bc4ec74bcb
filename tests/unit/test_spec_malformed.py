"""Every malformed sweep file gives one clear line: file, line, key, what is wrong.

One YAML file per mistake lives in tests/unit/malformed/; this table says what the
error must name. ``line`` None means the line cannot be known (a key that is
missing, an empty file).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from servesweep.errors import ConfigError
from servesweep.spec import load_sweep, load_sweep_text

MALFORMED = Path(__file__).parent / "malformed"


class Case(NamedTuple):
    file: str
    key: str | None
    line: int | None
    fragment: str


CASES = [
    # YAML itself
    Case("yaml_mapping_value_misplaced", None, 4, "mapping values are not allowed"),
    Case("yaml_tab_indentation", None, 3, "not tabs"),
    Case("yaml_unclosed_flow_list", None, 7, "expected ',' or ']'"),
    Case("yaml_unclosed_quote", None, 9, "it starts on line 1"),
    Case("yaml_two_documents", None, 9, "expected a single document"),
    Case("yaml_python_tag", None, 9, "YAML tag '!!python/object/apply:os.system' is not allowed"),
    Case("yaml_alias_bomb", None, 6, "aliases expanded"),
    Case("not_utf8", None, 9, "not UTF-8 text (byte 0xe9)"),
    Case("empty_file", None, None, "the sweep file is empty"),
    Case("top_level_list", None, 1, "the top level must be a mapping"),
    Case("top_level_scalar", None, 1, "got a string ('just some text')"),
    Case("duplicate_top_level_key", "workloads", 9, "duplicate key (first written on line 6)"),
    Case("duplicate_server_key", "server.port", 5, "duplicate key (first written on line 4)"),
    # unknown and missing keys
    Case("unknown_top_level_key_typo", "workload", 6, "did you mean 'workloads'?"),
    Case("unknown_key_in_wrong_section", "timeouts", 9, "it belongs under 'server'"),
    Case("unknown_server_key_typo", "server.timeout", 6, "did you mean 'timeouts'?"),
    Case("unknown_timeouts_key", "server.timeouts.readiness", 7, "known keys: stop, kill"),
    Case("unknown_workload_key_typo", "workloads.0.max_token", 9, "did you mean 'max_tokens'?"),
    Case("params_unknown_section", "params.grids", 7, "did you mean 'grid'?"),
    Case("missing_name", "name", None, "missing required key"),
    Case("missing_server", "server", None, "missing required key"),
    Case("missing_engine", "server.engine", 2, "missing required key"),
    Case("workloads_missing", "workloads", None, "missing required key"),
    Case("workload_missing_name", "workloads.0.name", 7, "missing required key"),
    # wrong types, bad values, out of range
    Case("unknown_engine", "server.engine", 3, "'vlm' is not one of 'vllm'"),
    Case("launcher_unknown", "server.launcher", 6, "'kubernetes' is not one of"),
    Case("port_not_a_number", "server.port", 5, "expected an integer, got a string ('http')"),
    Case("port_out_of_range", "server.port", 5, "out of range: 70000 (must be <= 65535)"),
    Case("gpus_not_a_list", "server.gpus", 6, "expected a list"),
    Case("gpus_duplicate_index", "server.gpus", 6, "GPU indexes must be unique"),
    Case("args_not_a_mapping", "server.args", 6, "expected a mapping (key: value), got a list"),
    Case(
        "duration_in_words",
        "server.timeouts.release",
        8,
        "not a duration: '5 minutes' (use seconds or e.g. '30s', '5m', '1h30m')",
    ),
    Case("duration_negative", "server.timeouts.ready", 7, "duration must not be negative"),
    Case("size_unknown_unit", "server.release.tolerance", 7, "not a size: '512 bananas'"),
    Case("release_foreign_holders_bad_choice", "server.release.foreign_holders", 7, "'ignore'"),
    Case("sweep_name_with_spaces", "name", 1, "not a valid name: 'my sweep'"),
    Case("workload_bad_name", "workloads.0.name", 7, "not a valid name: 'my chat'"),
    Case("workload_concurrency_zero", "workloads.0.concurrency.0", 8, "must be >= 1"),
    Case("workload_error_rate_over_one", "workloads.0.max_error_rate", 9, "must be <= 1"),
    Case("workload_requests_not_int", "workloads.0.requests", 9, "expected an integer"),
    Case("workload_endpoint_bad_choice", "workloads.0.endpoint", 9, "'responses' is not one of"),
    Case("eval_samples_zero", "workloads.1.eval.samples", 10, "out of range: 0 (must be >= 1)"),
    Case("eval_allow_no_netns", "workloads.1.eval", 10, "replaced by eval.sandbox"),
    Case("constraint_not_a_string", "constraints.0", 10, "expected a string, got a mapping"),
    # launcher sections
    Case("launcher_systemd_without_section", "server", 2, "needs a 'systemd: {unit: ...}' section"),
    Case("launcher_docker_without_section", "server", 2, "needs a 'docker: {image: ...}' section"),
    Case("launcher_command_without_section", "server", 2, "needs a 'commands: {start: ...}'"),
    Case("engine_generic_without_command", "server", 2, "engine 'generic' needs 'command'"),
    # params
    Case("grid_empty_list", "params.grid.budget", 9, "empty list"),
    Case("grid_value_not_a_list", "params.grid.topk", 8, "expected a list"),
    Case("grid_dash_underscore_collision", "params.grid.eagle_topk", 9, "is the same as"),
    Case("grid_too_large", "params", 6, "expand to 1000000 configs"),
    Case("zip_unequal_lengths", "params.zip.topk", 9, "'topk' has 2 values, 'budget' has 3"),
    Case("zip_param_also_in_grid", "params.zip.budget", 10, "both in grid and in zip"),
    Case("exclude_unknown_param", "params.exclude.0.top-k", 11, "did you mean 'topk'?"),
    Case("exclude_empty_mapping", "params.exclude.0", 10, "would remove every config"),
    Case("exclude_removes_everything", "params", 6, "1 by 'exclude'"),
    Case("when_syntax_error", "params.when.0", 11, "invalid when expression 'topk <='"),
    Case("when_function_call", "params.when.0", 10, "function calls not allowed"),
    Case("when_attribute_access", "params.when.0", 10, "attribute access not allowed"),
    Case("when_unknown_param", "params.when.0", 11, "did you mean 'speculative_eagle_topk'?"),
    Case("when_param_missing_from_point", "params.when.0", 13, "the config {budget=16}"),
    Case("when_string_arithmetic", "params.when.0", 10, "'*' needs numbers, got 'fast'"),
    Case("when_removes_everything", "params", 6, "2 by 'when'"),
    # workloads
    Case("workloads_empty", "workloads", 6, "must not be empty"),
    Case("workload_duplicate_name", "workloads.1.name", 9, "duplicate workload name 'chat'"),
    Case("workload_concurrency_and_rate", "workloads.0", 7, "either 'concurrency' or 'rate'"),
    Case(
        "workload_slo_unknown",
        "workloads.0.slo",
        7,
        "unknown SLO 'ttf_ms' (did you mean 'ttft_ms'?",
    ),
    Case("workload_duplicate_level", "workloads.0.concurrency", 8, "level 8 is listed twice"),
    # objective and constraints
    Case("objective_both_directions", "objective", 9, "exactly one of 'maximize' or 'minimize'"),
    Case("objective_unknown_metric", "objective.maximize", 10, "unknown metric 'throughput'"),
    Case("objective_unknown_workload", "objective.workload", 11, "unknown workload 'coding'"),
    Case("objective_level_not_measured", "objective.concurrency", 11, "no level 'c4'"),
    Case("objective_full_ref_unknown_level", "objective.minimize", 10, "no level 'c2'"),
    Case("constraint_unknown_workload", "constraints.0", 10, "unknown workload 'chats'"),
    Case("constraint_unknown_level", "constraints.0", 10, "no level 'c4' (levels: c1, c8)"),
    Case("constraint_unknown_metric", "constraints.0", 10, "did you mean 'ttft_p99_ms'?"),
    Case("constraint_bad_syntax", "constraints.0", 10, "use 'REF OP NUMBER'"),
    Case("constraint_value_with_unit", "constraints.0", 10, "not a number: '500ms'"),
    Case("constraint_level_ambiguous", "constraints.1", 11, "has 2 levels (c1, c8)"),
    Case("constraint_eval_with_level", "constraints.0", 12, "has no load levels"),
]


def test_every_malformed_file_has_a_case() -> None:
    files = {p.stem for p in MALFORMED.glob("*.yaml")}
    cases = [c.file for c in CASES]
    assert len(cases) == len(set(cases))
    assert files == set(cases)
    assert len(files) >= 35


@pytest.mark.parametrize("case", CASES, ids=[c.file for c in CASES])
def test_malformed_file_gives_one_clear_line(case: Case) -> None:
    path = MALFORMED / f"{case.file}.yaml"
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    err = info.value
    text = str(err)
    assert "\n" not in text
    assert "Traceback" not in text
    assert "pydantic" not in text.lower()
    assert "validation error" not in text.lower()
    assert err.file == str(path)
    assert text.startswith(str(path))
    assert err.line == case.line
    if case.line is not None:
        assert text.startswith(f"{path}:{case.line}: ")
    assert err.key == case.key
    if case.key is not None:
        assert f": {case.key}: " in text
    assert case.fragment in err.message
    assert err.__cause__ is None or isinstance(err.__cause__, ConfigError)


@pytest.mark.parametrize("case", CASES[:5], ids=[c.file for c in CASES[:5]])
def test_text_errors_name_the_given_file(case: Case) -> None:
    text = (MALFORMED / f"{case.file}.yaml").read_text()
    with pytest.raises(ConfigError) as info:
        load_sweep_text(text, name="inline.yaml")
    assert str(info.value).startswith(f"inline.yaml:{case.line}: ")


def test_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found") as info:
        load_sweep(tmp_path / "nope.yaml")
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: file not found"


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_sweep(tmp_path)


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secret.yaml"
    path.write_text("name: x\n")

    def refuse(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    assert str(info.value) == f"{path}: permission denied: cannot read the file"


def test_file_too_large(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_bytes(b"#" * (4 * 2**20 + 1))
    with pytest.raises(ConfigError, match="a sweep file is at most"):
        load_sweep(path)


def test_recursive_alias_is_refused() -> None:
    with pytest.raises(ConfigError, match="recursive YAML alias"):
        load_sweep_text("a: &a [1, *a]\n", name="r.yaml")


def test_deep_nesting_is_refused() -> None:
    text = "name: x\nserver: {engine: vllm}\ndescription: " + "[" * 1200 + "]" * 1200 + "\n"
    with pytest.raises(ConfigError) as info:
        load_sweep_text(text, name="deep.yaml")
    assert "\n" not in str(info.value)


def test_several_problems_are_counted_on_one_line() -> None:
    text = "name: x\nserver: {engine: vllm, port: zero}\nworkloads: [{name: a, requests: many}]\n"
    with pytest.raises(ConfigError) as info:
        load_sweep_text(text, name="two.yaml")
    assert str(info.value) == (
        "two.yaml:2: server.port: expected an integer, got a string ('zero') (and 1 more problem)"
    )


@pytest.mark.parametrize("tag", ["!!set {a, b}", "!!binary aGVsbG8=", "!!omap [{a: 1}]"])
def test_non_plain_yaml_values_are_refused(tag: str) -> None:
    head = "name: x\nserver: {engine: sim}\nworkloads: [{name: a}]\n"
    text = head + "params: {grid: {x: [" + tag + "]}}\n"
    with pytest.raises(ConfigError) as info:
        load_sweep_text(text, name="t.yaml")
    assert str(info.value).startswith("t.yaml:4: YAML tag '!!")


def test_python_built_spec_with_odd_values_is_a_config_error() -> None:
    from servesweep.spec import SweepSpec, expand_configs

    spec = SweepSpec.model_validate(
        {
            "name": "x",
            "server": {"engine": "sim"},
            "workloads": [{"name": "a"}],
            "params": {"points": [{"x": [{1, 2}]}]},
        }
    )
    with pytest.raises(ConfigError, match="not plain data"):
        expand_configs(spec)


def test_control_characters_in_keys_and_names_stay_on_one_line() -> None:
    head = "name: x\nserver: {engine: sim}\nworkloads: [{name: a}]\n"
    with pytest.raises(ConfigError) as info:
        load_sweep_text(head + '"foo\\nbar": 1\n', name="a\nb.yaml")
    assert str(info.value).startswith("a\\nb.yaml:4: foo\\nbar: unknown key")
    assert "\n" not in str(info.value)


def test_mutated_files_load_or_fail_with_one_line() -> None:
    """Random edits of valid files (seeded, bounded) never escape as another exception."""
    import random

    from servesweep.spec import build_plan, format_plan

    valid = (MALFORMED.parent / "test_spec_load.py").read_text()
    start = valid.index('ISSUE_EXAMPLE = """\\\n') + len('ISSUE_EXAMPLE = """\\\n')
    seed_text = valid[start : valid.index('"""', start)]
    rng = random.Random(20261129)
    tokens = [*" :-[]{},'\"#\n\t&*!|>?%@`0123456789._xyz", "null", ".nan", "{}", "[]", "<<: *a"]
    loaded = 0
    for _ in range(300):
        text = seed_text
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(text))
            if rng.random() < 0.5:
                text = text[:pos] + text[pos + rng.randint(1, 4) :]
            else:
                text = text[:pos] + rng.choice(tokens) + text[pos:]
        try:
            plan = build_plan(load_sweep_text(text, name="m.yaml").spec)
        except ConfigError as exc:
            assert "\n" not in str(exc)
            assert str(exc).startswith("m.yaml")
        else:
            assert format_plan(plan)
            loaded += 1
    assert 0 < loaded < 300
