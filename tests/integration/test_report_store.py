"""Reports rendered from a real results database (SQLite), finished or still running."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from servesweep.cli.main import main
from servesweep.decide.best import find_best
from servesweep.models import (
    Evidence,
    FailureClass,
    InstanceRecord,
    LevelResult,
    Outcome,
    Phase,
    ServerConfig,
)
from servesweep.report import format_best, render
from servesweep.store import Store, TelemetryPoint, open_store

SPEC = """\
name: store-demo
server: {engine: sim, gpus: [0, 1]}
params:
  grid: {budget: [4, 8, 12]}
workloads:
  - {name: chat, concurrency: [1, 8], requests: 8}
objective: {maximize: output_throughput, workload: chat, concurrency: 8}
constraints: ["chat.c1.ttft_p99_ms < 300"]
"""

T0 = 1_790_000_000.0


def _run_trial(
    store: Store, tid: int, t: float, ok: bool, metrics: dict[str, tuple[float, float]]
) -> None:
    store.begin_attempt(tid, t, f"runs/{tid}/server.log")
    for i, phase in enumerate((Phase.STOP, Phase.RELEASE, Phase.START, Phase.LOAD)):
        store.enter_phase(tid, phase, t + i, 1.0 if i else None)
    store.set_instance(
        tid,
        InstanceRecord(launcher="subprocess", pids=(4000 + tid,), gpus=(0, 1)),
        launch_command=f"python -m servesweep.sim --budget {tid * 4}",
    )
    store.add_telemetry(
        [TelemetryPoint(tid, t + dt, g, int(dt * 2**30)) for dt in (1.0, 3.0, 5.0) for g in (0, 1)]
    )
    if not ok:
        store.finish_trial(
            tid,
            Outcome.FAILED,
            t + 6,
            failure_class=FailureClass.START_CRASH,
            evidence=Evidence(
                "exited while loading", reason="oom", log_tail=("CUDA out of memory",)
            ),
        )
        return
    store.enter_phase(tid, Phase.READY, t + 10, 7.0)
    store.enter_phase(tid, Phase.BENCH, t + 11, 1.0)
    for level, (tp, ttft) in metrics.items():
        store.add_result(
            tid,
            LevelResult(
                workload="chat",
                level=level,
                repeat=0,
                metrics={"output_throughput": tp, "ttft_p99_ms": ttft},
                started_at=t + 11,
                duration_s=4.0,
            ),
        )
    store.finish_trial(tid, Outcome.OK, t + 20)


def _store(tmp_path: Path, *, finish_all: bool = True) -> Path:
    path = tmp_path / "servesweep.db"
    with open_store(path) as store:
        sweep = store.create_sweep("store-demo", "demo.yaml", SPEC, "hash", "0.1.0")
        trials = store.sync_trials(sweep.id, [ServerConfig.of({"budget": b}) for b in (4, 8, 12)])
        ids = [t.id for t in trials]
        _run_trial(store, ids[0], T0, True, {"c1": (100.0, 150.0), "c8": (500.0, 250.0)})
        _run_trial(store, ids[1], T0 + 30, True, {"c1": (120.0, 400.0), "c8": (700.0, 600.0)})
        if finish_all:
            _run_trial(store, ids[2], T0 + 60, False, {})
            store.finish_sweep(sweep.id, T0 + 70)
    return path


def test_every_format_from_the_store(tmp_path: Path) -> None:
    path = _store(tmp_path)
    with open_store(path, readonly=True) as store:
        data = store.load_sweep_data()
    assert data.objective == {"maximize": "output_throughput", "workload": "chat", "concurrency": 8}
    best = find_best(data)
    # the objective comes from the sweep file: chat.c8.output_throughput; #2 breaks c1 ttft
    assert best.objectives == (("chat.c8.output_throughput", "max"),)
    assert best.trial is not None and best.trial.params == {"budget": 4}
    assert "constraint chat.c1.ttft_p99_ms < 300 violated" in format_best(best)

    table = render(data, "table")
    assert "failed start_crash (oom)" in table
    rows = list(csv.DictReader(io.StringIO(render(data, "csv"))))
    assert len(rows) == 5 and {r["param_budget"] for r in rows} == {"4", "8", "12"}
    doc = json.loads(render(data, "json"))
    assert doc["summary"]["outcomes"] == {
        "pending": 0, "running": 0, "ok": 2, "failed": 1, "pruned": 0, "skipped": 0,
        "interrupted": 0,
    }  # fmt: skip
    # phases from the store: stop/release/start 1 s each, load 7 s (ok) / 3 s (failed)
    assert doc["summary"]["phase_seconds"]["load"] == 7.0 + 7.0 + 3.0
    assert doc["summary"]["gpu_hours"]["bench"] == (9.0 + 9.0) * 2 / 3600
    assert doc["best"]["best"]["launch_command"] == "python -m servesweep.sim --budget 4"
    html = render(data, "html")
    assert 'id="chart-timeline"' in html and 'id="chart-memory"' in html
    assert "python -m servesweep.sim --budget 4" in html


def test_report_of_a_running_sweep(tmp_path: Path) -> None:
    path = _store(tmp_path, finish_all=False)
    with open_store(path) as store:
        data = store.load_sweep_data()
        third = next(t for t in data.trials if t.outcome is Outcome.PENDING)
        store.begin_attempt(third.id, T0 + 60, None)
        store.enter_phase(third.id, Phase.LOAD, T0 + 61)
        running = store.load_sweep_data()
    table = render(running, "table")
    assert "running (load)" in table
    assert "not finished" in render(running, "html")
    assert json.loads(render(running, "json"))["summary"]["outcomes"]["running"] == 1


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as done:
        main(list(args))
    return int(done.value.code or 0)


def test_report_cli_sweep_ids_and_format_alias(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _store(tmp_path)
    assert _cli("report", str(path), "--sweep", "5") == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("servesweep: --sweep: no sweep 5 in ") and "(sweeps: 1 (store-demo))" in err
    )
    assert _cli("report", str(path), "--sweep", "1", "--format", "md") == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("## sweep store-demo (#1)") and "| trial |" in markdown
    assert _cli("best", str(path)) == 0
    empty = tmp_path / "empty.db"
    open_store(empty).close()
    assert _cli("report", str(empty)) == 2
    assert "no sweep in " in capsys.readouterr().err
