"""The memory gate through ``servesweep run`` on the simulated engine (80 GiB fake
GPUs, ``mem-per-gpu`` swept over and under them): a configuration predicted not to fit
is recorded ``skipped`` (predicted_oom, with its prediction) and never launched, a
launched one's memory is what the fake GPU saw its server hold; a
search is told it as infeasible and it does not count in the trials cap;
``--no-predict`` launches it, and the simulated engine dies of the OOM that was
predicted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.sweep_helpers import report_json, run_cli, write_sweep

from servesweep.store import open_store

_FAST = {"load-time": 0.05, "release-delay": 0.0}
_CHAT = [{"name": "chat", "concurrency": [1], "requests": 2, "max_tokens": 4, "ignore_eos": True}]


def _sweep(tmp_path: Path, grid: dict[str, list[Any]], search: dict[str, Any]) -> Path:
    return write_sweep(
        tmp_path,
        name="memgate",
        grid=grid,
        args=_FAST,
        workloads=_CHAT,
        extra={
            "search": search,
            "objective": {"maximize": "output_throughput", "workload": "chat", "concurrency": 1},
        },
    )


def test_grid_skips_a_predicted_oom_and_no_predict_launches_it(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, {"mem-per-gpu": ["40GiB", "100GiB"]}, {"predict": "skip"})
    done = run_cli("run", str(sweep), "--quiet", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = {t["params"]["mem-per-gpu"]: t for t in report_json(sweep)["trials"]}
    assert trials["40GiB"]["outcome"] == "ok"
    skipped = trials["100GiB"]
    assert skipped["outcome"] == "skipped" and skipped["attempts"] == 0, skipped
    evidence = skipped["failure"]
    assert evidence["reason"] == "predicted_oom"
    predicted = evidence["details"]["predicted_memory"]
    assert predicted["verdict"] == "oom"
    assert predicted["per_gpu_bytes"] == 100 * 2**30 and predicted["capacity"] == 80 * 2**30
    # what the fake GPU saw the launched trial's server hold (the slot's samples less
    # the baseline) is its measured memory beside the prediction
    store = open_store(tmp_path / "servesweep.db")
    try:
        memory = {e["trial"]: e for e in store.events(store.sweeps()[0].id, "memory")}
    finally:
        store.close()
    ran = memory[trials["40GiB"]["id"]]
    assert ran["predicted"]["per_gpu_bytes"] == 40 * 2**30
    assert ran["measured"]["device_used"] == 40 * 2**30, ran
    # --no-predict: the skipped configuration runs, and dies of the OOM it was said to
    done = run_cli("run", str(sweep), "--quiet", "--no-predict", timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    trials = {t["params"]["mem-per-gpu"]: t for t in report_json(sweep)["trials"]}
    crashed = trials["100GiB"]
    assert crashed["outcome"] == "failed" and crashed["failure_class"] == "start_crash"
    assert crashed["failure"]["reason"] == "oom"


def test_search_is_told_and_the_cap_counts_launches_only(tmp_path: Path) -> None:
    sizes = ["100GiB", "120GiB", "140GiB", "90GiB", "30GiB"]
    sweep = _sweep(tmp_path, {"mem-per-gpu": sizes}, {"strategy": "random", "trials": 1, "seed": 1})
    done = run_cli("run", str(sweep), "--quiet", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = report_json(sweep)["trials"]
    ran = [t for t in trials if t["outcome"] != "skipped"]
    # the one launch the cap allows is the one configuration that fits
    assert [t["params"]["mem-per-gpu"] for t in ran] == ["30GiB"], trials
    assert ran[0]["outcome"] == "ok"
    for t in trials:
        if t["outcome"] == "skipped":
            assert t["failure"]["reason"] == "predicted_oom", t
