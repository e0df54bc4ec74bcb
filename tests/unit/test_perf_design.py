"""What a sampling search launches first when it predicts performance
(``decide.perf.design``, issue 34): the design's first launches (the longest draft
length at the middle of every other knob, then the same without speculation), then the
predicted best or the interval that reaches farthest, the sampler where nothing known
can still win; the search hands them out as fixed sampler trials, and only when the
driver's performance gate would skip (``guide_of``)."""

from __future__ import annotations

from typing import Any

import pytest

from servesweep.decide.perf import Prediction, Setting
from servesweep.decide.perf.design import (
    design_point,
    first_launch,
    memory_safe,
    next_launch,
    partner,
)
from servesweep.models import Evidence, FailureClass, LevelResult, Outcome
from servesweep.records import TrialRecord
from servesweep.search import create_search
from servesweep.search.sampled import SampledSearch
from servesweep.spec import load_sweep_text
from servesweep.spec.constraints import parse_constraint
from servesweep.spec.schema import SweepSpec
from servesweep.sweep.core.predict_gate import guide_of

pytestmark = pytest.mark.unit

DRAFT = "spec"
SPACE = [
    {"seqs": s, "tokens": t, DRAFT: k}
    for s in (16, 32, 64, 128, 256)
    for t in (1024, 4096, 16384)
    for k in (0, 2, 4, 8)
]
M = "chat.c8.output_throughput"
TTFT = "chat.c1.ttft_p99_ms"


def test_the_first_launch_is_the_longest_draft_at_the_middle_of_every_other_knob() -> None:
    for seed in range(5):
        assert first_launch(SPACE, DRAFT, seed) == {"seqs": 64, "tokens": 4096, DRAFT: 8}
    # without a draft-length knob: the middle alone
    plain = [{k: v for k, v in p.items() if k != DRAFT} for p in SPACE if p[DRAFT] == 0]
    assert first_launch(plain, None, 0) == {"seqs": 64, "tokens": 4096}
    assert first_launch([], DRAFT, 0) is None


def test_two_values_equally_near_the_middle_are_chosen_by_the_seed() -> None:
    even = [{"seqs": s, DRAFT: k} for s in (32, 64, 128, 256) for k in (0, 4)]
    picks = {first_launch(even, DRAFT, seed)["seqs"] for seed in range(20)}  # type: ignore[index]
    assert picks == {64, 128}
    assert first_launch(even, DRAFT, 3) == first_launch(even, DRAFT, 3)


def test_the_second_launch_is_the_first_without_speculation() -> None:
    first = {"seqs": 64, "tokens": 4096, DRAFT: 8}
    assert partner(SPACE, DRAFT, first) == {"seqs": 64, "tokens": 4096, DRAFT: 0}
    assert partner(SPACE, DRAFT, {"seqs": 64, "tokens": 4096, DRAFT: 0}) is None
    assert partner(SPACE, None, first) is None


def test_the_design_gives_way_to_what_is_left_and_ends() -> None:
    first = {"seqs": 64, "tokens": 4096, DRAFT: 8}
    assert design_point(SPACE, DRAFT, 0, SPACE, []) == first
    # the first skipped as not fitting: the next nearest the middle at the longest draft
    left = [p for p in SPACE if p != first]
    nxt = design_point(SPACE, DRAFT, 0, left, [])
    assert nxt is not None and nxt[DRAFT] == 8 and nxt != first
    # one measured: its partner; partner gone or the design measured: over
    assert design_point(SPACE, DRAFT, 0, left, [first]) == {**first, DRAFT: 0}
    gone = [p for p in left if p != {**first, DRAFT: 0}]
    assert design_point(SPACE, DRAFT, 0, gone, [first]) is None
    measured = [first, {**first, DRAFT: 0}]
    assert design_point(SPACE, DRAFT, 0, gone, measured) is None


def test_what_was_measured_before_the_design_fills_its_roles() -> None:
    first = {"seqs": 64, "tokens": 4096, DRAFT: 8}
    # a no-draft baseline point measured first (points come before the design): the
    # longest draft length still comes next, and the baseline is the shortest's
    baseline = {"seqs": 32, "tokens": 1024, DRAFT: 0}
    left = [p for p in SPACE if p != baseline]
    assert design_point(SPACE, DRAFT, 0, left, [baseline]) == first
    done = [q for q in left if q != first]
    assert design_point(SPACE, DRAFT, 0, done, [baseline, first]) is None
    # a point between the ends: the longest, then the partner of the longest
    between = {"seqs": 16, "tokens": 1024, DRAFT: 4}
    left = [p for p in SPACE if p != between]
    assert design_point(SPACE, DRAFT, 0, left, [between]) == first
    done = [q for q in left if q != first]
    assert design_point(SPACE, DRAFT, 0, done, [between, first]) == {**first, DRAFT: 0}
    # the baseline of a draft model: a point without the drafter's params is at length 0
    space = [{}, *({"model": "d.gguf", DRAFT: k} for k in (1, 2, 4, 8, 16))]
    assert design_point(space, DRAFT, 0, space[1:], [{}]) == {"model": "d.gguf", DRAFT: 16}
    assert design_point(space, DRAFT, 0, space[1:5], [{}, space[5]]) is None


def test_where_the_longest_draft_length_is_gone_the_next_takes_its_role_once() -> None:
    space = [{}, *({DRAFT: k} for k in (1, 2, 4, 8))]
    gone = [{DRAFT: 1}, {DRAFT: 2}, {DRAFT: 4}]  # 8 skipped (not fitting) or forbidden
    assert design_point(space, DRAFT, 0, gone, [{}]) == {DRAFT: 4}
    # measured: the role is filled, and the baseline fills the other: over
    assert design_point(space, DRAFT, 0, gone[:2], [{}, {DRAFT: 4}]) is None


def p(value: float | None, low: float | None = None, high: float | None = None) -> Prediction:
    if value is None:
        return Prediction(M)
    return Prediction(M, value, low, high, "empirical")


def test_the_predicted_best_when_it_beats_the_leader() -> None:
    preds = [{M: p(90, 80, 120)}, {M: p(110, 100, 115)}, {M: p(None)}]
    assert next_launch(preds, M, "max", (), 100.0, 0.01) == 1
    assert next_launch(preds, M, "max", (), None, 0.01) == 1


def test_else_the_interval_that_reaches_farthest_and_else_the_sampler() -> None:
    preds = [{M: p(95, 90, 104)}, {M: p(98, 96, 101)}, {M: p(None)}]
    assert next_launch(preds, M, "max", (), 100.0, 0.01) == 0
    # every known one beaten by the threshold, the rest unknown: the sampler's turn
    beaten = [{M: p(95, 90, 100.5)}, {M: p(None)}]
    assert next_launch(beaten, M, "max", (), 100.0, 0.01) is None
    assert next_launch([], M, "max", (), 100.0, 0.01) is None


def test_a_configuration_a_constraint_rules_out_is_never_picked() -> None:
    limit = parse_constraint(f"{TTFT} < 100")
    over = Prediction(TTFT, 150, 130, 170, "empirical")
    under = Prediction(TTFT, 50, 40, 60, "empirical")
    preds = [{M: p(200, 190, 210), TTFT: over}, {M: p(120, 110, 130), TTFT: under}]
    assert next_launch(preds, M, "max", (limit,), 100.0, 0.01) == 1


def test_a_minimised_objective() -> None:
    preds = [{M: p(90, 80, 100)}, {M: p(95, 70, 120)}]
    assert next_launch(preds, M, "min", (), 100.0, 0.01) == 0
    assert next_launch([{M: p(104, 96, 110)}], M, "min", (), 100.0, 0.01) == 0
    assert next_launch([{M: p(110, 102, 120)}], M, "min", (), 100.0, 0.01) is None


HEAD = """\
name: s
server: {engine: sim}
workloads:
  - {name: chat, concurrency: [1, 8]}
objective: {maximize: output_throughput, workload: chat, concurrency: 8}
constraints: [chat.c1.ttft_p99_ms < 100]
params:
  grid:
    seqs: [16, 32, 64, 128, 256]
    tokens: [1024, 4096, 16384]
    spec: [0, 2, 4, 8]
"""


def sweep(search: str, head: str = HEAD) -> SweepSpec:
    return load_sweep_text(f"{head}search: {search}\n").spec


def throughput(params: dict[str, Any]) -> float:
    seqs, tokens, spec = params["seqs"], params["tokens"], params["spec"]
    return 100.0 + seqs * 0.5 + tokens / 512 - (spec - 2) ** 2 * 3


def results_of(params: dict[str, Any]) -> list[LevelResult]:
    return [
        LevelResult("chat", "c1", 0, {"ttft_p99_ms": 40.0 + params["tokens"] / 1024}),
        LevelResult("chat", "c8", 0, {"output_throughput": throughput(params)}),
    ]


SETTING = Setting(
    metrics=(M, TTFT),
    draft_param=DRAFT,
    concurrency={"chat.c8": 8, "chat.c1": 1},
    invariant={"acceptance_length": frozenset({"seqs", "tokens"})},
)


def run(
    search: SampledSearch, count: int, first: int = 1
) -> list[tuple[TrialRecord, list[LevelResult]]]:
    history: list[tuple[TrialRecord, list[LevelResult]]] = []
    for number in range(first, first + count):
        config = search.ask()
        assert config is not None
        record = TrialRecord(
            id=number,
            sweep_id=1,
            seq=number,
            fingerprint=config.fingerprint,
            params=dict(config.params),
            outcome=Outcome.OK,
            started_at=1000.0 + 10 * number,
            finished_at=1005.0 + 10 * number,
        )
        results = results_of(dict(config.params))
        history.append((record, results))
        search.tell(record, results)
    return history


def test_a_guided_search_launches_the_design_then_what_the_prediction_says() -> None:
    spec = sweep("{strategy: tpe, trials: 30, seed: 2}")
    search = create_search(spec, guide=SETTING)
    assert isinstance(search, SampledSearch)
    history = run(search, 2)
    assert [dict(t.params) for t, _ in history] == [
        {"seqs": 64, "tokens": 4096, "spec": 8},
        {"seqs": 64, "tokens": 4096, "spec": 0},
    ]
    # each a fixed trial of the sampler, told with its result
    assert [t.params for t in search.study.trials[:2]] == [
        {"seqs": 2, "tokens": 1, "spec": 3},
        {"seqs": 2, "tokens": 1, "spec": 0},
    ]
    assert all(t.values is not None for t in search.study.trials[:2])
    history += run(search, 6)
    truth = max(throughput(p) for p in SPACE)
    assert max(throughput(dict(t.params)) for t, _ in history) == truth
    # rebuilt from its stored trials, it proposes what it would have
    expected = search.ask()
    assert expected is not None
    assert create_search(spec, history, guide=SETTING).ask() == expected


def test_without_a_guide_the_search_is_the_sampler_alone() -> None:
    spec = sweep("{strategy: tpe, trials: 30, seed: 2}")
    a = [dict(t.params) for t, _ in run(create_search(spec), 8)]  # type: ignore[arg-type]
    b = [dict(t.params) for t, _ in run(create_search(spec, guide=None), 8)]  # type: ignore[arg-type]
    assert a == b
    assert a[:2] != [
        {"seqs": 64, "tokens": 4096, "spec": 8},
        {"seqs": 64, "tokens": 4096, "spec": 0},
    ]


def test_a_guided_run_continued_without_the_guide_says_why_it_diverges() -> None:
    spec = sweep("{strategy: tpe, trials: 30, seed: 2}")
    history = run(create_search(spec, guide=SETTING), 3)  # type: ignore[arg-type]
    unguided = create_search(spec, history)  # run --no-predict: the driver gives no guide
    assert unguided.notes and "continued without it" in unguided.notes[0]
    # the guide off in the file: the guide cannot be why
    off = sweep("{strategy: tpe, trials: 30, seed: 2, predict: 'off'}")
    notes = create_search(off, history).notes
    assert notes and "continued without it" not in notes[0]
    # the same guided run replayed with its guide: no divergence at all
    assert not create_search(spec, history, guide=SETTING).notes


def test_the_guide_only_where_the_performance_gate_skips() -> None:
    tpe = sweep("{strategy: tpe, seed: 1}")
    guide = guide_of(tpe, True)
    assert guide is not None and guide.metrics == (M, TTFT)
    assert guide_of(tpe, False) is None  # run --no-predict
    assert guide_of(sweep("{strategy: tpe, predict: 'off'}"), True) is None
    assert guide_of(sweep("{strategy: grid, predict: skip}"), True) is None
    two = HEAD.replace(
        "objective: {maximize: output_throughput, workload: chat, concurrency: 8}\n",
        "objective:\n  - {maximize: chat.c8.output_throughput}\n"
        "  - {minimize: chat.c1.ttft_p99_ms}\n",
    )
    assert guide_of(sweep("{strategy: tpe}", two), True) is None


def test_of_predictions_within_the_noise_of_the_best_the_surest() -> None:
    # 120 and 119 are one launch's noise apart: the narrower interval is launched
    preds = [{M: p(120, 80, 160)}, {M: p(119, 110, 128)}, {M: p(105, 104, 106)}]
    assert next_launch(preds, M, "max", (), 100.0, 0.01, tie=0.02) == 1
    assert next_launch(preds, M, "max", (), 100.0, 0.01, tie=0.0) == 0


def test_the_guide_keeps_clear_of_the_memory_margin() -> None:
    configs = [{"seqs": 64, DRAFT: 4}, {"seqs": 128, DRAFT: 4}, {"seqs": 256, DRAFT: 4}]
    # over the capacity (within the gate's margin, or the gate would skip it): left out;
    # fitting, or unknown: kept
    assert memory_safe(configs, [-5, 3, None], []) == [True, False, True]
    assert memory_safe(configs, [0, 0, 0], []) == [True, True, True]


def test_after_an_oom_crash_the_guide_leaves_what_raises_its_knobs() -> None:
    crash = {"seqs": 128, "tokens": 4096, DRAFT: 4, "dtype": "fp16"}
    configs = [
        {"seqs": 256, "tokens": 4096, DRAFT: 4, "dtype": "fp16"},  # raises every knob
        {"seqs": 128, "tokens": 4096, DRAFT: 4, "dtype": "fp16"},  # the same
        {"seqs": 256, "tokens": 2048, DRAFT: 4, "dtype": "fp16"},  # lowers one
        {"seqs": 256, "tokens": 4096, DRAFT: 4, "dtype": "fp8"},  # another dtype
        {"seqs": 256, "tokens": 8192, DRAFT: 8, "dtype": "fp16"},
    ]
    unknown: list[int | None] = [None] * len(configs)
    assert memory_safe(configs, unknown, [(crash, None)]) == [False, False, True, True, False]
    assert memory_safe(configs, unknown, []) == [True] * len(configs)
    # predicted to need less than the crashed one (a knob that lowers memory): kept
    assert memory_safe(configs, [-9, -5, -9, -9, -1], [(crash, -5)]) == [
        True,
        False,
        True,
        True,
        False,
    ]


def over(params: Any, at: float | None = None) -> int:
    """Predicted bytes beyond the capacity: the middle at the longest draft is over."""
    return int(params["seqs"] * params["tokens"] / 1024 + 40 * params[DRAFT]) - 400


def test_a_guided_search_launches_first_what_fits_without_the_margin() -> None:
    for seed in range(6):
        spec = sweep(f"{{strategy: tpe, trials: 30, seed: {seed}}}")
        search = create_search(spec, guide=SETTING, memory=over)
        assert isinstance(search, SampledSearch)
        first = search.ask()
        assert first is not None
        assert first.params[DRAFT] == 8 and over(first.params) <= 0
        assert dict(first.params) != {"seqs": 64, "tokens": 4096, DRAFT: 8}


def test_a_guided_search_does_not_raise_the_knobs_of_an_oom_crash() -> None:
    picks = set()
    for seed in range(10):
        spec = sweep(f"{{strategy: tpe, trials: 30, seed: {seed}}}")
        search = create_search(spec, guide=SETTING)
        assert isinstance(search, SampledSearch)
        first = search.ask()
        assert first is not None and dict(first.params) == {"seqs": 64, "tokens": 4096, DRAFT: 8}
        crashed = TrialRecord(
            id=1,
            sweep_id=1,
            seq=1,
            fingerprint=first.fingerprint,
            params=dict(first.params),
            outcome=Outcome.FAILED,
            failure_class=FailureClass.START_CRASH,
            evidence=Evidence(message="CUDA out of memory", reason="oom"),
            attempts=1,
            started_at=1000.0,
            finished_at=1360.0,
        )
        search.tell(crashed, [])
        second = search.ask()
        assert second is not None
        picks.add(tuple(sorted(second.params.items())))
    # the design's next nearest the middle, never the one that raises the crashed knobs
    # (64 -> 128 sequences), which ties with it
    assert picks == {(("seqs", 32), (DRAFT, 8), ("tokens", 4096))}


def test_a_resumed_guided_search_replays_with_the_memory_prediction() -> None:
    """Rebuilt from its stored trials, a guided search asks its guide again with the
    memory prediction it had when it first ran (given to it before the replay): the
    replay proposes what the first run proposed, with no note that the history is not
    the sampler's, and the next proposal is the one the first run would have made.
    Without it, the replay's first ask would be the design's middle at the longest
    draft, which is over its capacity and was never launched."""
    spec = sweep("{strategy: tpe, trials: 30, seed: 2}")
    first = create_search(spec, guide=SETTING, memory=over)
    assert isinstance(first, SampledSearch)
    history = run(first, 6)
    assert dict(history[0][0].params) == {"seqs": 64, "tokens": 1024, DRAFT: 8}
    expected = first.ask()
    assert expected is not None
    rebuilt = create_search(spec, history, guide=SETTING, memory=over)
    assert isinstance(rebuilt, SampledSearch)
    assert rebuilt.notes == [] and not rebuilt.describe()["diverged"]
    told = len(history)
    assert [t.params for t in rebuilt.study.trials[:told]] == [
        t.params for t in first.study.trials[:told]
    ]
    assert rebuilt.ask() == expected


class _Calibrating:
    """A memory prediction that a trial's end calibrates (``learned_at``): before it,
    ``over``; after it, every configuration fits (a calibration that finds the KV cache
    smaller than predicted)."""

    def __init__(self) -> None:
        self.learned_at: float | None = None

    def __call__(self, params: Any, at: float | None = None) -> int:
        learned = self.learned_at is not None and (at is None or self.learned_at <= at)
        return -1 if learned else over(params)


def test_the_replay_asks_with_the_memory_prediction_of_each_point_of_the_history() -> None:
    """The memory prediction changes during the run (the gate calibrates after each
    trial): each replayed ask reads it as of that ask (``at``: the trial's start), not
    as the whole history left it."""
    spec = sweep("{strategy: tpe, trials: 30, seed: 2}")
    memory = _Calibrating()
    search = create_search(spec, guide=SETTING, memory=memory)
    assert isinstance(search, SampledSearch)
    history = run(search, 1)
    memory.learned_at = history[0][0].finished_at
    history += run(search, 5, first=2)
    # the design's first launch gave way to one that fits before the calibration (with
    # the calibration of the end, the replay would ask for the middle itself)
    assert dict(history[0][0].params) == {"seqs": 64, "tokens": 1024, DRAFT: 8}
    assert over(dict(history[-1][0].params)) > 0  # what the calibration let in
    expected = search.ask()
    rebuilt = create_search(spec, history, guide=SETTING, memory=memory)
    assert isinstance(rebuilt, SampledSearch)
    assert rebuilt.notes == []
    assert rebuilt.ask() == expected
