"""The capacity search on synthetic load curves with a known capacity: an open-loop
queue (latency 1/(1-load/mu)), a closed loop whose latency grows as a power of the
concurrency, and a bare pass/fail step; the SLO score of measured requests; the summary
result and which levels may fail a trial with bench_errors."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from servesweep.bench.capacity import (
    CAPACITY_LEVEL,
    CapacityPlan,
    capacity_result,
    error_checked,
)
from servesweep.bench.capacity_search import Probe, estimate, next_load, slo_score
from servesweep.errors import ConfigError
from servesweep.metrics_catalog import CAPACITY_METRICS
from servesweep.models import LevelResult, RequestSample
from servesweep.spec import SweepSpec, parse_metric_ref, validate_ref
from servesweep.spec.schema import WorkloadSpec, workload_spec
from servesweep.spec.schema_search import CapacitySpec

Curve = Callable[[float], float]


def queue(capacity: float, slo_multiple: float) -> Curve:
    """Open loop: latency base/(1 - load/mu), the SLO is ``slo_multiple`` x base; an
    overloaded server's score is whatever its queue made it (large)."""
    mu = capacity / (1 - 1 / slo_multiple)

    def score(load: float) -> float:
        rho = load / mu
        return 20 + 10 * rho if rho >= 1 else 1 / (1 - rho) / slo_multiple

    return score


def power(capacity: float, flat_until: float, exponent: float) -> Curve:
    """Closed loop: flat until the batch is full, then growing as a power."""
    return lambda load: max(flat_until**exponent, (load / capacity) ** exponent)


def step(capacity: float) -> Curve:
    return lambda load: 0.6 if load <= capacity else 1.8


def search(spec: CapacitySpec, curve: Curve) -> tuple[float, list[Probe]]:
    probes: list[Probe] = []
    while (load := next_load(spec, probes)) is not None:
        assert spec.low <= load <= spec.high
        assert all(not math.isclose(p.load, load) for p in probes), "a load measured twice"
        probes.append(Probe(load, curve(load)))
    return estimate(spec, probes).capacity, probes


CURVES = {
    "queue-steep": lambda c: queue(c, 1.5),
    "queue-gentle": lambda c: queue(c, 10.0),
    "power-linear": lambda c: power(c, 0.3, 1.0),
    "power-quadratic": lambda c: power(c, 0.5, 2.0),
    "step": step,
}


@pytest.mark.parametrize("shape", list(CURVES))
@pytest.mark.parametrize("capacity", [0.9, 2.3, 5.0, 11.7, 24.0, 47.0])
def test_rate_capacity_within_5_percent_in_8_levels(shape: str, capacity: float) -> None:
    spec = CapacitySpec(slo={"ttft_ms": 500}, vary="rate", low=0.5, high=64)
    found, probes = search(spec, CURVES[shape](capacity))
    assert len(probes) <= 8
    assert capacity * 0.95 <= found <= capacity  # the highest load measured to hold


@pytest.mark.parametrize("shape", ["queue-steep", "queue-gentle", "power-linear", "step"])
@pytest.mark.parametrize("capacity", [3, 7, 18, 40, 100, 200])
def test_concurrency_capacity_is_a_whole_number_within_5_percent(shape: str, capacity: int) -> None:
    spec = CapacitySpec(slo={"tpot_ms": 50}, vary="concurrency", low=1, high=256)
    found, probes = search(spec, CURVES[shape](capacity + 0.5))
    assert len(probes) <= 8
    assert all(float(p.load).is_integer() for p in probes)
    assert capacity * 0.95 <= found <= capacity


def test_slo_failing_at_low_means_capacity_zero() -> None:
    spec = CapacitySpec(slo={"ttft_ms": 500}, vary="rate", low=1, high=32)
    found, probes = search(spec, queue(0.5, 3.0))
    assert found == 0.0
    assert any(p.load == 1 and not p.ok for p in probes)  # low itself was measured
    assert estimate(spec, probes).bound == "below_low"


def test_slo_holding_at_high_is_a_lower_bound() -> None:
    spec = CapacitySpec(slo={"ttft_ms": 500}, vary="rate", low=1, high=32)
    found, probes = search(spec, queue(100.0, 3.0))
    assert found == 32
    assert estimate(spec, probes).bound == "at_least_high"


def test_max_levels_stops_early_and_says_so() -> None:
    spec = CapacitySpec(slo={"ttft_ms": 500}, vary="rate", low=0.5, high=64, max_levels=3)
    found, probes = search(spec, step(10.0))
    assert len(probes) == 3
    assert 0 < found < 10.0
    assert estimate(spec, probes).bound == "max_levels"


def sample(
    ttft: float | None, e2e: float | None, tokens: int = 11, ok: bool = True
) -> RequestSample:
    return RequestSample(
        index=0,
        ok=ok,
        sent_at=0.0,
        first_token_at=ttft,
        finished_at=e2e,
        completion_tokens=tokens,
    )


def test_slo_score_is_the_quantile_of_the_worst_ratio_per_request() -> None:
    slo = {"ttft_ms": 500, "tpot_ms": 50}
    # tpot = (e2e - ttft) / (tokens - 1): 0.4 s over 10 tokens = 40 ms
    good = sample(0.25, 0.65)  # ratios 0.5, 0.8
    slow_tpot = sample(0.1, 0.7)  # tpot 60 ms: 1.2
    failed = sample(None, None, ok=False)
    one_token = sample(0.3, 0.3, tokens=1)  # TPOT not defined: only TTFT counts (0.6)
    score, attainment = slo_score([good] * 7 + [one_token, slow_tpot, failed], slo, 0.8)
    assert attainment == pytest.approx(0.8)
    assert score == pytest.approx(0.8)  # the 8th of 10 sorted ratios
    score, _ = slo_score([good] * 7 + [one_token, slow_tpot, failed], slo, 0.9)
    assert score == pytest.approx(1.2)
    assert slo_score([good, failed], slo, 0.99)[0] == math.inf
    assert slo_score([], slo, 0.5) == (math.inf, 0.0)


def workload() -> WorkloadSpec:
    return workload_spec(
        **{
            "name": "chat",
            "capacity": {"slo": {"ttft_ms": 500}, "vary": "rate", "low": 1, "high": 16},
        }
    )


def tried(load: float, score: float, errors: float = 0.0, throughput: float = 0.0) -> LevelResult:
    return LevelResult(
        "chat",
        f"r{load:g}",
        0,
        {"error_rate": errors, "output_throughput": throughput},
        info={
            "capacity": {"load": load, "score": score, "attainment": 0.99, "meets_slo": score <= 1}
        },
    )


def test_capacity_result_names_the_capacity_and_the_levels_tried() -> None:
    levels = [tried(4, 0.5, throughput=400), tried(16, 9.0, 0.3), tried(8, 0.97, throughput=790)]
    summary = capacity_result(workload(), levels)
    assert summary.level == CAPACITY_LEVEL
    assert set(summary.metrics) == CAPACITY_METRICS
    assert summary.metrics["capacity"] == 8
    assert summary.metrics["capacity_levels"] == 3
    assert summary.metrics["capacity_output_throughput"] == 790
    assert [lvl["level"] for lvl in summary.info["levels"]] == ["r4", "r16", "r8"]
    assert summary.info["bound"] == "max_levels"  # 8..16 is not within 5 %
    assert summary.warnings and "stopped after 8 levels" in summary.warnings[0]


def test_the_plan_hands_out_levels_until_the_capacity_is_known() -> None:
    lines: list[str] = []
    plan = CapacityPlan(workload(), lines.append)
    curve = step(6.0)  # the SLO (500 ms TTFT) holds up to 6 req/s
    level, measured = plan.next_level(None, None), 0
    while level is not None:
        assert level.capacity is None and level.concurrency == [] and len(level.rate) == 1
        ttft = 0.5 * curve(level.rate[0])
        samples = [
            RequestSample(i, True, sent_at=0.0, first_token_at=ttft, finished_at=ttft)
            for i in range(4)
        ]
        result = LevelResult("chat", f"r{level.rate[0]:g}", 0, {}, samples=samples)
        with pytest.raises(ValueError, match="result of the level it returned last"):
            plan.next_level(None, result)
        level, measured = plan.next_level(level, result), measured + 1
    *levels, summary = plan.results
    assert len(levels) == measured == summary.metrics["capacity_levels"]
    assert 6.0 / 1.05 <= summary.metrics["capacity"] <= 6.0
    assert [r.info["capacity"]["meets_slo"] for r in levels] == [
        r.info["capacity"]["load"] <= 6.0 for r in levels
    ]
    assert len(lines) == measured + 1 and lines[-1].startswith("chat capacity: ")


def test_only_levels_within_the_slo_and_the_lowest_may_fail_with_errors() -> None:
    levels = [tried(4, 0.5), tried(16, 9.0, 0.6), tried(8, 0.97)]
    checked = error_checked(workload(), [*levels, capacity_result(workload(), levels)])
    assert [r.level for r in checked] == ["r4", "r8"]
    plain = workload_spec(name="plain", concurrency=[1, 8])
    assert error_checked(plain, levels) == levels


def test_references_accept_the_capacity_catalog_on_capacity_workloads_only() -> None:
    spec = SweepSpec.model_validate(
        {
            "name": "t",
            "server": {"engine": "sim"},
            "workloads": [
                {"name": "chat", "concurrency": [1, 8]},
                {
                    "name": "cap",
                    "capacity": {"slo": {"tpot_ms": 50}, "vary": "rate", "low": 1, "high": 8},
                },
            ],
        }
    )

    def accepted(text: str) -> bool:
        try:
            validate_ref(parse_metric_ref(text), spec)
        except ConfigError:
            return False
        return True

    assert all(accepted(f"cap.{name}") for name in CAPACITY_METRICS)
    assert not any(accepted(f"chat.c1.{name}") for name in CAPACITY_METRICS)
    assert not any(accepted(f"cap.{name}") for name in ("output_throughput", "pass_rate"))
    assert not accepted("cap.r2.capacity")
