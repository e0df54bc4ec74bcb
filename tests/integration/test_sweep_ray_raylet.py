"""A node's raylet killed mid-trial on a Ray cluster with Ray's defaults (a dead
worker's direct children killed by Ray: no ``RAY_kill_child_processes_on_worker_exit=0``
as in test_sweep_ray.py), for an engine whose worker runs in its own session
(``servesweep sim --orphan-worker``: it holds the GPU memory and is the server's
child, not the actor's).

What the test shows, as docs/distributed.md says: Ray's worker on that node kills the
server (SIGKILL: no graceful exit), the engine's worker survives it and keeps the
node's GPUs; the sweep ends the trial ``node_lost`` and runs it again on the other
node. Once the machine has joined again, a run of another results database leaves
that worker alone (its GPUs are busy, and it says whose they are); the next run of
the sweep's own database stops it.

The cluster (Ray's defaults but for fast health checks) starts once for the module.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from tests.integration.ray_cluster import (
    RAY_DEFAULTS_ENV,
    RayCluster,
    RayNode,
    cluster_sweep,
    ray_cluster,
    run_on,
)
from tests.integration.sweep_helpers import (
    SERVESWEEP,
    kill_tagged,
    tagged_processes,
    wait_for_event,
)

from servesweep.fakegpu import FakeGpuDir
from servesweep.servers import procs
from servesweep.sim.testing import read_truth
from servesweep.store import open_store

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    with ray_cluster(settings=RAY_DEFAULTS_ENV) as started:
        yield started


def _alive(pid: int) -> bool:
    return not procs.is_gone(pid)


def _live_holders(node: RayNode) -> list[int]:
    return [h.pid for h in FakeGpuDir(node.gpu_dir).holdings() if h.alive]


def test_a_raylet_killed_under_rays_defaults_kills_the_server_its_own_session_worker_is_stopped_by_the_next_run(  # noqa: E501
    cluster: RayCluster, tmp_path: Path
) -> None:
    sweep = cluster_sweep(tmp_path, "rdef", [2, 4, 6], 2, **{"step-ms": 25, "orphan-worker": True})
    events = tmp_path / "events.jsonl"
    head, other = cluster.nodes
    out_file = tmp_path / "run.out"
    other_db = tmp_path / "other"
    other_db.mkdir()
    try:
        with open(out_file, "w") as out:
            proc = subprocess.Popen(
                cluster.command(
                    *SERVESWEEP, "run", str(sweep), "--ray", cluster.address,
                    "--events", str(events),
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                env=cluster.env,
            )  # fmt: skip
        try:
            started = wait_for_event(
                events,
                lambda e: e["event"] == "trial_started" and e["node_id"] == other.node_id,
                timeout=240,
            )
            lost = started["trial"]
            wait_for_event(
                events,
                lambda e: e["event"] == "phase" and e["trial"] == lost and e["phase"] == "bench",
                timeout=120,
            )
            truth = read_truth(other.truth)
            server = next(e["pid"] for e in reversed(truth) if e["event"] == "process_start")
            worker = next(
                e["holder_pid"] for e in reversed(truth) if e["event"] == "memory_allocated"
            )
            actor = psutil.Process(server).ppid()
            # the server is the actor's child; its worker is the server's, in a session
            # of its own, and holds the node's GPUs
            assert "SlotActor" in " ".join(psutil.Process(actor).cmdline()), actor
            assert psutil.Process(worker).ppid() == server
            assert os.getsid(worker) == worker != os.getsid(server)
            assert _live_holders(other) == [worker]
            other.raylet().kill()
            proc.wait(timeout=400)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        shown = out_file.read_text()
        assert proc.returncode == 0, shown[-4000:]
        # Ray's worker died with its raylet and killed its child, the server, at once
        # (SIGKILL: the server never logged its exit); the worker in its own session
        # lives on, holding the lost node's GPUs
        assert not _alive(actor) and not _alive(server)
        exits = [e for e in read_truth(other.truth) if e["event"] == "exit"]
        assert not [e for e in exits if e["pid"] == server], exits
        assert _alive(worker) and _live_holders(other) == [worker]
        # the sweep: the trial ended node_lost there, and ran again (on the head)
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            trials = {t.id: t for t in store.trials(1)}
            (loss,) = store.events(1, "node_lost")
        assert all(t.outcome.value == "ok" for t in trials.values()), trials
        assert trials[lost].attempts == 2 and trials[lost].node_id == head.node_id
        assert loss["trial"] == lost and loss["node_id"] == other.node_id and loss["dead"]
        number = trials[lost].number
        assert f"trial {number} lost its node on {other.ip}: running it again" in shown
        assert f"/3] trial {number} again (attempt 2)" in shown, shown[-4000:]
        assert "[4/3]" not in shown
        # the dead raylet's log block, which its two agents publish, is printed once
        assert shown.count("Raylet is terminated.") == 1, shown
        status = subprocess.run(
            [*SERVESWEEP, "status", str(sweep)], capture_output=True, text=True, check=False
        )
        assert status.returncode == 0, status.stderr
        rows = [line for line in status.stdout.splitlines() if line.startswith("  ")]
        assert len(rows) == 3 and all(f"@{head.ip}/0" in r for r in rows), status.stdout
        assert f"(attempt 2, run again after node_lost on {other.ip})" in status.stdout

        # the machine joins the cluster again (a new Ray node, the same fake GPUs)
        other = cluster.restart(other)
        assert _alive(worker), "a new raylet does not stop what the old one left"
        # a run of another results database never signals the worker: it finds the
        # GPUs held by this database's instance, waits its release timeout, and says so
        foreign = cluster_sweep(other_db, "rother", [3], 2)
        foreign.write_text(foreign.read_text().replace("release: 20s", "release: 3s"))
        refused = run_on(cluster, foreign)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"pid {worker} is a servesweep instance of another sweep" in refused.stderr
        assert str(tmp_path / "servesweep.db") in refused.stderr
        assert _alive(worker)
        # the next run of this database (one more trial to run) prepares every node,
        # the one that came back too: the worker is this database's, and is stopped
        sweep.write_text(sweep.read_text().replace("    - 6\n", "    - 6\n    - 8\n"))
        again = run_on(cluster, sweep)
        assert again.returncode == 0, again.stdout + again.stderr
        assert not _alive(worker)
        assert "cleaned orphaned servesweep processes: pid " + str(worker) in again.stderr
        for node in cluster.nodes:
            assert _live_holders(node) == [], node.ip
            assert all(u.used_bytes == 0 for u in FakeGpuDir(node.gpu_dir).usage())
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            cleaned = store.events(1, "cleaned_before_sweep")
        assert any(e.get("node") == other.ip for e in cleaned), cleaned
        assert not tagged_processes("rdef", cluster.root)
    finally:
        kill_tagged("rdef", cluster.root)
        kill_tagged("rother", cluster.root)
