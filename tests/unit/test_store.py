"""The SQLite store: state changes are committed, resume-relevant questions answered."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from servesweep.errors import StoreError
from servesweep.models import (
    EvalTaskResult,
    Evidence,
    FailureClass,
    GpuHolder,
    InstanceRecord,
    LevelResult,
    Outcome,
    Phase,
    RequestSample,
    ServerConfig,
)
from servesweep.store import TelemetryPoint, open_store
from servesweep.store.schema import SCHEMA_VERSION


def _configs(*budgets: int) -> list[ServerConfig]:
    return [ServerConfig.of({"budget": b, "topk": 4}) for b in budgets]


def test_create_and_sync_trials(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.db")
    sweep = store.create_sweep("demo", "demo.yaml", "name: demo", "h1", "0.1.0")
    trials = store.sync_trials(sweep.id, _configs(4, 8))
    assert [t.params["budget"] for t in trials] == [4, 8]
    assert all(t.outcome is Outcome.PENDING for t in trials)
    # an edited grid keeps history and adds new points
    trials = store.sync_trials(sweep.id, _configs(8, 16))
    assert [t.params["budget"] for t in trials] == [8, 16]
    everything = store.trials(sweep.id)
    assert {t.params["budget"]: t.in_plan for t in everything} == {4: False, 8: True, 16: True}


def test_phases_outcome_and_evidence_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = open_store(path)
    sweep = store.create_sweep("demo", "demo.yaml", "name: demo", "h1", "0.1.0")
    (trial,) = store.sync_trials(sweep.id, _configs(4))
    store.begin_attempt(trial.id, 100.0, "runs/1/server.log")
    store.enter_phase(trial.id, Phase.STOP, 100.0)
    store.enter_phase(trial.id, Phase.RELEASE, 101.5, 1.5)  # the slot measured 1.5 s of stop
    store.enter_phase(trial.id, Phase.START, 104.0, 2.5)
    evidence = Evidence(
        message="memory not released",
        gpu_holders=(GpuHolder(pid=7, used_bytes=2**30, name="python"),),
        log_tail=("a", "b"),
    )
    store.finish_trial(
        trial.id, Outcome.FAILED, 104.5, failure_class=FailureClass.GPU_BUSY, evidence=evidence
    )
    store.close()

    again = open_store(path)
    got = again.trial(trial.id)
    assert got.outcome is Outcome.FAILED
    assert got.failure_class is FailureClass.GPU_BUSY
    assert got.evidence == evidence
    assert got.phase_seconds == {"stop": 1.5, "release": 2.5, "start": 0.5}
    assert got.attempts == 1


def test_results_of_latest_attempt_only(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.db")
    sweep = store.create_sweep("demo", "demo.yaml", "name: demo", "h1", "0.1.0")
    (trial,) = store.sync_trials(sweep.id, _configs(4))
    sample = RequestSample(
        index=0,
        ok=True,
        sent_at=0.0,
        first_token_at=0.1,
        finished_at=0.5,
        completion_tokens=5,
        chunk_gaps=(0.1, 0.1),
        chunk_tokens=(1, 2, 2),
    )
    store.begin_attempt(trial.id, 1.0, None)
    store.add_result(trial.id, LevelResult("chat", "c1", 0, {"ttft_p99_ms": 100.0}, (sample,)))
    store.begin_attempt(trial.id, 2.0, None)
    result = LevelResult(
        "coding",
        "eval",
        0,
        {"pass_rate": 0.5},
        eval_results=(EvalTaskResult("t1", 0, "pass"), EvalTaskResult("t2", 0, "fail", "boom")),
    )
    store.add_result(trial.id, result)
    (got,) = store.results(trial.id)
    assert got.workload == "coding"
    assert got.metrics == {"pass_rate": 0.5}
    assert [e.status for e in got.eval_results] == ["pass", "fail"]


def test_samples_round_trip(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.db")
    sweep = store.create_sweep("demo", "demo.yaml", "name: demo", "h1", "0.1.0")
    (trial,) = store.sync_trials(sweep.id, _configs(4))
    store.begin_attempt(trial.id, 1.0, None)
    sample = RequestSample(
        index=3, ok=False, error="http_500", sent_at=0.25, chunk_gaps=(0.01,), chunk_tokens=(3,)
    )
    store.add_result(trial.id, LevelResult("chat", "c8", 1, {"failed": 1.0}, (sample,)))
    (got,) = store.results(trial.id)
    assert got.samples == (sample,)
    assert got.repeat == 1


def test_live_instances_and_history(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.db")
    sweep = store.create_sweep("demo", "demo.yaml", "name: demo", "h1", "0.1.0")
    a, _b = store.sync_trials(sweep.id, _configs(4, 8))
    inst = InstanceRecord(launcher="subprocess", pids=(123,), pgid=123, port=8000, gpus=(0,))
    store.begin_attempt(a.id, 0.0, None)
    store.set_instance(a.id, inst, launch_command="sim --budget 4")
    assert [t.id for t in store.live_instances(sweep.id)] == [a.id]
    assert store.trial(a.id).instance == inst
    store.mark_instance_gone(a.id)
    assert store.live_instances(sweep.id) == []
    store.enter_phase(a.id, Phase.LOAD, 10.0)
    store.finish_trial(a.id, Outcome.OK, 14.0)
    assert store.phase_history("demo") == {"load": 4.0}
    assert store.trial(a.id).phase is Phase.DONE


def test_telemetry_and_sweep_data(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.db")
    sweep = store.create_sweep("demo", "demo.yaml", "name: demo", "h1", "0.1.0")
    (trial,) = store.sync_trials(sweep.id, _configs(4))
    store.add_telemetry([TelemetryPoint(trial.id, 5.0, 0, 2**30, 50.0, 300.0)])
    data = store.load_sweep_data(name="demo")
    assert data.sweep.id == sweep.id
    assert data.telemetry[0].used_bytes == 2**30
    levels_only = store.load_sweep_data(sweep.id, with_samples=False, with_telemetry=False)
    assert levels_only.telemetry == () and levels_only.trials == data.trials
    with pytest.raises(StoreError, match="no sweep named 'other'"):
        store.load_sweep_data(name="other")


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    open_store(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer servesweep"):
        open_store(path)


def test_readonly_missing_database(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no results database"):
        open_store(tmp_path / "missing.db", readonly=True)


def test_garbage_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="cannot open results database"):
        open_store(path)


def test_version_1_database_is_migrated_and_keeps_its_trials(tmp_path: Path) -> None:
    from servesweep.store.schema import CREATE_V1

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(CREATE_V1)
    db.execute("INSERT INTO meta(key, value) VALUES ('schema_version', '1')")
    db.execute(
        "INSERT INTO sweeps(name, spec_path, spec_text, spec_hash, created_at, "
        "servesweep_version) VALUES ('old', 'old.yaml', 'name: old', 'h', 1.0, '0.1.0')"
    )
    db.execute(
        "INSERT INTO trials(sweep_id, seq, fingerprint, params, outcome) "
        "VALUES (1, 0, 'abc', '{\"budget\": 4}', 'ok')"
    )
    db.commit()
    db.close()
    store = open_store(path)
    (trial,) = store.trials(1)
    assert trial.outcome is Outcome.OK and trial.params == {"budget": 4}
    assert (trial.node, trial.slot, trial.gpus) == ("", None, ())
    version = store._query("SELECT value FROM meta WHERE key='schema_version'")[0][0]
    assert int(version) >= 2


def test_attempt_records_where_it_ran(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.db")
    sweep = store.create_sweep("demo", "demo.yaml", "name: demo", "h1", "0.1.0")
    (trial,) = store.sync_trials(sweep.id, _configs(4))
    store.begin_attempt(trial.id, 100.0, None, node="gpu-a", node_id="n1", slot=2, gpus=[4, 5])
    store.finish_trial(trial.id, Outcome.PRUNED, 110.0, evidence=Evidence("cannot win"))
    store.add_telemetry([TelemetryPoint(trial.id, 101.0, 4, 2**30, node="gpu-a")])
    done = store.trial(trial.id)
    assert (done.node, done.node_id, done.slot, done.gpus) == ("gpu-a", "n1", 2, (4, 5))
    assert done.lane == "gpu-a/2"
    assert done.gpu_seconds == pytest.approx(20.0)
    assert done.outcome is Outcome.PRUNED and done.outcome.final
    assert store.telemetry(sweep.id)[0].node == "gpu-a"


def test_environment_failures_never_blame_the_config() -> None:
    blamed = {c for c in FailureClass if c.blames_config}
    assert FailureClass.GPU_BUSY not in blamed
    assert FailureClass.NODE_LOST not in blamed
    assert {FailureClass.START_CRASH, FailureClass.INVALID_ARGS} <= blamed


def test_version_2_database_gains_intervals_and_reports_compute_them(tmp_path: Path) -> None:
    """A level stored before intervals existed: the upgrade adds the columns, and the
    report computes the interval from the level's stored requests."""
    from servesweep.decide.stats import aggregate_levels
    from servesweep.store.schema import CREATE_V1, MIGRATIONS

    path = tmp_path / "v2.db"
    db = sqlite3.connect(path)
    db.executescript(CREATE_V1)
    db.executescript(MIGRATIONS[1])
    db.execute("INSERT INTO meta(key, value) VALUES ('schema_version', '2')")
    db.execute(
        "INSERT INTO sweeps(name, spec_path, spec_text, spec_hash, created_at, "
        "servesweep_version) VALUES ('old', 'old.yaml', '', 'h', 1.0, '0.1.0')"
    )
    db.execute(
        "INSERT INTO trials(sweep_id, seq, fingerprint, params, outcome, attempts) "
        "VALUES (1, 0, 'abc', '{\"budget\": 4}', 'ok', 1)"
    )
    db.execute(
        "INSERT INTO results(trial_id, attempt, workload, level, repeat, metrics, started_at, "
        "duration_s) VALUES (1, 1, 'chat', 'c1', 0, '{\"ttft_median_ms\": 23.0, "
        '"duration_s": 2.0}\', 1.0, 2.0)'
    )
    for i in range(20):
        db.execute(
            "INSERT INTO samples(result_id, idx, ok, sent_at, first_token_at, finished_at, "
            "completion_tokens, chunk_gaps, chunk_tokens) VALUES (1, ?, 1, ?, ?, ?, 3, "
            "'[0.01, 0.01]', '[1, 1, 1]')",
            (i, i * 0.1, i * 0.1 + 0.02 + 0.001 * (i % 7), i * 0.1 + 0.05),
        )
    db.commit()
    db.close()
    store = open_store(path)
    version = store._query("SELECT value FROM meta WHERE key='schema_version'")[0][0]
    assert int(version) == SCHEMA_VERSION
    data = store.load_sweep_data()
    (res,) = data.results[1]
    assert res.intervals == {} and res.confidence is None
    (lvl,) = aggregate_levels(data, 1)
    stats = lvl.metrics["ttft_median_ms"]
    assert stats.lo is not None and stats.hi is not None and stats.lo <= 23.0 <= stats.hi


def test_intervals_round_trip(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.db")
    sweep = store.create_sweep("demo", "demo.yaml", "name: demo", "h1", "0.1.0")
    (trial,) = store.sync_trials(sweep.id, _configs(4))
    store.begin_attempt(trial.id, 100.0, None)
    result = LevelResult(
        "chat",
        "c1",
        0,
        {"output_throughput": 200.0},
        intervals={"output_throughput": (195.0, 205.5)},
        confidence=0.95,
    )
    store.add_result(trial.id, result)
    (back,) = store.results(trial.id)
    assert back.intervals == {"output_throughput": (195.0, 205.5)} and back.confidence == 0.95


def test_the_store_keeps_the_phase_durations_the_slot_measured(tmp_path: Path) -> None:
    """One clock: the slot times phases; the store adds up what it is told (a phase
    entered again in another launch) and times only a phase no slot ended."""
    store = open_store(tmp_path / "s.db")
    sweep = store.create_sweep("demo", "demo.yaml", "name: demo", "h1", "0.1.0")
    a, b = store.sync_trials(sweep.id, _configs(4, 8))
    store.begin_attempt(a.id, 100.0, None)
    store.enter_phase(a.id, Phase.START, 100.0)
    store.enter_phase(a.id, Phase.BENCH, 110.0, 2.0)  # stamps 10 s apart; the slot measured 2
    store.enter_phase(a.id, Phase.START, 120.0, 3.0)
    store.enter_phase(a.id, Phase.BENCH, 130.0, 4.0)
    store.finish_trial(a.id, Outcome.OK, 140.0, last_phase_seconds=5.0)
    assert store.trial(a.id).phase_seconds == {"start": 6.0, "bench": 8.0}
    store.begin_attempt(b.id, 100.0, None)
    store.enter_phase(b.id, Phase.LOAD, 100.0)
    store.finish_trial(b.id, Outcome.INTERRUPTED, 107.0)  # the sweep stopped: no slot said
    assert store.trial(b.id).phase_seconds == {"load": 7.0}
