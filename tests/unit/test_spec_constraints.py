"""Metric references, constraints, the metric catalog and the objective."""

from __future__ import annotations

from typing import Any

import pytest

from servesweep.errors import ConfigError
from servesweep.spec import (
    EVAL_METRICS,
    LEVEL_METRICS,
    TRIAL_METRICS,
    MetricRef,
    SweepSpec,
    objective_direction,
    parse_constraint,
    parse_metric_ref,
    resolve_objective,
    validate_constraints,
    validate_ref,
)


def make_spec(**extra: Any) -> SweepSpec:
    data: dict[str, Any] = {
        "name": "t",
        "server": {"engine": "sim"},
        "workloads": [
            {"name": "chat", "concurrency": [1, 8]},
            {"name": "open", "rate": [2.5, 10]},
            {"name": "single", "concurrency": [4]},
            {"name": "coding", "eval": {"suite": "builtin:coding"}},
        ],
    }
    data.update(extra)
    return SweepSpec.model_validate(data)


@pytest.mark.parametrize(
    ("text", "workload", "level", "metric"),
    [
        ("chat.c1.ttft_p99_ms", "chat", "c1", "ttft_p99_ms"),
        ("chat.r2.5.output_throughput", "chat", "r2.5", "output_throughput"),
        ("chat.r2.50.output_throughput", "chat", "r2.5", "output_throughput"),
        ("chat.r10.goodput", "chat", "r10", "goodput"),
        ("chat.r0.25.goodput", "chat", "r0.25", "goodput"),
        ("chat.rinf.goodput", "chat", "rinf", "goodput"),
        ("my-chat.c08.error_rate", "my-chat", "c8", "error_rate"),
        ("coding.pass_rate", "coding", None, "pass_rate"),
        ("load_s", None, None, "load_s"),
        ("  chat.c1.itl_p90_ms ", "chat", "c1", "itl_p90_ms"),
        ("r2.ttft_p99_ms", "r2", None, "ttft_p99_ms"),
    ],
)
def test_parse_metric_ref(text: str, workload: str | None, level: str | None, metric: str) -> None:
    ref = parse_metric_ref(text)
    assert (ref.workload, ref.level, ref.metric) == (workload, level, metric)
    assert ref.text == text.strip()


def test_ref_key_is_canonical() -> None:
    assert parse_metric_ref("chat.r2.50.goodput").key == "chat.r2.5.goodput"
    assert str(parse_metric_ref("load_s")) == "load_s"


@pytest.mark.parametrize("text", ["", "chat..x", "chat.c1.x.y.z", "chat c1", "1chat.x", "a.b.c"])
def test_parse_metric_ref_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_metric_ref(text)


def test_catalog() -> None:
    assert "ttft_p99_ms" in LEVEL_METRICS
    assert "chunk_gap_median_ms" in LEVEL_METRICS
    assert "gpu_power_mean_w" in LEVEL_METRICS
    assert {"cost_per_mtok", "tokens_per_dollar"} <= LEVEL_METRICS
    assert len(LEVEL_METRICS) == 22 + 5 * 5
    assert {"pass_rate", "passed", "total", "errors", "error_rate"} == EVAL_METRICS
    phases = {"stop_s", "release_s", "start_s", "load_s", "ready_s", "bench_s"}
    assert phases | {"gpus"} == TRIAL_METRICS
    assert isinstance(LEVEL_METRICS, frozenset)


@pytest.mark.parametrize(
    ("text", "op", "value"),
    [
        ("chat.c1.ttft_p99_ms < 500", "<", 500.0),
        ("chat.c1.ttft_p99_ms<=500", "<=", 500.0),
        ("chat.c1.error_rate == 0", "==", 0.0),
        ("coding.pass_rate >= 0.8", ">=", 0.8),
        ("load_s != -1.5e2", "!=", -150.0),
        ("chat.r2.5.goodput > 1", ">", 1.0),
    ],
)
def test_parse_constraint(text: str, op: str, value: float) -> None:
    constraint = parse_constraint(text)
    assert (constraint.op, constraint.value) == (op, value)
    assert constraint.text == text


@pytest.mark.parametrize(
    "text", ["chat.c1.ttft_p99_ms", "chat.c1.ttft_p99_ms = 5", "< 5", "x < nan", "x < 5 ms"]
)
def test_parse_constraint_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_constraint(text)


def test_constraint_check() -> None:
    below = parse_constraint("chat.c1.ttft_p99_ms < 500")
    assert below.check(499.9) is True
    assert below.check(500) is False
    assert below.check(None) is None
    assert below.check(float("nan")) is None
    assert parse_constraint("x != 1").check(1.0) is False
    assert parse_constraint("x >= 1").check(1) is True
    assert parse_constraint("x > 1").check(1) is False
    assert parse_constraint("x <= 1").check(1) is True
    assert parse_constraint("x == 1").check(1) is True


def test_validate_ref_fills_the_only_level() -> None:
    spec = make_spec()
    ref = validate_ref(parse_metric_ref("single.ttft_p99_ms"), spec)
    assert ref.level == "c4"
    assert ref.text == "single.ttft_p99_ms"
    assert validate_ref(parse_metric_ref("open.r2.5.goodput"), spec).level == "r2.5"
    assert validate_ref(parse_metric_ref("load_s"), spec).is_trial_metric


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("ttft_p99_ms", "does not say which workload: write e.g. 'chat.c1.ttft_p99_ms'"),
        ("laod_s", "did you mean 'load_s'?"),
        ("chats.c1.ttft_p99_ms", "did you mean 'chat'?"),
        ("chat.c2.ttft_p99_ms", "no level 'c2' (levels: c1, c8)"),
        ("open.r2.ttft_p99_ms", "no level 'r2' (levels: r2.5, r10)"),
        ("chat.ttft_p99_ms", "has 2 levels"),
        ("chat.c1", "names a level but no metric"),
        ("chat.c1.pass_rate", "unknown metric 'pass_rate'"),
        ("coding.ttft_p99_ms", "not a metric of eval workload 'coding'"),
        ("coding.c1.pass_rate", "has no load levels"),
        ("chat.c1.load_s", "write 'load_s' alone"),
    ],
)
def test_validate_ref_rejects(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_ref(parse_metric_ref(text), make_spec())
    assert fragment in info.value.message


def test_validate_constraints_names_the_constraint() -> None:
    spec = make_spec(constraints=["chat.c1.ttft_p99_ms < 500", "chat.c3.ttft_p99_ms < 1"])
    with pytest.raises(ConfigError) as info:
        validate_constraints(spec)
    assert info.value.key == "constraints.1"
    assert "'chat.c3.ttft_p99_ms'" in str(info.value)


def test_validate_constraints_returns_resolved_constraints() -> None:
    spec = make_spec(constraints=["single.error_rate == 0", "coding.pass_rate >= 0.5"])
    first, second = validate_constraints(spec)
    assert first.ref.key == "single.c4.error_rate"
    assert second.ref.key == "coding.pass_rate"


def objective(**fields: Any) -> MetricRef:
    return resolve_objective(make_spec(objective=fields))


def test_objective_bare_metric_defaults_to_first_workload_and_level() -> None:
    assert objective(maximize="output_throughput").key == "chat.c1.output_throughput"


def test_objective_parts() -> None:
    assert objective(maximize="goodput", workload="open", rate=10).key == "open.r10.goodput"
    assert objective(minimize="ttft_p99_ms", concurrency=8).key == "chat.c8.ttft_p99_ms"


def test_objective_eval_metric_picks_the_eval_workload() -> None:
    assert objective(maximize="pass_rate").key == "coding.pass_rate"


def test_objective_full_reference_and_agreeing_parts() -> None:
    assert objective(minimize="open.r2.5.e2e_p99_ms").key == "open.r2.5.e2e_p99_ms"
    agreeing = objective(maximize="chat.c8.goodput", workload="chat", concurrency=8)
    assert agreeing.key == "chat.c8.goodput"


def test_objective_trial_metric() -> None:
    assert objective(minimize="load_s").key == "load_s"


@pytest.mark.parametrize(
    ("fields", "key", "fragment"),
    [
        ({"maximize": "chat.c8.goodput", "concurrency": 1}, "objective.concurrency", "not 'c1'"),
        ({"maximize": "chat.c8.goodput", "workload": "open"}, "objective.workload", "not 'open'"),
        ({"maximize": "goodput", "concurrency": 1, "rate": 2}, "objective", "not both"),
        ({"maximize": "goodput", "workload": "cht"}, "objective.workload", "did you mean 'chat'"),
        ({"maximize": "goodput", "workload": "open", "rate": 3}, "objective.rate", "no level 'r3'"),
        ({"maximize": "pass_rate", "workload": "coding", "concurrency": 1}, None, "no load levels"),
        ({"minimize": "goodputt"}, "objective.minimize", "did you mean 'goodput'"),
        ({"minimize": "a b"}, "objective.minimize", "not a metric reference"),
        ({"minimize": "load_s", "workload": "chat"}, "objective", "is a trial metric"),
    ],
)
def test_objective_rejects(fields: dict[str, Any], key: str | None, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        objective(**fields)
    if key is not None:
        assert info.value.key == key
    assert fragment in info.value.message


def test_no_objective_means_first_load_level_throughput_maximised() -> None:
    spec = make_spec()
    assert resolve_objective(spec).key == "chat.c1.output_throughput"
    assert objective_direction(spec) == "max"
    evals_only = SweepSpec.model_validate(
        {
            "name": "t",
            "server": {"engine": "sim"},
            "workloads": [{"name": "coding", "eval": {"suite": "builtin:coding"}}],
        }
    )
    assert resolve_objective(evals_only).key == "coding.pass_rate"


def test_direction() -> None:
    assert objective_direction(make_spec(objective={"minimize": "ttft_p99_ms"})) == "min"
