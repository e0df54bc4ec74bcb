"""Crafted SweepData for report tests: small factories with explicit numbers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servesweep.models import (
    EvalTaskResult,
    Evidence,
    FailureClass,
    InstanceRecord,
    LevelResult,
    Outcome,
    fingerprint,
)
from servesweep.records import SweepData, SweepRecord, TelemetryPoint, TrialRecord

T0 = 1_790_000_000.0
"""Wall-clock start of every crafted sweep."""


def trial(
    tid: int,
    params: Mapping[str, Any],
    outcome: str = "ok",
    *,
    failure: str | None = None,
    evidence: Evidence | None = None,
    phases: Mapping[str, float] | None = None,
    gpus: Sequence[int] = (0, 1),
    launch_command: str | None = None,
    seq: int | None = None,
    start: float | None = None,
    in_plan: bool = True,
) -> TrialRecord:
    """A trial whose phases run back to back from ``start`` (default T0 + 100 * tid)."""
    phases = dict(
        phases
        if phases is not None
        else {"stop": 1.0, "release": 0.5, "start": 0.5, "load": 20.0, "ready": 1.0, "bench": 30.0}
    )
    begin = start if start is not None else T0 + 100.0 * tid
    started: dict[str, float] = {}
    t = begin
    for name, secs in phases.items():
        started[name] = t
        t += secs
    return TrialRecord(
        id=tid,
        sweep_id=1,
        seq=seq if seq is not None else tid,
        fingerprint=fingerprint(params),
        params=dict(params),
        outcome=Outcome(outcome),
        failure_class=FailureClass(failure) if failure else None,
        evidence=evidence,
        phase_started=started,
        phase_seconds=phases,
        instance=InstanceRecord(launcher="subprocess", pids=(1000 + tid,), gpus=tuple(gpus)),
        log_path=f"runs/{tid}/server.log",
        attempts=1,
        started_at=begin,
        finished_at=t,
        in_plan=in_plan,
        launch_command=launch_command
        if launch_command is not None
        else "vllm serve m " + " ".join(f"--{k} {v}" for k, v in params.items()),
    )


def level(
    workload: str, lvl: str, repeat: int = 0, warnings: Sequence[str] = (), **metrics: float
) -> LevelResult:
    return LevelResult(
        workload=workload,
        level=lvl,
        repeat=repeat,
        metrics=metrics,
        warnings=tuple(warnings),
        started_at=T0,
        duration_s=10.0,
    )


def eval_level(workload: str, statuses: Mapping[str, str], repeat: int = 0) -> LevelResult:
    tasks = tuple(EvalTaskResult(task_id=k, sample=0, status=v) for k, v in statuses.items())
    passed = sum(1 for v in statuses.values() if v == "pass")
    return LevelResult(
        workload=workload,
        level="c1",
        repeat=repeat,
        metrics={"pass_rate": passed / len(tasks), "passed": passed, "total": len(tasks)},
        eval_results=tasks,
        started_at=T0,
        duration_s=5.0,
    )


def sweep_data(
    trials: Sequence[TrialRecord],
    results: Mapping[int, Sequence[LevelResult]],
    *,
    telemetry: Sequence[TelemetryPoint] = (),
    objective: Mapping[str, Any] | None = None,
    constraints: Sequence[str] = (),
    name: str = "demo",
    sweep_id: int = 1,
) -> SweepData:
    return SweepData(
        sweep=SweepRecord(
            id=sweep_id,
            name=name,
            spec_path=f"{name}.yaml",
            spec_text="",
            spec_hash="h",
            created_at=T0,
            servesweep_version="0.1.0",
            environment={"gpus": ["NVIDIA H200", "NVIDIA H200"]},
        ),
        trials=tuple(trials),
        results={tid: tuple(res) for tid, res in results.items()},
        telemetry=tuple(telemetry),
        objective=objective,
        constraints=tuple(constraints),
    )


def throughput_sweep() -> SweepData:
    """Four configs of a chat workload at c1 and c8, one eval, one failure."""
    oom = Evidence(
        message="server exited while loading (exit code 1)",
        reason="oom",
        exit_code=1,
        matched_line="torch.OutOfMemoryError: CUDA out of memory on GPU 1",
        log_tail=("loading weights", "torch.OutOfMemoryError: CUDA out of memory on GPU 1"),
        log_path="runs/4/server.log",
    )
    trials = [
        trial(1, {"budget": 4, "topk": 2}),
        trial(2, {"budget": 8, "topk": 4}),
        trial(3, {"budget": 12, "topk": 6}),
        trial(
            4,
            {"budget": 16, "topk": 8},
            "failed",
            failure="start_crash",
            evidence=oom,
            phases={"stop": 1.0, "release": 0.5, "start": 0.5, "load": 12.0},
        ),
    ]
    results = {
        1: [
            level("chat", "c1", output_throughput=100.0, ttft_p99_ms=120.0, tpot_median_ms=9.0),
            level("chat", "c8", output_throughput=600.0, ttft_p99_ms=300.0, tpot_median_ms=12.0),
            eval_level("coding", {"t1": "pass", "t2": "pass", "t3": "fail"}),
        ],
        2: [
            level("chat", "c1", output_throughput=150.0, ttft_p99_ms=200.0, tpot_median_ms=6.0),
            level("chat", "c8", output_throughput=800.0, ttft_p99_ms=450.0, tpot_median_ms=9.0),
            eval_level("coding", {"t1": "pass", "t2": "pass", "t3": "pass"}),
        ],
        3: [
            level("chat", "c1", output_throughput=170.0, ttft_p99_ms=650.0, tpot_median_ms=5.0),
            level("chat", "c8", output_throughput=900.0, ttft_p99_ms=900.0, tpot_median_ms=8.0),
            eval_level("coding", {"t1": "pass", "t2": "fail", "t3": "fail"}),
        ],
        4: [],
    }
    telemetry = [
        TelemetryPoint(trial_id=tid, t=T0 + 100.0 * tid + dt, gpu=g, used_bytes=int(mib * 2**20))
        for tid in (1, 2, 3)
        for dt, mib in ((0.0, 500), (5.0, 40_000), (30.0, 70_000), (50.0, 72_000))
        for g in (0, 1)
    ]
    return sweep_data(
        trials,
        results,
        telemetry=telemetry,
        objective={"maximize": "chat.c1.output_throughput"},
        constraints=["chat.c1.ttft_p99_ms < 500"],
    )


XSS = '<script>document.title="pwned"</script><img src=x onerror="document.title=1">'
"""Hostile text a server, a model or a log could produce."""


def hostile_sweep() -> SweepData:
    """Every text field a report shows carries :data:`XSS`."""
    evidence = Evidence(
        message=f"server said {XSS}",
        reason=XSS,
        exit_code=1,
        matched_line=f"Traceback {XSS}",
        log_tail=(f"line {XSS}", "</pre></details><script>alert(1)</script>"),
        log_path=f"runs/{XSS}.log",
        timings={XSS: 1.0},
        details={XSS: XSS},
    )
    trials = [
        trial(1, {"mode": XSS, XSS: 1}, launch_command=f"serve --x '{XSS}'"),
        trial(2, {"mode": "plain", XSS: 2}),
        trial(3, {"mode": "bad", XSS: 3}, "failed", failure="start_crash", evidence=evidence),
    ]
    tasks = {XSS: "pass", "t2": "fail"}
    results = {
        1: [
            level("chat", "c1", warnings=[XSS], output_throughput=12.0, tpot_median_ms=5.0),
            level("chat", "c8", output_throughput=40.0, tpot_median_ms=9.0),
            eval_level("code", tasks),
        ],
        2: [
            level("chat", "c1", output_throughput=10.0, tpot_median_ms=4.0),
            level("chat", "c8", output_throughput=30.0, tpot_median_ms=8.0),
            eval_level("code", {XSS: "fail", "t2": "pass"}),
        ],
        3: [],
    }
    data = sweep_data(
        trials,
        results,
        telemetry=[
            TelemetryPoint(trial_id=1, t=T0 + 100.0 + dt, gpu=0, used_bytes=dt * 2**30)
            for dt in range(0, 50, 5)
        ],
        objective={"maximize": "chat.c1.output_throughput"},
        name=XSS,
    )
    sweep = data.sweep
    hostile = SweepRecord(
        id=sweep.id,
        name=XSS,
        spec_path=XSS,
        spec_text=XSS,
        spec_hash=sweep.spec_hash,
        created_at=sweep.created_at,
        servesweep_version=XSS,
        environment={XSS: XSS, "engine": XSS},
    )
    model_output = eval_level("code", tasks)
    with_message = LevelResult(
        workload=model_output.workload,
        level=model_output.level,
        repeat=0,
        metrics=model_output.metrics,
        eval_results=tuple(
            EvalTaskResult(task_id=e.task_id, sample=0, status=e.status, message=XSS)
            for e in model_output.eval_results
        ),
    )
    results[1][2] = with_message
    return SweepData(
        sweep=hostile,
        trials=data.trials,
        results={k: tuple(v) for k, v in results.items()},
        telemetry=data.telemetry,
        objective=data.objective,
        constraints=(),
    )


GRID_SPEC = """\
name: grid-demo
server: {engine: sim, gpus: [0, 1]}
params:
  grid: {budget: [0, 4, 8], topk: [1, 4]}
workloads:
  - {name: chat, concurrency: [1, 8], requests: 8, repeats: 2}
objective: {maximize: output_throughput, workload: chat, concurrency: 1}
constraints: ["chat.c8.ttft_p99_ms < 400"]
"""


def store_grid_sweep(path: Path) -> Path:
    """A results database of a 3 x 2 grid (budget x topk), two repeats per level:
    (8, 1) failed with an OOM, (8, 4) violates the constraint, the rest feasible.
    Throughput at c1 is 100 + 10 * budget * topk (+-1 between repeats)."""
    from servesweep.models import Phase, ServerConfig
    from servesweep.store import TelemetryPoint, open_store

    with open_store(path) as store:
        sweep = store.create_sweep("grid-demo", "grid.yaml", GRID_SPEC, "hash", "0.1.0")
        configs = [ServerConfig.of({"budget": b, "topk": k}) for b in (0, 4, 8) for k in (1, 4)]
        for n, rec in enumerate(store.sync_trials(sweep.id, configs)):
            t = T0 + 60.0 * n
            budget, topk = rec.params["budget"], rec.params["topk"]
            store.begin_attempt(rec.id, t, f"runs/{rec.id}/server.log", node="gpu-box", slot=0,
                                gpus=(0, 1))  # fmt: skip
            for i, phase in enumerate((Phase.STOP, Phase.RELEASE, Phase.START, Phase.LOAD)):
                store.enter_phase(rec.id, phase, t + i, 1.0 if i else None)
            store.add_telemetry(
                [TelemetryPoint(rec.id, t + dt, g, int(mib * 2**20), node="gpu-box")
                 for dt, mib in ((0.5, 500), (3.5, 60_000), (20.0, 61_000)) for g in (0, 1)]
            )  # fmt: skip
            if (budget, topk) == (8, 1):
                store.finish_trial(
                    rec.id, Outcome.FAILED, t + 6, failure_class=FailureClass.START_CRASH,
                    evidence=Evidence("server exited while loading", reason="oom",
                                      matched_line="torch.OutOfMemoryError: CUDA out of memory"),
                )  # fmt: skip
                continue
            store.enter_phase(rec.id, Phase.READY, t + 10, 7.0)
            store.enter_phase(rec.id, Phase.BENCH, t + 11, 1.0)
            for repeat, wobble in ((0, -1.0), (1, 1.0)):
                for level, tp, ttft in (
                    ("c1", 100.0 + 10 * budget * topk, 50.0 + budget),
                    ("c8", 500.0 + 40 * budget * topk, 500.0 if budget * topk == 32 else 200.0),
                ):
                    store.add_result(
                        rec.id,
                        LevelResult(
                            workload="chat", level=level, repeat=repeat, started_at=t + 11,
                            duration_s=4.0,
                            metrics={"output_throughput": tp + wobble, "ttft_p99_ms": ttft,
                                     "tpot_median_ms": 1000.0 / (20 + budget * topk),
                                     "acceptance_length": 1 + 0.1 * budget * topk},
                        ),
                    )  # fmt: skip
            store.finish_trial(rec.id, Outcome.OK, t + 20)
        store.finish_sweep(sweep.id, T0 + 400)
    return path
