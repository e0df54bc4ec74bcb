"""One Ray node against two: makespan, GPU utilisation and scheduling overhead of one
sweep of the simulated engine, side by side in one call.

The same sweep (8 trials of one GPU each; 60 of 80 GiB per instance, so two never
share a GPU; real load and release times) runs three times through
``servesweep run``:

- ``local``: on this machine without Ray (two fake GPUs), the reference;
- ``ray, 1 node``: on a local Ray cluster of one node with two fake GPUs;
- ``ray, 2 nodes``: the same cluster after a second node with two more joined.

The cluster is the integration tests' (``tests/integration/ray_cluster.py``): real
``ray start`` nodes on loopback addresses in a network namespace of their own (needs
root), each with its own fake GPUs.

- **makespan**: first trial's start to last trial's end (results database);
- **GPU utilisation**: busy GPU-seconds / available GPU-seconds — a trial keeps its
  GPU busy from its start to its end; the run offers ``makespan × its GPUs``;
- **dispatch gap**: on each slot, from one trial's end to the next trial's start
  there (the end reaches the driver, the driver places the next trial, the slot
  starts it): servesweep's and Ray's scheduling overhead per trial, mean and max;
- **start-up**: from ``servesweep run``'s start to the first trial's start (joining
  the cluster, preparing every node, starting the slots' actors).

Run:  .venv/bin/python bench/ray_makespan.py [--trials 8] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' Ray cluster

from sim_sweep import stored_run, write_sim_sweep
from tests.integration.ray_cluster import RayCluster, ray_cluster

from servesweep.store import TrialRecord

SERVESWEEP = [sys.executable, "-m", "servesweep.cli.main"]


@dataclass
class Run:
    where: str
    gpus: int
    trials: int
    ok: int
    makespan_s: float
    busy_gpu_s: float
    utilisation: float
    gap_mean_s: float
    gap_max_s: float
    startup_s: float


def _gaps(trials: Sequence[TrialRecord]) -> list[float]:
    lanes: dict[tuple[str, int | None], list[TrialRecord]] = defaultdict(list)
    for t in trials:
        lanes[(t.node_id or t.node, t.slot)].append(t)
    gaps = []
    for lane in lanes.values():
        lane.sort(key=lambda t: t.started_at or 0.0)
        for before, after in itertools.pairwise(lane):
            assert before.finished_at is not None and after.started_at is not None
            gaps.append(after.started_at - before.finished_at)
    return gaps


def _measure(where: str, gpus: int, argv: list[str], env: dict[str, str], folder: Path) -> Run:
    t0 = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"servesweep run failed ({done.returncode}): {done.stderr[-2000:]}")
    stored = stored_run(folder)
    gaps = _gaps(stored.trials) or [0.0]
    return Run(
        where=where,
        gpus=gpus,
        trials=len(stored.trials),
        ok=stored.ok,
        makespan_s=round(stored.makespan_s, 2),
        busy_gpu_s=round(stored.busy_gpu_s, 1),
        utilisation=round(stored.utilisation(gpus), 3),
        gap_mean_s=round(sum(gaps) / len(gaps), 3),
        gap_max_s=round(max(gaps), 3),
        startup_s=round(stored.began - t0, 2),
    )


def _write(folder: Path, name: str, trials: int, *, local: bool) -> Path:
    """One GPU per trial; on this machine two fake GPUs, on a cluster the nodes'."""
    params = {"grid": {"budget": list(range(trials))}}
    return write_sim_sweep(
        folder, name, params, load_time=2.0, gpus_per_trial=1, fake_gpus=2 if local else None
    )


def _on_cluster(cluster: RayCluster, name: str, trials: int, tmp: Path) -> Run:
    folder = tmp / name
    folder.mkdir()
    path = _write(folder, name, trials, local=False)
    argv = cluster.command(*SERVESWEEP, "run", str(path), "--quiet", "--ray", cluster.address)
    gpus = 2 * len(cluster.nodes)
    where = f"ray, {len(cluster.nodes)} node" + ("s" if len(cluster.nodes) > 1 else "")
    return _measure(where, gpus, argv, cluster.env, folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8, help="trials of one GPU each")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="ss-raymakespan-") as name:
        tmp = Path(name)
        local = tmp / "local"
        local.mkdir()
        path = _write(local, "local", args.trials, local=True)
        env = {**os.environ, "NO_COLOR": "1"}
        runs.append(_measure("local", 2, [*SERVESWEEP, "run", str(path), "--quiet"], env, local))
        with ray_cluster(ips=("127.0.0.2",)) as cluster:
            runs.append(_on_cluster(cluster, "one", args.trials, tmp))
            cluster.add("127.0.0.3")
            runs.append(_on_cluster(cluster, "two", args.trials, tmp))
    if args.json:
        print(json.dumps([asdict(r) for r in runs], indent=2))
        return
    print(
        "| where | GPUs | trials ok | makespan | GPU utilisation | dispatch gap mean / max "
        "| start-up |\n|---|---|---|---|---|---|---|"
    )
    for r in runs:
        print(
            f"| {r.where} | {r.gpus} | {r.ok}/{r.trials} | {r.makespan_s:.1f} s | "
            f"{r.utilisation:.1%} | {r.gap_mean_s:.2f} / {r.gap_max_s:.2f} s | "
            f"{r.startup_s:.1f} s |"
        )


if __name__ == "__main__":
    main()
