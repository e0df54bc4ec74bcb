"""The generator-health rule (bench.health), and what an unreliable level does to
best, constraints, pruning, the store and the reports."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from helpers.report_data import level, throughput_sweep
from servesweep.bench.health import assess
from servesweep.decide.best import find_best
from servesweep.decide.prune import Incumbent, PrunePolicy, prune_reason
from servesweep.decide.verdict import Goal
from servesweep.models import LevelResult, ServerConfig
from servesweep.report import render
from servesweep.spec.constraints import parse_constraint, parse_metric_ref
from servesweep.store import open_store
from servesweep.sweep.core.health_notes import HealthNotes


def test_a_lag_as_large_as_the_time_per_token_is_unreliable() -> None:
    # the case seen against a real vLLM on 2 cores: ITL 0 (chunks coalesced by the
    # late loop), TPOT 0.6 ms, loop lag 142 ms
    health = assess(
        {
            "loop_lag_p99_ms": 142.0,
            "itl_median_ms": 0.0,
            "tpot_median_ms": 0.6,
            "ttft_median_ms": 900.0,
        }
    )
    assert health.state == "unreliable"
    assert "142.0 ms (p99)" in health.reason and "TPOT p50 of 0.60 ms" in health.reason
    # against ITL when there is one; TTFT on its own too
    assert assess({"loop_lag_p99_ms": 45.0, "itl_median_ms": 10.0}).state == "unreliable"
    assert assess({"loop_lag_p99_ms": 35.0, "itl_median_ms": 10.0}).state == "mild"
    ttft = assess({"loop_lag_p99_ms": 30.0, "itl_median_ms": 50.0, "ttft_median_ms": 40.0})
    assert ttft.state == "unreliable" and "TTFT p50 of 40.0 ms" in ttft.reason


def test_a_stream_seen_in_one_read_behind_a_lagging_loop_is_unreliable() -> None:
    # seen in a full test run on a loaded 2-core machine: a 1 ms/token server, the
    # loop 42.5 ms late, every stream's 16 tokens read at once (TPOT 0): nothing per
    # token to judge the lag by, and the TTFT (121 ms) alone made it only mild
    seen = {"loop_lag_p99_ms": 42.5, "tpot_median_ms": 0.0, "ttft_median_ms": 121.4}
    health = assess(seen)
    assert health.state == "unreliable"
    assert "event loop lagged 42.5 ms (p99)" in health.reason
    assert "arrived at once (TPOT p50 of 0 ms)" in health.reason
    assert "ITL p50 of 0 ms" in assess({**seen, "itl_median_ms": 0.0}).reason
    # whole answers (stream: false) have no time per token: the TTFT alone decides
    assert assess(seen, stream=False).state == "mild"
    # under the 5 ms floor never unreliable; a time per token measured decides as before
    assert assess({**seen, "loop_lag_p99_ms": 4.0}).state == "ok"
    assert assess({**seen, "tpot_median_ms": 20.0}).state == "mild"


def test_mild_lag_and_a_healthy_generator() -> None:
    mild = assess({"loop_lag_p99_ms": 3.0, "itl_median_ms": 20.0, "ttft_median_ms": 200.0})
    assert mild.state == "mild" and "3.0 ms" in mild.reason
    # under the 2 ms floor nothing is questioned, however fast the server
    assert assess({"loop_lag_p99_ms": 1.9, "itl_median_ms": 0.5}).state == "ok"
    # under 5 ms a lag makes a level no worse than mild, however fast the server
    assert assess({"loop_lag_p99_ms": 4.5, "itl_median_ms": 0.5}).state == "mild"
    assert (
        assess({"loop_lag_p99_ms": 2.5, "itl_median_ms": 40.0, "ttft_median_ms": 400.0}).state
        == "ok"
    )
    assert assess({}).state == "ok"


def test_an_arrival_schedule_it_could_not_keep_is_unreliable() -> None:
    # 100 req/s: one arrival every 10 ms; sends 6 ms late at p99
    late = assess({"schedule_lag_p99_ms": 6.0, "loop_lag_p99_ms": 1.0}, rate=100.0)
    assert late.state == "unreliable" and "every 10.0 ms" in late.reason
    assert assess({"schedule_lag_p99_ms": 6.0}, rate=1.0).state == "mild"
    # a closed loop has no schedule to keep
    assert assess({"schedule_lag_p99_ms": 60.0}).state == "ok"


def _unreliable(result: LevelResult, why: str = "the load generator lagged 50 ms") -> LevelResult:
    return dataclasses.replace(result, unreliable=why)


def test_best_and_constraints_leave_unreliable_levels_out_unless_told() -> None:
    data = throughput_sweep()
    assert find_best(data).trial.id == 2  # type: ignore[union-attr]
    results = dict(data.results)
    results[2] = (_unreliable(results[2][0]), *results[2][1:])
    flagged = dataclasses.replace(data, results=results)
    best = find_best(flagged)
    assert best.trial is not None and best.trial.id == 1
    (why,) = [e for e in best.excluded if e.trial.id == 2]
    assert why.kind == "unreliable" and "chat.c1 is unreliable" in why.reason
    assert find_best(flagged, include_unreliable=True).trial.id == 2  # type: ignore[union-attr]
    told = dataclasses.replace(flagged, include_unreliable=True)
    assert find_best(told).trial.id == 2  # type: ignore[union-attr]
    # a constraint's level alone unreliable: excluded, not "missing metric"
    results[2] = (results[2][0], _unreliable(results[2][1]), *results[2][2:])
    results[2] = (dataclasses.replace(results[2][0], unreliable=None), *results[2][1:])
    by_c8 = find_best(
        dataclasses.replace(data, results=results), constraints=["chat.c8.ttft_p99_ms < 500"]
    )
    (why,) = [e for e in by_c8.excluded if e.trial.id == 2]
    assert why.kind == "unreliable" and "constraint" in why.reason


def test_pruning_and_the_search_do_not_judge_by_an_unreliable_level() -> None:
    goal = Goal(
        ((parse_metric_ref("chat.c1.output_throughput"), "max"),),
        (parse_constraint("chat.c1.ttft_p99_ms < 500"),),
    )
    policy = PrunePolicy(goal, front=(Incumbent((1000.0,), (0.0,), trial=1),))
    slow = level("chat", "c1", output_throughput=10.0, ttft_p99_ms=900.0)
    assert prune_reason(policy, [slow]) is not None
    assert prune_reason(policy, [_unreliable(slow)]) is None
    taken = PrunePolicy(dataclasses.replace(goal, include_unreliable=True), front=policy.front)
    assert prune_reason(taken, [_unreliable(slow)]) is not None


def test_the_store_keeps_the_reason_and_the_reports_mark_it(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.db")
    sweep = store.create_sweep("demo", "demo.yaml", "name: demo", "h", "0.1.0")
    (trial,) = store.sync_trials(sweep.id, [ServerConfig.of({"budget": 4})])
    store.begin_attempt(trial.id, 1.0, None)
    flagged = _unreliable(level("chat", "c8", output_throughput=5.0), "lagged 9 ms")
    store.add_result(trial.id, flagged)
    store.add_result(trial.id, level("chat", "c1", output_throughput=5.0))
    assert [r.unreliable for r in store.results(trial.id)] == ["lagged 9 ms", None]
    store.close()

    data = throughput_sweep()
    results = dict(data.results)
    results[2] = (_unreliable(results[2][0], "lagged 50 ms against a TPOT p50 of 6 ms"),)
    flagged_data = dataclasses.replace(data, results=results)
    table = render(flagged_data, "table", width=200)
    assert "c1*" in table and "lagged 50 ms against a TPOT p50 of 6 ms" in table
    assert "include_unreliable" in table
    doc = json.loads(render(flagged_data, "json"))
    (row,) = [t for t in doc["trials"] if t["id"] == 2]
    assert row["results"][0]["unreliable"] == "lagged 50 ms against a TPOT p50 of 6 ms"
    csv_text = render(flagged_data, "csv")
    assert "unreliable" in csv_text.splitlines()[0]
    assert "lagged 50 ms against a TPOT p50 of 6 ms" in csv_text
    html = render(flagged_data, "html")
    assert "c1 (unreliable)" in html


def test_the_lag_is_said_once_per_sweep_in_one_line() -> None:
    notes = HealthNotes()

    def with_health(state: str, reason: str) -> LevelResult:
        return dataclasses.replace(
            level("chat", "c8"), info={"generator_health": {"state": state, "reason": reason}}
        )

    first = notes.note(1, with_health("mild", "lagged 3 ms"))
    assert first is not None and "\n" not in first
    assert "workloads[].workers" in first and "remain usable" in first
    assert notes.note(2, with_health("mild", "lagged 4 ms")) is None
    bad = notes.note(2, with_health("unreliable", "lagged 40 ms"))
    assert bad is not None and "stored as unreliable" in bad and "workloads[].workers" in bad
    assert notes.note(3, with_health("unreliable", "lagged 41 ms")) is None
    assert notes.note(3, with_health("ok", "")) is None


def test_an_old_database_without_the_column_reads_as_reliable(tmp_path: Path) -> None:
    import sqlite3

    from servesweep.store.schema import CREATE_V1, MIGRATIONS

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(CREATE_V1)
    db.executescript(MIGRATIONS[1])
    db.execute("INSERT INTO meta(key, value) VALUES ('schema_version', '2')")
    db.execute(
        "INSERT INTO sweeps(name, spec_path, spec_text, spec_hash, created_at, "
        "servesweep_version) VALUES ('old', 'old.yaml', 'name: old', 'h', 1.0, '0.1.0')"
    )
    db.execute(
        "INSERT INTO trials(sweep_id, seq, fingerprint, params, outcome, attempts) "
        "VALUES (1, 0, 'abc', '{}', 'ok', 1)"
    )
    db.execute(
        "INSERT INTO results(trial_id, attempt, workload, level, repeat, metrics, started_at, "
        "duration_s) VALUES (1, 1, 'chat', 'c1', 0, '{\"output_throughput\": 5}', 1.0, 1.0)"
    )
    db.commit()
    db.close()
    with open_store(path, readonly=True) as old:
        assert [r.unreliable for r in old.results(1)] == [None]
    with open_store(path) as upgraded:
        assert [r.unreliable for r in upgraded.results(1)] == [None]
