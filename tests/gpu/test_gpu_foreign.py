"""A foreign GPU holder gives ``gpu_busy`` naming it (issue 6).

The holder is a plain torch process started by the test (``server/holder.py``),
without servesweep's instance tag: servesweep must neither kill it nor start a
server beside it, and must say who holds the GPU.
"""

from __future__ import annotations

from pathlib import Path

from tests.gpu.gpu_helpers import (
    GiB,
    ProcessKeeper,
    events,
    record_summary,
    report_json,
    require_gpus,
    results_dir,
    run_sweep,
    start_holder,
    total_gib,
    trial_digest,
    trigger_holder,
    write_sweep,
)


def test_foreign_holder_before_the_sweep_is_named(keeper: ProcessKeeper, tmp_path: Path) -> None:
    gpus = require_gpus(1)[:1]
    total = total_gib(gpus[0])
    out = results_dir("foreign_before", tmp_path)
    holder = start_holder(keeper, out / "holder.log", devices=gpus, gib=[round(total * 0.4)])
    results = {}
    for policy, timeout in (("fail", "120s"), ("wait", "5s")):
        (out / policy).mkdir(exist_ok=True)
        sweep = write_sweep(
            out / policy / "sweep.yaml",
            name=f"foreign-{policy}",
            script="gpu_server.py",
            gpus=gpus,
            args={"hold-gib": round(total * 0.7)},
            points=[{"layers": 2}],
            release={"foreign_holders": policy},
            timeouts={"release": timeout},
        )
        run = run_sweep(sweep, keeper, f"foreign-{policy}", timeout=120)
        results[policy] = {"exit_code": run.returncode, "stderr": run.stderr[-1500:]}
        assert run.returncode == 1, f"{policy}: {run.stdout}\n{run.stderr}"
        assert "gpu_busy" in run.stderr, run.stderr
        assert f"pid {holder.pid}" in run.stderr, run.stderr
        assert "holder.py" in run.stderr, run.stderr
        assert holder.poll() is None, "servesweep killed a process that is not its own"
        assert not (sweep.parent / "runs").exists() or not any(
            (sweep.parent / "runs").rglob("server.log")
        ), "a server was started beside the foreign holder"
    record_summary("foreign_before", {"holder_pid": holder.pid, "runs": results})


def test_foreign_holder_between_trials_fails_the_next_trial(
    keeper: ProcessKeeper, tmp_path: Path
) -> None:
    """The holder takes its memory while trial 1 benchmarks; trial 2's release gate
    finds it and stores ``gpu_busy`` naming it (policy ``fail``)."""
    gpus = require_gpus(1)[:1]
    total = total_gib(gpus[0])
    out = results_dir("foreign_between", tmp_path)
    log = out / "holder.log"
    foreign_gib = round(total * 0.35)
    holder = start_holder(keeper, log, devices=gpus, gib=[foreign_gib], wait_trigger=True)
    hold = round(total * 0.45)
    sweep = write_sweep(
        out / "sweep.yaml",
        name="foreign-mid",
        script="gpu_server.py",
        gpus=gpus,
        args={"hold-gib": hold, "front-hold-gib": 1},
        points=[{"layers": 2}, {"layers": 4}],
        workload={
            "name": "chat",
            "concurrency": [1],
            "requests": 48,
            "max_tokens": 64,
            "ignore_eos": True,
        },
    )
    triggered: list[bool] = []

    def on_poll() -> None:
        if triggered:
            return
        for e in events(sweep):
            if e["event"] == "phase" and e.get("trial") == 1 and e.get("phase") == "bench":
                trigger_holder(holder, log)
                triggered.append(True)
                return

    run = run_sweep(sweep, keeper, "foreign-mid", on_poll=on_poll)
    report = report_json(sweep, keeper)
    first, second = report["trials"]
    record_summary(
        "foreign_between",
        {
            "holder_pid": holder.pid,
            "foreign_gib": foreign_gib,
            "exit_code": run.returncode,
            "trials": [trial_digest(t) for t in report["trials"]],
        },
    )
    assert triggered, "trial 1 never reached its benchmark"
    assert first["outcome"] == "ok", first
    assert second["outcome"] == "failed" and second["failure_class"] == "gpu_busy", second
    holders = second["failure"]["gpu_holders"]
    assert any(h["pid"] == holder.pid for h in holders), holders
    assert any(h["pid"] == holder.pid and h["used_bytes"] >= foreign_gib * GiB for h in holders)
    assert str(holder.pid) in second["failure"]["summary"]
    assert holder.poll() is None, "servesweep killed a process that is not its own"
