"""A sweep starts where its earlier sweeps left off (issue 34): which earlier sweeps
count (``sweep.core.earlier``: the same name, engine, model, GPUs and workloads), and a
sampling search's guide started warm from their measurements: no design, the predicted
best first, the leader this sweep's own."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.test_perf_design import DRAFT, SETTING, SPACE, M, run, sweep, throughput

from servesweep.decide.perf import Measured, predict
from servesweep.decide.perf.design import first_launch
from servesweep.decide.perf.inputs import measured_of
from servesweep.errors import ConfigError
from servesweep.models import LevelResult, Outcome, ServerConfig
from servesweep.records import SweepRecord
from servesweep.search import create_search
from servesweep.search.sampled import SampledSearch
from servesweep.spec import load_sweep_text
from servesweep.store import Store, open_store
from servesweep.sweep.core.earlier import GPU_NAMES, earlier_sweeps, why_not_earlier
from servesweep.sweep.core.predict_gate import PredictGate

pytestmark = pytest.mark.unit


def earlier_measurements(seed: int, count: int) -> list[Measured]:
    """What an earlier sweep (another seed, guided cold) measured."""
    search = create_search(sweep(f"{{strategy: tpe, trials: 30, seed: {seed}}}"), guide=SETTING)
    assert isinstance(search, SampledSearch)
    return list(measured_of(run(search, count)))


def test_a_guide_started_warm_launches_the_predicted_best_first_without_the_design() -> None:
    earlier = earlier_measurements(11, 8)
    spec = sweep("{strategy: tpe, trials: 30, seed: 2}")
    search = create_search(spec, guide=SETTING, earlier=earlier)
    assert isinstance(search, SampledSearch)
    predictions = predict(SETTING, SPACE, [], earlier)
    known = [i for i, p in enumerate(predictions) if p[M].value is not None]
    best = max(known, key=lambda i: predictions[i][M].value or 0.0)
    first = search.ask()
    assert first is not None and dict(first.params) == SPACE[best]
    assert SPACE[best] != first_launch(SPACE, DRAFT, 2)  # not the design's middle
    # the earlier sweep's best is what this sweep verifies first: within the earlier's
    # own measurements, the best it measured
    measured_best = max(earlier, key=lambda m: m.metrics[M])
    assert dict(first.params) == dict(measured_best.params)


def test_a_warm_guide_is_told_its_own_trials_and_resumes_where_it_was() -> None:
    earlier = earlier_measurements(11, 8)
    spec = sweep("{strategy: tpe, trials: 30, seed: 2}")
    search = create_search(spec, guide=SETTING, earlier=earlier)
    assert isinstance(search, SampledSearch)
    history = run(search, 4)
    # none of its first launches is the design's second (the middle without a draft)
    assert {"seqs": 64, "tokens": 4096, DRAFT: 0} not in [dict(t.params) for t, _ in history]
    # the leader is this sweep's own: its best measured, not the earlier sweep's
    assert search._leader() == max(throughput(dict(t.params)) for t, _ in history)
    expected = search.ask()
    assert expected is not None
    again = create_search(spec, history, guide=SETTING, earlier=earlier)
    assert again.ask() == expected
    assert not again.notes  # the replay proposed what was stored


def test_without_earlier_sweeps_or_a_guide_nothing_changes() -> None:
    spec = sweep("{strategy: tpe, trials: 30, seed: 2}")
    cold = [dict(t.params) for t, _ in run(create_search(spec, guide=SETTING), 4)]
    none = create_search(spec, guide=SETTING, earlier=[])
    assert [dict(t.params) for t, _ in run(none, 4)] == cold
    assert cold[:2] == [
        {"seqs": 64, "tokens": 4096, DRAFT: 8},
        {"seqs": 64, "tokens": 4096, DRAFT: 0},
    ]
    # --no-predict: no guide, and the earlier measurements are not used
    earlier = earlier_measurements(11, 4)
    plain = [dict(t.params) for t, _ in run(create_search(spec), 4)]
    ignored = create_search(spec, guide=None, earlier=earlier)
    assert [dict(t.params) for t, _ in run(ignored, 4)] == plain


SWEEP = """\
name: warm
server: {engine: vllm, model: m1, args: {tensor-parallel-size: 1}}
workloads: [{name: chat, concurrency: [1, 8], max_tokens: 128}]
objective: {maximize: output_throughput, workload: chat, concurrency: 8}
params: {grid: {max-num-seqs: [8, 16, 32]}}
search: {strategy: tpe, trials: 3}
"""


def record(sweep_id: int, text: str = SWEEP, name: str = "warm", **env: str) -> SweepRecord:
    return SweepRecord(sweep_id, name, "s.yaml", text, "h", 0.0, "0", environment=env)


def test_an_earlier_sweep_counts_with_the_same_name_engine_model_gpus_and_workloads() -> None:
    spec = load_sweep_text(SWEEP).spec
    env = {GPU_NAMES: "NVIDIA H100 80GB HBM3"}

    def why(earlier: SweepRecord) -> str | None:
        try:
            old = load_sweep_text(earlier.spec_text).spec
        except ConfigError:
            old = None
        return why_not_earlier(spec, env, earlier, old)

    assert why(record(1, **env)) is None
    assert why(record(1)) is None  # GPUs not recorded (not run yet, a Ray site): not told apart
    assert why(record(1, text=SWEEP.replace("trials: 3", "trials: 9"))) is None  # search only
    assert why(record(1, name="other")) == "another name ('other')"
    model = why(record(1, text=SWEEP.replace("model: m1", "model: m2")))
    assert model is not None and "server.model ('m2' -> 'm1')" in model
    tp = why(record(1, text=SWEEP.replace("tensor-parallel-size: 1", "tensor-parallel-size: 2")))
    assert tp is not None and "server.args" in tp
    engine = why(record(1, text=SWEEP.replace("engine: vllm", "engine: sglang")))
    assert engine is not None and "server.engine" in engine
    workload = why(record(1, text=SWEEP.replace("max_tokens: 128", "max_tokens: 256")))
    assert workload is not None and "workload 'chat'" in workload
    gpus = why(record(1, **{GPU_NAMES: "NVIDIA A100-SXM4-80GB"}))
    assert gpus == "it ran on other GPUs (NVIDIA A100-SXM4-80GB -> NVIDIA H100 80GB HBM3)"
    assert why(record(1, text="name: warm\nserver: [")) == (
        "its sweep file cannot be read by this servesweep"
    )


def _measure(db: Store, sweep_id: int, seqs: int, value: float) -> None:
    trial = db.ensure_trial(sweep_id, ServerConfig.of({"max-num-seqs": seqs}), in_plan=True)
    db.begin_attempt(trial.id, 1.0, None)
    db.add_result(trial.id, LevelResult("chat", "c8", 0, {"output_throughput": value}))
    db.finish_trial(trial.id, Outcome.OK, 2.0)


def test_the_gate_and_the_guide_start_from_the_sweeps_that_count(tmp_path: Path) -> None:
    spec = load_sweep_text(SWEEP).spec
    other_model = SWEEP.replace("model: m1", "model: m2")
    with open_store(tmp_path / "r.db") as db:
        same = db.create_sweep("warm", "s.yaml", SWEEP, "h", "0")
        _measure(db, same.id, 16, 900.0)
        changed = db.create_sweep("warm", "s.yaml", other_model, "h2", "0")
        _measure(db, changed.id, 32, 5000.0)
        elsewhere = db.create_sweep("another", "a.yaml", SWEEP.replace("warm", "another"), "h", "0")
        _measure(db, elsewhere.id, 8, 7000.0)
        this = db.create_sweep("warm", "s.yaml", SWEEP, "h", "0")
        past = earlier_sweeps(db, spec, this)
        assert past.ids == [same.id]
        assert [(s.id, why.split(":")[0]) for s, why in past.left_out] == [
            (changed.id, "it measured under other settings")
        ]
        gate = PredictGate(spec, db, this, enabled=True)
        assert [m.metrics["chat.c8.output_throughput"] for m in gate.earlier] == [900.0]
        assert gate.notes[0] == (
            "the performance prediction starts warm from 1 measured trial(s) of earlier "
            f"sweep(s) #{same.id} (same name, engine, model, GPUs and workloads)"
        )
        assert gate.notes[1].startswith(
            f"earlier sweep #{changed.id} of the same name does not start the performance "
            "prediction: it measured under other settings: server.model"
        )
        off = PredictGate(spec, db, this, enabled=False)  # run --no-predict
        assert off.earlier == [] and off.notes == []
        first = earlier_sweeps(db, spec, same)  # the first of its name: nothing before it
        assert first.ids == [] and first.left_out == () and first.notes(0) == []
        assert earlier_sweeps(db, spec, None).ids == [same.id, this.id]  # plan, none yet
