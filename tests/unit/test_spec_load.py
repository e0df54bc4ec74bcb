"""Loading valid sweep files: the issue's example and its variations, line numbers,
hashes, durations and sizes."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

import servesweep.spec as spec_pkg
from servesweep.errors import ConfigError
from servesweep.spec import (
    LoadedSweep,
    build_plan,
    expand_configs,
    load_sweep,
    load_sweep_text,
    parse_duration,
    parse_size,
)

ISSUE_EXAMPLE = """\
name: ddtree-budget
server: {engine: sglang, launcher: subprocess, model: /models/kimi, port: 30000, gpus: [0,1,2,3,4,5,6,7],
         args: {tp-size: 8, speculative-algorithm: DFLASH}, timeouts: {release: 5m, ready: 15m}}
params:
  grid: {speculative-num-draft-tokens: [4, 8, 12, 16], speculative-eagle-topk: [4, 6]}
  exclude: [{speculative-num-draft-tokens: 4, speculative-eagle-topk: 6}]
workloads:
  - {name: chat, dataset: builtin:chat, concurrency: [1, 8], requests: 64, max_tokens: 256}
objective: {maximize: output_throughput, workload: chat, concurrency: 1}
constraints: ["chat.c1.ttft_p99_ms < 500"]
"""  # noqa: E501

BLOCK_STYLE = """\
name: ddtree-window
description: draft budget against sliding window
server:
  engine: vllm
  model: /models/llama
  port: 8001
  gpus: [0, 1]
  env: {CUDA_DEVICE_MAX_CONNECTIONS: "1"}
  timeouts:
    stop: 45s
    release: 2m30s
    ready: 1h
  release:
    tolerance: 1GiB
    settle: 500ms
params:
  grid:
    tensor-parallel-size: [1, 2]
  zip:
    num_speculative_tokens: [4, 8]
    window: [1024, 2048]
  points:
    - {tensor-parallel-size: 2, num_speculative_tokens: 16, window: 4096}
  when:
    - num_speculative_tokens * tensor_parallel_size <= 16
workloads:
  - name: chat
    concurrency: [1, 4]
    requests: 32
  - name: open
    dataset: synthetic
    input_tokens: 512
    rate: [2.5]
    duration: 1m
  - name: coding
    eval: {suite: builtin:coding, limit: 5}
objective:
  minimize: open.r2.5.ttft_p99_ms
constraints:
  - coding.pass_rate >= 0.8
  - chat.c4.error_rate == 0
  - load_s < 600
"""


def test_issue_example_loads() -> None:
    loaded = load_sweep_text(ISSUE_EXAMPLE, name="ddtree.yaml")
    spec = loaded.spec
    assert spec.name == "ddtree-budget"
    assert spec.server.timeouts.release == 300.0
    assert spec.server.timeouts.ready == 900.0
    assert spec.server.gpus == list(range(8))
    configs = expand_configs(spec)
    assert len(configs) == 7
    assert {"speculative-num-draft-tokens": 4, "speculative-eagle-topk": 6} not in [
        dict(c.params) for c in configs
    ]


def test_block_style_with_zip_points_and_when_loads(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(BLOCK_STYLE)
    loaded = load_sweep(path)
    assert loaded.path == path
    assert loaded.name == str(path)
    spec = loaded.spec
    assert spec.server.timeouts.release == 150.0
    assert spec.server.timeouts.stop == 45.0
    assert spec.server.release.tolerance == 2**30
    assert spec.server.release.settle == 0.5
    assert spec.workloads[1].duration == 60.0
    got = [dict(c.params) for c in expand_configs(spec)]
    assert got == [
        {"tensor-parallel-size": 1, "num_speculative_tokens": 4, "window": 1024},
        {"tensor-parallel-size": 1, "num_speculative_tokens": 8, "window": 2048},
        {"tensor-parallel-size": 2, "num_speculative_tokens": 4, "window": 1024},
        {"tensor-parallel-size": 2, "num_speculative_tokens": 8, "window": 2048},
    ]


def test_lines_map_key_paths_to_lines() -> None:
    loaded = load_sweep_text(BLOCK_STYLE)
    assert loaded.lines["name"] == 1
    assert loaded.lines["server.timeouts.release"] == 11
    assert loaded.lines["params.zip.window"] == 21
    assert loaded.lines["params.points.0.window"] == 23
    assert loaded.lines["params.when.0"] == 25
    assert loaded.lines["workloads.1"] == 30
    assert loaded.lines["workloads.1.rate"] == 33
    assert loaded.lines["constraints.2"] == 42
    assert loaded.line_of("workloads.1.rate.0") == 33
    assert loaded.line_of("server.timeouts.kill") == 9
    assert loaded.line_of("nothing.here") is None


def test_loaded_sweep_is_frozen_and_hashes_the_text() -> None:
    loaded = load_sweep_text(ISSUE_EXAMPLE)
    assert loaded.spec_hash == hashlib.sha256(ISSUE_EXAMPLE.encode()).hexdigest()
    assert loaded.text == ISSUE_EXAMPLE
    assert loaded.path is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.text = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        loaded.lines["name"] = 3  # type: ignore[index]
    assert isinstance(loaded, LoadedSweep)


def test_error_helper_names_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(BLOCK_STYLE)
    loaded = load_sweep(path)
    err = loaded.error("GPU 7 does not exist", key="server.gpus")
    assert str(err) == f"{path}:7: server.gpus: GPU 7 does not exist"


def test_dates_stay_strings_and_bom_is_ignored() -> None:
    text = "\ufeff" + ISSUE_EXAMPLE.replace("params:", "description: 2024-01-01\nparams:")
    loaded = load_sweep_text(text)
    assert loaded.spec.description == "2024-01-01"


def test_minimal_file_has_one_default_config_and_defaults() -> None:
    loaded = load_sweep_text("name: x\nserver: {engine: sim}\nworkloads: [{name: chat}]\n")
    assert [dict(c.params) for c in expand_configs(loaded.spec)] == [{}]
    workload = loaded.spec.workloads[0]
    assert workload.concurrency == [1]
    assert workload.requests == 32


def test_yaml_anchors_merge_keys_and_x_keys() -> None:
    text = (
        "name: x\nserver: {engine: sim}\n"
        "x-defaults: &d {requests: 8, max_tokens: 64}\n"
        "workloads:\n  - {<<: *d, name: a}\n  - {<<: *d, name: b, requests: 16}\n"
    )
    a, b = load_sweep_text(text).spec.workloads
    assert (a.requests, a.max_tokens, b.requests, b.max_tokens) == (8, 64, 16, 64)
    with pytest.raises(ConfigError, match="unknown key 'defaults'"):
        load_sweep_text(text.replace("x-defaults", "defaults"))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (30, 30.0),
        (1.5, 1.5),
        ("30", 30.0),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("250ms", 0.25),
        ("2d", 172800.0),
        (" 2.5s ", 2.5),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["5 minutes", "-5s", -1, "nan", float("nan"), "inf", True, "m5", ""]
)
def test_bad_durations(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [(1024, 1024), ("512MiB", 512 * 2**20), ("1GiB", 2**30), ("2GB", 2 * 10**9), ("1.5 kib", 1536)],
)
def test_sizes(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["512 bananas", "-1", -1, True, "GiB"])
def test_bad_sizes(text: object) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_public_api_is_pinned() -> None:
    assert sorted(spec_pkg.__all__) == sorted(
        [
            "CAPACITY_METRICS",
            "EVAL_METRICS",
            "LEVEL_METRICS",
            "TRIAL_METRICS",
            "CapacitySpec",
            "CapacityWorkload",
            "Constraint",
            "EvalWorkload",
            "LoadWorkload",
            "LoadedSweep",
            "MetricRef",
            "Objective",
            "ParamRange",
            "ParamsSpec",
            "Plan",
            "PlanTrial",
            "PlanWorkload",
            "SearchOutline",
            "SearchSpace",
            "SearchSpec",
            "ServerSpec",
            "SweepSpec",
            "WhenExpr",
            "WorkloadSpec",
            "build_plan",
            "build_space",
            "compile_when",
            "estimate_duration",
            "expand_configs",
            "format_duration",
            "format_plan",
            "load_sweep",
            "load_sweep_text",
            "objective_direction",
            "param_key",
            "parse_constraint",
            "parse_duration",
            "parse_metric_ref",
            "parse_size",
            "resolve_objective",
            "resolve_objectives",
            "validate_constraints",
            "validate_ref",
            "workload_levels",
            "workload_spec",
        ]
    )
    for name in spec_pkg.__all__:
        assert hasattr(spec_pkg, name)


def test_a_key_without_value_means_its_default() -> None:
    text = (
        "name: x\nserver: {engine: sim, args: , timeouts: {ready: }}\nparams:\n"
        "workloads: [{name: chat, requests: }]\n"
    )
    spec = load_sweep_text(text).spec
    assert spec.server.args == {}
    assert spec.server.timeouts.ready == 900.0
    assert spec.workloads[0].requests == 32
    assert len(expand_configs(spec)) == 1


def test_a_required_key_without_value_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_sweep_text("name:\nserver: {engine: sim}\nworkloads: [{name: a}]\n", name="e.yaml")
    assert str(info.value) == "e.yaml:1: name: has no value (expected a string)"


def test_a_single_when_or_constraint_may_be_a_string() -> None:
    text = (
        "name: x\nserver: {engine: sim}\nparams: {grid: {a: [1, 2]}, when: a > 1}\n"
        "workloads: [{name: chat}]\nconstraints: chat.c1.error_rate == 0\n"
    )
    spec = load_sweep_text(text).spec
    assert spec.params.when == ["a > 1"]
    assert spec.constraints == ["chat.c1.error_rate == 0"]
    assert [dict(c.params) for c in expand_configs(spec)] == [{"a": 2}]


DOC = Path(__file__).resolve().parents[2] / "docs" / "sweep-file.md"


def _doc_yaml_blocks() -> list[str]:
    import re

    return re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_every_complete_example_in_the_docs_loads() -> None:
    complete = [b for b in _doc_yaml_blocks() if b.startswith("name:")]
    assert len(complete) >= 2
    for block in complete:
        loaded = load_sweep_text(block, name="docs/sweep-file.md")
        if loaded.spec.search.samples:
            assert build_plan(loaded.spec).search is not None
        else:
            assert expand_configs(loaded.spec)


def test_doc_fragments_load_inside_a_sweep() -> None:
    head = "name: doc\nserver: {engine: sim}\n"
    wl = "workloads: [{name: chat, concurrency: [1, 8]}]\n"
    fragments = [b for b in _doc_yaml_blocks() if not b.startswith("name:")]
    for block in fragments:
        if block.startswith("params:"):
            search = "search: {strategy: tpe, trials: 10}\n" if "low:" in block else ""
            load_sweep_text(head + block + wl + search)
        elif block.startswith(
            ("search:", "workloads:", "decision:", "confirm:", "screening:", "cost:")
        ):
            load_sweep_text(head + block + ("" if block.startswith("workloads:") else wl))
        elif block.startswith("constraints:"):
            text = (
                head
                + block
                + (
                    "workloads: [{name: chat, concurrency: [1, 8]},"
                    " {name: coding, eval: {suite: builtin:coding}}]\n"
                )
            )
            load_sweep_text(text)
        elif block.startswith("x-chat:"):
            load_sweep_text(head + block)
        elif block.startswith("objective:\n"):  # a list of objectives
            wl32 = "workloads: [{name: chat, concurrency: [1, 8, 32]}]\n"
            load_sweep_text(head + wl32 + block)
        elif block.startswith("objective:"):
            for line in block.splitlines():
                load_sweep_text(head + wl + line + "\n")
        elif block.startswith("when:"):
            grid = (
                "params:\n  grid: {speculative-eagle-topk: [4], speculative-num-draft-tokens: [8],"
                " tensor-parallel-size: [8], data-parallel-size: [1], attention-backend: [fa3],"
                " enable-dp-attention: [false], speculative-num-steps: [4]}\n"
            )
            indented = "".join("  " + line + "\n" for line in block.splitlines())
            load_sweep_text(head + grid + indented + wl)
        else:
            raise AssertionError(f"a YAML block of the docs is not tested:\n{block}")


def test_a_single_level_may_be_written_without_a_list() -> None:
    text = (
        "name: x\nserver: {engine: sim}\n"
        "workloads: [{name: a, concurrency: 8}, {name: b, rate: 2.5}]\n"
    )
    a, b = load_sweep_text(text).spec.workloads
    assert (a.concurrency, b.rate) == ([8], [2.5])
