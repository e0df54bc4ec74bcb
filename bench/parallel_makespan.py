"""Parallel slots against one slot: makespan and GPU utilisation of one sweep.

The same sweep of the simulated engine on eight fake 80 GiB GPUs (60 GiB of each GPU
an instance gets, so two instances never share a GPU; loads and releases take real
time) runs twice through ``servesweep run``, in one call of this script, side by side:
with ``--slots 1`` (one trial at a time) and with as many slots as fit.

- **makespan**: first trial's start to last trial's end (from the results database);
- **GPU utilisation**: busy GPU-seconds / available GPU-seconds, where a trial keeps
  its GPUs busy from its start (stop of the previous instance included) to its end,
  and the machine offers ``makespan × pool size``.

The sweeps: ``fit`` — every trial takes 2 GPUs (16 trials: 4 waves of 4); ``mixed``
— 6 trials of 1 GPU, 4 of 2 and 2 of 4 (largest first, then fill).

Run:  .venv/bin/python bench/parallel_makespan.py [--sweeps fit,mixed] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sim_sweep import stored_run, write_sim_sweep

SWEEPS: dict[str, dict[str, Any]] = {
    "fit": {
        "gpus_per_trial": 2,
        "params": {"grid": {"budget": [0, 1, 2, 3, 4, 5, 6, 7], "topk": [1, 2]}},
    },
    "mixed": {
        "gpus_per_trial": "{param.tensor-parallel-size}",
        "params": {
            "grid": {"tensor-parallel-size": [1, 2, 4], "budget": [0, 1, 2, 3, 4, 5]},
            "when": [
                "tensor_parallel_size == 1 or (tensor_parallel_size == 2 and budget <= 3) "
                "or (tensor_parallel_size == 4 and budget <= 1)"
            ],
        },
    },
}


@dataclass
class Run:
    sweep: str
    slots: str
    trials: int
    ok: int
    makespan_s: float
    busy_gpu_s: float
    utilisation: float
    wall_s: float


def _measure(sweep: str, slots: str, folder: Path) -> Run:
    shape = SWEEPS[sweep]
    path = write_sim_sweep(
        folder,
        f"{sweep}-{slots}",
        shape["params"],
        load_time=3.0,
        gpus_per_trial=shape["gpus_per_trial"],
        fake_gpus=8,
    )
    argv = [sys.executable, "-m", "servesweep.cli.main", "run", str(path), "--quiet"]
    if slots != "auto":
        argv += ["--slots", slots]
    t0 = time.monotonic()
    done = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}, check=False
    )
    wall = time.monotonic() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"servesweep run failed ({done.returncode}): {done.stderr[-2000:]}")
    stored = stored_run(folder)
    return Run(
        sweep=sweep,
        slots=slots,
        trials=len(stored.trials),
        ok=stored.ok,
        makespan_s=round(stored.makespan_s, 2),
        busy_gpu_s=round(stored.busy_gpu_s, 1),
        utilisation=round(stored.utilisation(8), 3),
        wall_s=round(wall, 2),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", default="fit,mixed", help="comma list of: fit, mixed")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="ss-makespan-") as tmp:
        for sweep in args.sweeps.split(","):
            for slots in ("1", "auto"):
                folder = Path(tmp) / f"{sweep}-{slots}"
                folder.mkdir()
                runs.append(_measure(sweep, slots, folder))
    if args.json:
        print(json.dumps([asdict(r) for r in runs], indent=2))
        return
    print(
        "| sweep | slots | trials ok | makespan | GPU utilisation | speed-up |\n"
        "|---|---|---|---|---|---|"
    )
    base: dict[str, float] = {}
    for r in runs:
        if r.slots == "1":
            base[r.sweep] = r.makespan_s
        speedup = base.get(r.sweep, r.makespan_s) / r.makespan_s
        print(
            f"| {r.sweep} | {r.slots} | {r.ok}/{r.trials} | {r.makespan_s:.1f} s | "
            f"{r.utilisation:.1%} | {speedup:.2f}x |"
        )


if __name__ == "__main__":
    main()
