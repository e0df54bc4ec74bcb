"""Parallel slots on real GPUs: trials of 1 and 2 GPUs packed together (tensor parallel
over NCCL for the 2-GPU ones), and an orphan on one slot's GPU cleaned without
touching the other slot. Needs NVML to show at least 2 GPUs (skipped, saying so, on
one).

Every instance of ``tests/gpu/server/tp_server.py`` holds more than half of each GPU
it is given, so two instances can never share a GPU: a wrong placement fails.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from tests.gpu.gpu_helpers import (
    ProcessKeeper,
    events,
    gpu_count,
    record_summary,
    report_json,
    require_gpus,
    results_dir,
    run_sweep,
    servesweep,
    total_gib,
    trial_digest,
    write_sweep,
)

from servesweep.store import open_store

_ORPHAN_PID = re.compile(r"started worker \d+: pid (\d+)")
_SERVER_ARGS = {"pinned-gib": 2, "heads": 16, "hidden": 2048, "layers": 2}


def _points(hold: int) -> list[dict[str, Any]]:
    return [
        {"tp": 2, "hold-gib": hold, "batch": 4},
        {"tp": 2, "hold-gib": hold, "batch": 8},
        {"tp": 1, "hold-gib": hold, "batch": 4},
        {"tp": 1, "hold-gib": hold, "batch": 8},
        {"tp": 1, "hold-gib": hold, "batch": 16},
        {"tp": 1, "hold-gib": hold, "batch": 2},
    ]


def _with_slots(sweep: Path, gpus_per_trial: str) -> None:
    import yaml

    spec = yaml.safe_load(sweep.read_text())
    spec["server"]["gpus_per_trial"] = gpus_per_trial
    sweep.write_text(yaml.safe_dump(spec, sort_keys=False))


def _makespan(trials: list[dict[str, Any]]) -> float:
    return max(t["finished_at"] for t in trials) - min(t["started_at"] for t in trials)


def _no_shared_gpu(trials: list[dict[str, Any]]) -> None:
    spans = [
        (
            t["phase_started"].get("start") or t["started_at"],
            t["finished_at"],
            set(t["gpus"]),
            t["id"],
        )
        for t in trials
    ]
    for (b1, e1, g1, t1), (b2, e2, g2, t2) in itertools.combinations(spans, 2):
        if b1 < e2 and b2 < e1:
            assert not g1 & g2, f"trials {t1} and {t2} ran at once on GPUs {g1 & g2}"


def _releases(db: Path) -> list[dict[str, Any]]:
    with open_store(db, readonly=True) as store:
        return [
            {"trial": e["trial"], "gpus": e.get("gpus"), "seconds": e.get("seconds")}
            for e in store.events(1, "released")
            if e.get("polls")
        ]


def test_parallel_slots_pack_tp1_and_tp2_against_sequential(
    keeper: ProcessKeeper, tmp_path: Path
) -> None:
    require_gpus(2)
    gpus = list(range(gpu_count()))
    total = min(total_gib(g) for g in gpus)
    hold = round(total * 0.55)
    results: dict[str, Any] = {}
    for mode in ("parallel", "sequential"):
        out = results_dir(f"parallel_{mode}", tmp_path)
        sweep = write_sweep(
            out / "sweep.yaml",
            name=f"par-{mode}",
            script="tp_server.py",
            gpus=gpus,
            args=_SERVER_ARGS,
            points=_points(hold),
            workload={"name": "chat", "concurrency": [1, 4], "requests": 16, "max_tokens": 32},
        )
        _with_slots(sweep, "{param.tp}")
        if mode == "parallel":
            run = run_sweep(sweep, keeper, f"par-{mode}", timeout=900)
        else:
            keeper.tag_prefixes.append(f"par-{mode}-")
            run = servesweep(
                ["run", str(sweep), "-q", "--slots", "1"], out, "run", keeper, timeout=1500
            )
        report = report_json(sweep, keeper)
        trials = report["trials"]
        results[mode] = {
            "exit_code": run.returncode,
            "seconds": run.seconds,
            "makespan_s": _makespan(trials),
            "trials": [trial_digest(t) | {"gpus": t["gpus"]} for t in trials],
            "releases": _releases(out / "servesweep.db"),
        }
        assert run.returncode == 0, f"{mode}: {run.stdout}\n{run.stderr}"
        assert all(t["outcome"] == "ok" for t in trials), json.dumps(results[mode], indent=1)
        for t in trials:
            assert len(t["gpus"]) == t["params"]["tp"], t
        _no_shared_gpu(trials)
    record_summary("parallel_slots", {"gpus": gpus, "hold_gib": hold, **results})
    assert results["parallel"]["makespan_s"] < results["sequential"]["makespan_s"]


def test_orphan_on_one_slot_is_cleaned_without_touching_the_other(
    keeper: ProcessKeeper, tmp_path: Path
) -> None:
    gpus = require_gpus(2)[:2]
    total = min(total_gib(g) for g in gpus)
    hold = round(total * 0.55)
    out = results_dir("parallel_orphan", tmp_path)
    sweep = write_sweep(
        out / "sweep.yaml",
        name="par-orphan",
        script="tp_server.py",
        gpus=gpus,
        args={**_SERVER_ARGS, "tp": 1},
        points=[
            {"hold-gib": hold, "batch": 4, "orphan-workers": True},
            {"hold-gib": hold, "batch": 8},
            {"hold-gib": hold, "batch": 16},
        ],
        workload={"name": "chat", "concurrency": [1], "requests": 400, "max_tokens": 32},
    )
    _with_slots(sweep, "1")
    killed: dict[str, Any] = {}

    def kill_first_front() -> None:
        if killed:
            return
        evs = events(sweep)
        benching = {e["trial"] for e in evs if e["event"] == "phase" and e["phase"] == "bench"}
        if not {1, 2} <= benching:
            return
        (first,) = [e for e in evs if e["event"] == "instance" and e["trial"] == 1]
        pid = first["instance"]["pids"][0]
        os.kill(pid, signal.SIGKILL)  # the front only: its worker is orphaned on its GPU
        killed.update({"pid": pid, "at": time.time()})

    run = run_sweep(sweep, keeper, "par-orphan", timeout=900, on_poll=kill_first_front)
    report = report_json(sweep, keeper)
    trials = {t["id"]: t for t in report["trials"]}
    # the orphan is ended by the next trial on its slot: stopped with the old instance
    # (its tag) or cleaned by the release gate
    cleaned = [
        e
        for e in events(sweep)
        if (e["event"] == "released" and e.get("cleaned"))
        or (e["event"] == "stopped" and e.get("instance_of") == 1)
    ]
    record_summary(
        "parallel_orphan",
        {
            "killed": killed,
            "exit_code": run.returncode,
            "trials": [trial_digest(t) | {"gpus": t["gpus"]} for t in trials.values()],
            "cleaned": cleaned,
        },
    )
    assert killed, "the first trial's front was never killed"
    assert trials[1]["failure_class"] == "bench_crash", trials[1]
    # the other slot's trial ran to its end, its instance never stopped by the first slot
    assert trials[2]["outcome"] == "ok", trials[2]
    assert trials[3]["outcome"] == "ok", trials[3]
    assert trials[3]["gpus"] == trials[1]["gpus"], "the next trial took the orphan's GPU"
    assert any(e["trial"] == 3 for e in cleaned), cleaned
    from servesweep.servers import procs

    orphans = [int(p) for p in _ORPHAN_PID.findall(Path(trials[1]["log_path"]).read_text())]
    assert orphans and all(procs.is_gone(p) for p in orphans), orphans
    stops = [e for e in events(sweep) if e["event"] == "stopped" and e.get("instance_of") == 2]
    assert all(e["t"] >= trials[2]["finished_at"] for e in stops), stops
