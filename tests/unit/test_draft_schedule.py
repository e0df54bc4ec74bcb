"""The draft length per concurrency and the schedule an engine can take
(``servesweep.decide.schedule``), from crafted records: the best draft length moves
with the batch, a tie takes the shortest, a predicted draft length is marked and never
passed off as measured, vLLM's ``num_speculative_tokens_per_batch_size`` in the launch,
and an engine that takes one draft length says it cannot follow a schedule."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence

import pytest

from helpers.report_data import level, sweep_data, trial
from servesweep.cli.schedule import schedule_of
from servesweep.decide.best import find_best
from servesweep.decide.perf import Prediction
from servesweep.decide.schedule import (
    DraftChoice,
    ScheduleForm,
    choose_draft,
    draft_schedule,
    schedule_ranges,
)
from servesweep.decide.stats import MetricStats
from servesweep.decide.uncertainty import Rules
from servesweep.models import Evidence, FailureClass, LevelResult
from servesweep.records import SweepData
from servesweep.report.schedule_view import PREDICTED_MARK, format_schedule, schedule_to_json

pytestmark = pytest.mark.unit

K = "speculative_config.num_speculative_tokens"
SCHEDULE = "speculative_config.num_speculative_tokens_per_batch_size"
VLLM = ScheduleForm("vllm", K, SCHEDULE)
ONE_NUMBER = ScheduleForm("llama-server", K)


def _accepted(k: int) -> float:
    """Acceptance length with every draft position accepted at 0.8 (issue 34's profile)."""
    return (1 - 0.8 ** (k + 1)) / 0.2


def _throughput(c: int, k: int) -> float:
    """Output throughput of a landscape whose step costs ``10 + 0.5 c + 0.8 k + 1.0 c k``
    ms (verifying every sequence's draft tokens fills the step): the best draft length
    is 4 alone, 1 in a batch of 8, and 1 overtakes 4 at batch 5."""
    return 1000 * c * _accepted(k) / (10 + 0.5 * c + 0.8 * k + 1.0 * c * k)


DRAFTS = (1, 2, 4, 8)
C1 = {k: _throughput(1, k) for k in DRAFTS}
C8 = {k: _throughput(8, k) for k in DRAFTS}
ACCEPT = {k: _accepted(k) for k in DRAFTS}
SWITCH = next(c for c in range(2, 8) if _throughput(c, 1) >= _throughput(c, 4))

SPEC_TEXT = f"""
name: dsd
server:
  engine: vllm
  model: /models/tiny
  args:
    speculative_config.method: ngram
    speculative_config.prompt_lookup_max: 3
    max-num-seqs: 16
params:
  grid:
    {K}: [1, 2, 4, 8, 16]
workloads:
  - name: chat
    concurrency: [1, 8]
    requests: 16
objective:
  maximize: output_throughput
  workload: chat
  concurrency: 1
"""


def _levels(draft: int, c1: float, c8: float, spread: float = 0.005) -> list[LevelResult]:
    out = []
    for r, f in enumerate((1 - spread, 1.0, 1 + spread)):
        out.append(
            level("chat", "c1", r, output_throughput=c1 * f, acceptance_length=ACCEPT[draft])
        )
        out.append(
            level("chat", "c8", r, output_throughput=c8 * f, acceptance_length=ACCEPT[draft])
        )
    return out


def _data(
    c1: Mapping[int, float] = C1,
    c8: Mapping[int, float] = C8,
    *,
    skipped: Sequence[int] = (16,),
    spec_text: str = SPEC_TEXT,
    constraints: Sequence[str] = (),
    levels_of: Mapping[int, list[LevelResult]] | None = None,
) -> SweepData:
    trials = []
    results: dict[int, list[LevelResult]] = {}
    for tid, draft in enumerate(sorted(c1), 1):
        trials.append(trial(tid, {K: draft}))
        results[tid] = (
            levels_of[draft]
            if levels_of and draft in levels_of
            else _levels(draft, c1[draft], c8[draft])
        )
    for draft in skipped:
        tid = len(trials) + 1
        why = Evidence(message="predicted worse than the best", reason="predicted_worse")
        trials.append(trial(tid, {K: draft}, "skipped", evidence=why))
        results[tid] = []
    data = sweep_data(
        trials,
        results,
        objective={"maximize": "chat.c1.output_throughput"},
        constraints=constraints,
    )
    sweep = dataclasses.replace(data.sweep, spec_text=spec_text)
    return dataclasses.replace(data, sweep=sweep)


def test_the_draft_length_per_concurrency_and_vllms_schedule() -> None:
    data = _data()
    best = find_best(data)
    assert best.trial is not None and best.trial.params == {K: 4}
    schedule = draft_schedule(data, best, VLLM)
    assert schedule is not None
    chosen = {lv.level: (lv.chosen.draft, lv.chosen.basis) for lv in schedule.levels}
    assert chosen == {"c1": (4, "measured"), "c8": (1, "measured")}
    c1 = schedule.levels[0]
    assert c1.chosen.value == pytest.approx(C1[4])
    assert c1.chosen.low is not None and c1.chosen.high is not None
    assert c1.chosen.low < C1[4] < c1.chosen.high
    assert c1.chosen.trial == 3 and "beats draft 8" in c1.why
    assert [c.draft for c in c1.measured] == [1, 2, 4, 8]
    # the engine's form: inclusive ranges from batch 1, the largest draft length as the
    # cap; the switch between c1's 4 and c8's 1 placed by the prediction where this
    # landscape has it (batch 5: its step cost is one the model's shapes can take)
    assert SWITCH == 5
    [switch] = schedule.switches
    assert (switch.low, switch.high, switch.batch, switch.basis) == (1, 8, 5, "predicted")
    assert schedule.ranges == ((1, 4, 4), (5, 8, 1))
    assert schedule.expressed
    assert schedule.params == {K: 4, SCHEDULE: [[1, 4, 4], [5, 8, 1]]}
    assert any("only c1, c8 were measured" in x for x in schedule.limits)
    assert any(x.startswith("switch c1 -> c8 at batch 5: ") for x in schedule.limits)
    assert any("never launched" in x for x in schedule.limits)
    # each level's own launch: the winner's knobs, that level's draft length
    assert [dict(lv.params) for lv in schedule.levels] == [{K: 4}, {K: 1}]


def test_a_draft_length_never_launched_is_predicted_and_marked() -> None:
    data = _data()
    best = find_best(data)
    schedule = draft_schedule(data, best, VLLM)
    assert schedule is not None
    for lv in schedule.levels:
        assert [c.draft for c in lv.predicted] == [16]
        predicted = lv.predicted[0]
        assert predicted.basis == "predicted" and predicted.trial is None
        assert not any(c.draft == 16 for c in lv.measured)
        assert lv.chosen.basis == "measured"  # 16 drafts cost more than they bring here
    text = format_schedule(schedule, {})
    lines = [x for x in text.splitlines() if f"{K}=16:" in x]
    assert len(lines) == 2 and all(PREDICTED_MARK in x for x in lines), text
    assert not any("measured #" in x for x in lines)
    # far from the measured draft lengths its interval is wide: still open at both
    assert [lv.open for lv in schedule.levels] == [(16,), (16,)]
    assert text.count(f"open: {K}=16 predicted, could still beat it") == 2


def test_a_tie_takes_the_shortest_draft_length() -> None:
    c1 = {**C1, 2: C1[4] * 0.995}  # 2 and 4 within the 1 % threshold
    data = _data(c1=c1, skipped=())
    best = find_best(data)
    schedule = draft_schedule(data, best, VLLM)
    assert schedule is not None
    c1_choice = schedule.levels[0]
    assert c1_choice.chosen.draft == 2 and c1_choice.tied == (4,)
    assert "shortest" in c1_choice.why
    [switch] = schedule.switches
    assert 2 <= switch.batch <= 8
    assert schedule.ranges == ((1, switch.batch - 1, 2), (switch.batch, 8, 1))
    assert schedule.params[K] == 2


def test_an_engine_that_takes_one_draft_length_cannot_follow_a_schedule() -> None:
    data = _data()
    best = find_best(data)
    schedule = draft_schedule(data, best, ONE_NUMBER)
    assert schedule is not None
    assert [lv.chosen.draft for lv in schedule.levels] == [4, 1]
    assert not schedule.expressed and schedule.schedule_param is None
    assert schedule.params == {K: 4}  # the best's own launch
    assert any("cannot follow a schedule" in x for x in schedule.limits)
    doc = schedule_to_json(schedule, {"c1": "run --k 4", "c8": "run --k 1"})
    assert doc is not None and doc["expressed"] is False
    assert doc["level_launch"] == {"c1": "run --k 4", "c8": "run --k 1"}


def test_the_same_draft_length_everywhere_needs_no_schedule() -> None:
    c8 = {**C8, 4: C8[1] * 1.1}
    data = _data(c8=c8, skipped=())
    schedule = draft_schedule(data, find_best(data), VLLM)
    assert schedule is not None
    assert schedule.ranges == ((1, 8, 4),) and schedule.switches == ()
    assert not schedule.expressed and schedule.params == {K: 4}
    assert any("one draft length serves every measured concurrency" in x for x in schedule.limits)


def test_no_schedule_without_a_varied_draft_length_or_several_concurrencies() -> None:
    data = _data()
    best = find_best(data)
    assert draft_schedule(data, best, None) is None
    assert draft_schedule(data, best, ScheduleForm("generic", None)) is None
    assert draft_schedule(data, best, ScheduleForm("sim", "budget")) is None  # not swept
    one_level = {d: [x for x in _levels(d, C1[d], C8[d]) if x.level == "c1"] for d in C1}
    only_c1 = _data(levels_of=one_level, skipped=())
    assert draft_schedule(only_c1, find_best(only_c1), VLLM) is None


def test_a_constraint_at_a_level_rules_a_draft_length_out_there() -> None:
    levels_of = {d: _levels(d, C1[d], C8[d]) for d in C1}
    for d in C1:  # short drafts make the c8 tail worse here: 1 breaks the limit
        for x in levels_of[d]:
            if x.level == "c8":
                x.metrics["ttft_p99_ms"] = 900.0 if d == 1 else 300.0
    data = _data(levels_of=levels_of, skipped=(), constraints=["chat.c8.ttft_p99_ms < 500"])
    best = find_best(data)
    schedule = draft_schedule(data, best, VLLM)
    assert schedule is not None
    c8 = schedule.levels[1]
    assert c8.chosen.draft == 2 and 1 not in [c.draft for c in c8.measured]


def test_schedule_ranges_start_at_one_and_merge_equal_neighbours() -> None:
    assert schedule_ranges([(8, 1), (1, 4), (32, 0)]) == ((1, 7, 4), (8, 31, 1), (32, 32, 0))
    starts = {8: 5, 32: 20}  # switches placed below the upper concurrencies
    assert schedule_ranges([(8, 1), (1, 4), (32, 0)], starts) == (
        (1, 4, 4),
        (5, 19, 1),
        (20, 32, 0),
    )
    assert schedule_ranges([(2, 3), (4, 3), (16, 1)]) == ((1, 15, 3), (16, 16, 1))
    assert schedule_ranges([(4, 2)]) == ((1, 4, 2),)


def _stats(mean: float) -> MetricStats:
    return MetricStats(mean, mean, mean, 0.0, 3, mean * 0.99, mean * 1.01, 0.95)


def test_a_predicted_draft_length_is_chosen_only_beyond_the_threshold_and_marked() -> None:
    rules = Rules()
    measured = [(DraftChoice(2, 100.0, 99.0, 101.0, "measured", 1), _stats(100.0))]
    far = DraftChoice(8, 130.0, 115.0, 140.0, "predicted")
    near = DraftChoice(4, 102.0, 90.0, 112.0, "predicted")
    low = DraftChoice(16, 60.0, 50.0, 70.0, "predicted")

    def pred(c: DraftChoice) -> Prediction:
        return Prediction("chat.c1.output_throughput", c.value, c.low, c.high, "speculative")

    chosen = choose_draft(
        "c1", 1, measured, [(far, pred(far)), (low, pred(low))], "max", rules, None
    )
    assert chosen is not None and chosen.chosen is far and chosen.chosen.predicted
    assert "never launched" in chosen.why
    reach = choose_draft(
        "c1", 1, measured, [(near, pred(near)), (low, pred(low))], "max", rules, None
    )
    assert reach is not None and reach.chosen.draft == 2 and reach.chosen.basis == "measured"
    assert reach.open == (4,)  # its interval still reaches past the measured choice
    unknown = Prediction("chat.c1.output_throughput")
    blind = choose_draft(
        "c1", 1, measured, [(DraftChoice(32, None, None, None, "predicted"), unknown)],
        "max", rules, None,
    )  # fmt: skip
    assert blind is not None and blind.chosen.draft == 2 and blind.open == (32,)


def test_best_gives_vllms_launch_with_the_schedule() -> None:
    data = _data()
    best = find_best(data)
    schedule, launches = schedule_of(data, best)
    assert schedule is not None and schedule.expressed
    launch = launches["schedule"]
    config = json.loads(launch.split("--speculative-config ")[1].split(" ")[0].strip("'"))
    assert config == {
        "method": "ngram",
        "prompt_lookup_max": 3,
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 8, 1]],
    }
    assert launch.startswith("vllm serve /models/tiny ")
    assert '"num_speculative_tokens":1,' in launches["c8"]
    assert "per_batch_size" not in launches["c8"]
    text = format_schedule(schedule, launches)
    assert f"{SCHEDULE}=[[1,4,4],[5,8,1]]" in text
    assert f"  schedule launch: {launch}" in text
    doc = schedule_to_json(schedule, launches)
    assert doc is not None and doc["launch"] == launch
    assert doc["ranges"] == [[1, 4, 4], [5, 8, 1]]
    assert doc["switches"][0]["batch"] == 5
    assert [lv["basis"] for lv in doc["levels"]] == ["measured", "measured"]
    assert json.loads(json.dumps(doc)) == doc


def test_a_draft_length_that_failed_or_would_not_fit_is_neither_measured_nor_predicted() -> None:
    data = _data(skipped=(16,))
    oom = Evidence(message="server exited while loading", reason="oom")
    failed = dataclasses.replace(
        trial(6, {K: 16}, "failed", evidence=oom), failure_class=FailureClass("start_crash")
    )
    fit = Evidence(message="predicted 90 GiB of 80", reason="predicted_oom")
    too_big = trial(7, {K: 32}, "skipped", evidence=fit)
    skipped16 = [t for t in data.trials if t.params == {K: 16}]
    kept = [t for t in data.trials if t not in skipped16]
    data = dataclasses.replace(data, trials=(*kept, failed, too_big))
    schedule = draft_schedule(data, find_best(data), VLLM)
    assert schedule is not None
    assert dict(schedule.ruled_out) == {
        16: "failed: start_crash (oom)",
        32: "skipped: predicted_oom",
    }
    for lv in schedule.levels:
        assert lv.predicted == () and 16 not in [c.draft for c in lv.measured]
    text = format_schedule(schedule, {})
    assert f"note: {K}=16 neither measured nor predicted: failed: start_crash (oom)" in text
    assert schedule.to_dict()["ruled_out"] == {
        "16": "failed: start_crash (oom)",
        "32": "skipped: predicted_oom",
    }


def test_a_level_the_load_generator_could_not_time_counts_only_when_best_takes_it() -> None:
    levels_of = {d: _levels(d, C1[d], C8[d]) for d in C1}
    levels_of[1] = [
        dataclasses.replace(x, unreliable="event loop lagged") if x.level == "c8" else x
        for x in levels_of[1]
    ]
    data = _data(levels_of=levels_of, skipped=())
    best = find_best(data)
    left_out = draft_schedule(data, best, VLLM)
    assert left_out is not None
    assert [c.draft for c in left_out.levels[1].measured] == [2, 4, 8]
    assert left_out.levels[1].chosen.draft == 2
    taken = draft_schedule(data, best, VLLM, include_unreliable=True)
    assert taken is not None and taken.levels[1].chosen.draft == 1


def test_without_a_prediction_between_two_concurrencies_the_switch_comes_at_the_upper() -> None:
    # no acceptance length stored: the structural model has nothing to go on, and the
    # empirical one never saw a batch of 2 to 7
    levels_of = {
        d: [dataclasses.replace(x, metrics={"output_throughput": x.metrics["output_throughput"]})
            for x in _levels(d, C1[d], C8[d])]
        for d in C1
    }  # fmt: skip
    data = _data(levels_of=levels_of, skipped=())
    schedule = draft_schedule(data, find_best(data), VLLM)
    assert schedule is not None
    [switch] = schedule.switches
    assert (switch.batch, switch.basis) == (8, "next")
    assert "the prediction cannot tell" in switch.why
    assert schedule.ranges == ((1, 7, 4), (8, 8, 1))


def test_the_switch_across_a_wide_gap_is_found_by_bisection() -> None:
    def levels(d: int) -> list[LevelResult]:
        return [
            level("chat", name, r, output_throughput=_throughput(c, d) * f,
                  acceptance_length=ACCEPT[d])
            for r, f in enumerate((0.995, 1.0, 1.005))
            for name, c in (("c1", 1), ("c256", 256))
        ]  # fmt: skip

    data = _data(levels_of={d: levels(d) for d in DRAFTS}, skipped=())
    schedule = draft_schedule(data, find_best(data), VLLM)
    assert schedule is not None
    assert schedule.ranges == ((1, SWITCH - 1, 4), (SWITCH, 256, 1))
    assert schedule.switches[0].basis == "predicted"
