"""The rule that acts on the performance prediction (``decide.perf.gate``): a
configuration whose interval cannot beat the leader by the threshold, or whose whole
interval violates a constraint, is skipped as ``predicted_worse`` with its prediction
as evidence; unknown, no leader or the predicted best launch; a skipped one whose
interval (with the trust of now) still reaches the leader is open again; the search is
told a skipped one as stopped early at its predicted value; the inputs read the
engines' per-position acceptance (issue 34)."""

from __future__ import annotations

import pytest

from servesweep.bench.specdecode import (
    acceptance_from_counters,
    counter_names,
    parse_counters,
    parse_per_position,
)
from servesweep.decide.perf import Prediction, Trust, verify
from servesweep.decide.perf.gate import (
    PREDICTED_WORSE,
    Leader,
    beaten,
    prediction_of,
    rules_out,
    skip_evidence,
    still_open,
)
from servesweep.decide.perf.inputs import level_rates, measured_of
from servesweep.decide.verdict import Goal, VerdictKind, judge
from servesweep.models import Evidence, LevelResult, Outcome
from servesweep.records import TrialRecord
from servesweep.spec.constraints import MetricRef, parse_constraint

pytestmark = pytest.mark.unit

M = "chat.c1.output_throughput"
LEADER = Leader(M, "max", 100.0, 7)


def _p(value: float, low: float, high: float, metric: str = M) -> Prediction:
    return Prediction(metric, value, low, high, "speculative")


def test_a_configuration_whose_top_is_below_the_leader_by_the_threshold_is_skipped() -> None:
    worse = {M: _p(80.0, 75.0, 85.0)}
    evidence = skip_evidence("budget=8", worse, LEADER, 0.01)
    assert evidence is not None and evidence.reason == PREDICTED_WORSE
    assert "budget=8" in evidence.message and "#7" in evidence.message
    assert evidence.details["predicted_performance"][M]["high"] == 85.0
    assert evidence.details["leader"] == {"trial": 7, "metric": M, "value": 100.0}


def test_within_the_threshold_or_reaching_the_leader_is_launched() -> None:
    assert not beaten(_p(95.0, 90.0, 99.5), LEADER, 0.01)  # 0.5 below: inside 1 %
    assert beaten(_p(95.0, 90.0, 98.9), LEADER, 0.01)
    assert skip_evidence("x", {M: _p(95.0, 90.0, 120.0)}, LEADER, 0.01) is None


def test_a_minimised_objective_is_beaten_from_below() -> None:
    leader = Leader("chat.c1.ttft_p50_ms", "min", 10.0, 1)
    assert beaten(_p(13.0, 12.0, 14.0, leader.metric), leader, 0.01)
    assert not beaten(_p(13.0, 9.0, 14.0, leader.metric), leader, 0.01)


def test_unknown_and_no_leader_are_launched() -> None:
    worse = {M: _p(80.0, 75.0, 85.0)}
    assert skip_evidence("x", {M: Prediction(M)}, LEADER, 0.01) is None
    assert skip_evidence("x", worse, None, 0.01) is None


def test_a_certain_constraint_violation_is_skipped_an_uncertain_one_is_not() -> None:
    ttft = "chat.c1.ttft_p50_ms"
    limit = parse_constraint(f"{ttft} < 50")
    assert rules_out(_p(70.0, 60.0, 80.0, ttft), limit)
    assert not rules_out(_p(50.0, 40.0, 60.0, ttft), limit)
    assert not rules_out(Prediction(ttft), limit)
    assert not rules_out(_p(70.0, 60.0, 80.0, ttft), parse_constraint(f"{ttft} == 70"))
    preds = {M: _p(150.0, 140.0, 160.0), ttft: _p(70.0, 60.0, 80.0, ttft)}
    evidence = skip_evidence("x", preds, None, 0.01, [limit])
    assert evidence is not None and evidence.details["constraint"] == str(limit)


def test_a_skipped_configuration_is_open_again_when_its_widened_interval_reaches() -> None:
    skipped = _p(80.0, 75.0, 85.0)
    assert not still_open({M: skipped}, LEADER)
    # a launched configuration the model missed by four half-widths widens the metric
    missed = _p(100.0, 95.0, 105.0)
    trust = verify(Trust(), missed, 120.0)
    assert trust.factor(M) == pytest.approx(4.0)
    wide = _p(80.0, 80.0 - 5.0 * trust.factor(M), 80.0 + 5.0 * trust.factor(M))
    assert still_open({M: wide}, LEADER)
    assert still_open({M: Prediction(M)}, LEADER)  # unknown now: it could win
    assert still_open({M: skipped}, None)


def test_a_prediction_survives_its_json() -> None:
    p = _p(80.0, 75.0, 85.0)
    assert prediction_of(p.to_json()) == p
    assert prediction_of(Prediction(M).to_json()) == Prediction(M)


def _record(outcome: Outcome, evidence: Evidence | None = None) -> TrialRecord:
    return TrialRecord(
        id=3,
        sweep_id=1,
        seq=3,
        fingerprint="f",
        params={"budget": 8},
        outcome=outcome,
        evidence=evidence,
    )


def test_the_search_is_told_a_predicted_worse_trial_as_stopped_at_its_prediction() -> None:
    goal = Goal(((MetricRef("chat", "c1", "output_throughput", M), "max"),))
    evidence = skip_evidence("x", {M: _p(80.0, 75.0, 85.0)}, LEADER, 0.01)
    verdict = judge(goal, _record(Outcome.SKIPPED, evidence), [])
    assert verdict.kind is VerdictKind.PRUNED and verdict.values == (80.0,)
    assert not verdict.feasible and verdict.told
    other = judge(goal, _record(Outcome.SKIPPED, Evidence(message="m", reason="other")), [])
    assert other.kind is VerdictKind.IGNORED


def test_the_engines_per_position_acceptance_fills_the_rates() -> None:
    info = {"spec_decode": {"drafts": 100.0, "accepted_per_position": [80.0, 64.0, 51.2]}}
    assert level_rates(info) == pytest.approx((0.8, 0.64, 0.512))
    assert level_rates({"spec_decode": {"drafts": 0.0, "accepted_per_position": [1.0]}}) == ()
    assert level_rates({}) == ()
    result = LevelResult(
        workload="chat",
        level="c1",
        repeat=0,
        metrics={"output_throughput": 50.0, "acceptance_length": 2.9},
        info=info,
    )
    (measured,) = measured_of([(_record(Outcome.OK), [result])])
    assert measured.metrics[M] == 50.0
    assert measured.rates["chat.c1"] == pytest.approx((0.8, 0.64, 0.512))


def test_the_per_position_counters_are_read_and_differenced_around_a_level() -> None:
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    counters = {
        "accepted": "vllm:spec_decode_num_accepted_tokens_total",
        "drafts": "vllm:spec_decode_num_drafts_total",
        "accepted_per_pos": name,
    }

    def text(drafts: float, accepted: float, per_pos: list[float]) -> str:
        lines = [
            f'vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}',
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}',
        ]
        for engine in ("0", "1"):  # two engines of a data-parallel server: summed
            lines += [
                f'{name}{{engine="{engine}",position="{i}"}} {v / 2}' for i, v in enumerate(per_pos)
            ]
        return "\n".join(lines)

    def read(body: str) -> dict[str, float]:
        values = parse_counters(body, counter_names(counters))
        values.update(parse_per_position(body, name))
        return values

    before = read(text(10, 5, [4, 1]))
    after = read(text(110, 149, [84, 45, 20]))
    length, detail = acceptance_from_counters(counters, before, after)
    assert length == pytest.approx(1 + 144 / 100)
    assert detail["accepted_per_position"] == pytest.approx([80.0, 44.0, 20.0])
    assert level_rates({"spec_decode": detail}) == pytest.approx((0.8, 0.44, 0.2))


def _trial(
    id: int, outcome: Outcome, value: float, ttft: float
) -> tuple[TrialRecord, list[LevelResult]]:
    record = TrialRecord(
        id=id, sweep_id=1, seq=id, fingerprint=f"f{id}", params={"budget": id}, outcome=outcome
    )
    metrics = {"output_throughput": value, "ttft_p50_ms": ttft}
    return record, [LevelResult(workload="chat", level="c1", repeat=0, metrics=metrics)]


def test_the_leader_is_the_best_complete_feasible_trial() -> None:
    from servesweep.sweep.core.predict_gate import leader_of

    ttft = "chat.c1.ttft_p50_ms"
    objective = (MetricRef("chat", "c1", "output_throughput", M), "max")
    goal = Goal((objective,), (parse_constraint(f"{ttft} < 50"),))
    history = [
        _trial(1, Outcome.OK, 100.0, 20.0),
        _trial(2, Outcome.OK, 150.0, 80.0),  # too slow: infeasible
        _trial(3, Outcome.PRUNED, 140.0, 20.0),  # stopped early: not complete
        _trial(4, Outcome.OK, 120.0, 30.0),
    ]
    assert leader_of(goal, history) == Leader(M, "max", 120.0, 4)
    assert leader_of(goal, history[1:3]) is None
    assert leader_of(Goal((objective, objective)), history) is None  # several objectives


def test_a_proposal_is_skipped_when_beaten_whatever_the_rest_are_predicted() -> None:
    from servesweep.sweep.core.predict_gate import decide_launch

    goal = Goal(((MetricRef("chat", "c1", "output_throughput", M), "max"),))
    worse, better = {M: _p(80.0, 75.0, 85.0)}, {M: _p(98.0, 90.0, 110.0)}
    evidence = decide_launch(worse, goal, LEADER, 0.01, "budget=8")
    assert evidence is not None and evidence.reason == PREDICTED_WORSE
    assert decide_launch(better, goal, LEADER, 0.01, "x") is None  # can still win
    assert decide_launch(worse, goal, None, 0.01, "x") is None  # no leader yet
    # the sweep's predicted best is the leader (measured) or a configuration predicted to
    # beat it, whose interval then reaches it: predicted above the leader, it launches
    assert decide_launch({M: _p(101.0, 99.0, 103.0)}, goal, LEADER, 0.01, "x") is None
