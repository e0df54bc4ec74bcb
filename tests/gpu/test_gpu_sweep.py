"""A real GPU server swept by servesweep on one GPU (issue 6).

Three configs of ``tests/gpu/server/gpu_server.py``, each holding more than half
of the GPU, so two instances can never fit at once: every restart depends on the
release gate. Every trial must be ``ok``; release and load times are recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.gpu.gpu_helpers import (
    GpuMonitor,
    ProcessKeeper,
    per_gpu_release,
    record_summary,
    report_json,
    require_gpus,
    results_dir,
    run_sweep,
    total_gib,
    trial_digest,
    write_sweep,
)


def test_gpu_server_sweep_every_trial_ok(keeper: ProcessKeeper, tmp_path: Path) -> None:
    gpus = require_gpus(1)[:1]
    total = total_gib(gpus[0])
    out = results_dir("sweep", tmp_path)
    # each instance: more than half the GPU (worker) + 1 GiB (front)
    holds = [round(total * f) for f in (0.55, 0.62, 0.70)]
    assert all(2 * (h + 1) > total for h in holds)
    sweep = write_sweep(
        out / "sweep.yaml",
        name="gpu-sweep",
        script="gpu_server.py",
        gpus=gpus,
        args={"pinned-gib": 4, "front-hold-gib": 1},
        points=[
            {"hold-gib": holds[0], "layers": 2, "hidden": 1024, "batch": 4},
            {"hold-gib": holds[1], "layers": 4, "hidden": 2048, "batch": 8},
            {"hold-gib": holds[2], "layers": 6, "hidden": 1024, "batch": 16},
        ],
    )
    with GpuMonitor(gpus) as monitor:
        run = run_sweep(sweep, keeper, "gpu-sweep")
    monitor.save(out / "monitor.json")
    report = report_json(sweep, keeper)
    trials = [trial_digest(t) for t in report["trials"]]
    release = per_gpu_release(report, monitor)
    record_summary(
        "sweep",
        {
            "gpu_total_gib": total,
            "holds_gib": holds,
            "exit_code": run.returncode,
            "seconds": run.seconds,
            "trials": trials,
            "release_per_gpu": release,
        },
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{json.dumps(trials, indent=1)}"
    assert [t["outcome"] for t in trials] == ["ok"] * 3
    for t in trials:
        assert t["phase_seconds"]["load"] > 0
        # the instance really held what it was asked to hold on the GPU
        peak = t["peak_gpu_memory_gib"]
        assert peak is None or peak > 0.5 * total, t
    for row in release:
        assert row["servesweep_release_s"] is not None
        assert all(v is not None for v in row["from_stop_s"].values()), row
