"""Sweeps on a real Ray cluster: a head and a second node started by this module (in a
network namespace of its own), each with two fake GPUs declared to Ray and its own
fake-GPU directory and ground-truth file, so a simulated engine that ran on a node
left its proof there.

The cluster starts once for the module (Ray's start is slow); the test that kills a
node's raylet runs last.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from tests.integration.ray_cluster import (
    CHAT,
    RayCluster,
    RayNode,
    cluster_sweep,
    ray_cluster,
    run_on,
)
from tests.integration.sweep_helpers import (
    SERVESWEEP,
    kill_tagged,
    report_json,
    tagged_processes,
    wait_for_event,
    write_sweep,
)

from servesweep.sim.testing import read_truth
from servesweep.store import open_store

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    with ray_cluster() as started:
        yield started


def _stored(sweep: Path) -> list[Any]:
    with open_store(sweep.parent / "servesweep.db", readonly=True) as store:
        return store.trials(1)


def _events(sweep: Path, kind: str) -> list[dict[str, Any]]:
    with open_store(sweep.parent / "servesweep.db", readonly=True) as store:
        return store.events(1, kind)


def _starts(node: RayNode) -> list[dict[str, Any]]:
    """The simulated engines started on ``node`` so far (its ground truth)."""
    if not node.truth.exists():
        return []
    return [e for e in read_truth(node.truth) if e["event"] == "process_start"]


def _fake_gpus_of(procs: list[psutil.Process]) -> dict[int, str]:
    """pid -> the fake-GPU directory (so the node) of each live process."""
    out = {}
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            out[proc.pid] = proc.environ()["SERVESWEEP_FAKE_GPUS"]
    return out


def _budget(event: dict[str, Any]) -> int:
    argv = [str(a) for a in event["argv"]]
    return int(argv[argv.index("--budget") + 1])


def _allocations(node: RayNode) -> dict[int, tuple[int, ...]]:
    """pid -> the fake GPUs of ``node`` its engine allocated."""
    return {
        e["pid"]: tuple(e["gpus"])
        for e in read_truth(node.truth)
        if e["event"] == "memory_allocated"
    }


def test_a_sweep_without_ray_never_imports_it(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path, name="noray", grid={"budget": [2]}, workloads=CHAT)
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('ray imported:', 'ray' in sys.modules))\n"
        "from servesweep.cli.main import main\n"
        f"main(['run', {str(sweep)!r}, '--quiet'])\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "ray imported: False" in done.stdout, done.stdout
    finally:
        kill_tagged("noray", tmp_path)


def test_an_unreachable_cluster_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    sweep = cluster_sweep(tmp_path, "nowhere", [2], 1)
    done = subprocess.run(
        [*SERVESWEEP, "run", str(sweep), "--ray", "127.0.0.9:9"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "servesweep: --ray: cannot reach the Ray cluster at 127.0.0.9:9 (Connection refused); "
        "start it with `ray start --head`, or check the address and the firewall"
    ]
    assert not (tmp_path / "servesweep.db").exists()


def test_a_ray_too_old_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    fake = tmp_path / "site" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "2.9.3"\n')  # Ray as it was then
    sweep = cluster_sweep(tmp_path, "old", [2], 1)
    done = subprocess.run(
        [*SERVESWEEP, "run", str(sweep), "--ray", "127.0.0.9:9"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(fake.parent)},
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "servesweep: --ray: Ray 2.9.3 is too old: servesweep needs ray>=2.60.0 "
        "(pip install -U 'servesweep[ray]') on the driver and on every node"
    ]
    assert not (tmp_path / "servesweep.db").exists()


def test_a_sweep_spreads_over_both_nodes_each_trial_once_where_it_was_placed(
    cluster: RayCluster, tmp_path: Path
) -> None:
    sweep = cluster_sweep(tmp_path, "spread", [2, 4, 6, 8], 1)
    events = tmp_path / "events.jsonl"
    before = {n.ip: len(_starts(n)) for n in cluster.nodes}
    try:
        done = run_on(cluster, sweep, "--quiet", "--events", str(events))
        assert done.returncode == 0, done.stdout + done.stderr
        trials = _stored(sweep)
        assert len(trials) == 4 and all(t.outcome.value == "ok" for t in trials), trials
        assert all(t.attempts == 1 for t in trials)
        by_node = {n.node_id: n for n in cluster.nodes}
        assert {t.node_id for t in trials} == set(by_node), "both nodes ran trials"
        started = {
            e["trial"]: e
            for e in map(json.loads, events.read_text().splitlines())
            if e["event"] == "trial_started"
        }
        for trial in trials:
            node = by_node[trial.node_id]
            # placed there by the driver, recorded there, and its server ran there: on
            # that node's address, on that node's fake GPUs (the ones the trial names)
            assert started[trial.id]["node_id"] == trial.node_id
            assert trial.node == node.ip  # both nodes share this machine's hostname
            assert trial.instance is not None and trial.instance.node_id == trial.node_id
            new = _starts(node)[before[node.ip] :]
            mine = [s for s in new if _budget(s) == trial.params["budget"]]
            assert len(mine) == 1, (trial.id, mine)
            argv = [str(a) for a in mine[0]["argv"]]
            assert argv[argv.index("--host") + 1] == node.ip
            assert _allocations(node)[mine[0]["pid"]] == tuple(trial.gpus)
            assert len(trial.gpus) == 1
        # exactly once: each configuration started once, on one node only
        budgets = [_budget(s) for n in cluster.nodes for s in _starts(n)[before[n.ip] :]]
        assert sorted(budgets) == [2, 4, 6, 8]
        status = subprocess.run(
            [*SERVESWEEP, "status", str(sweep)], capture_output=True, text=True, check=False
        )
        assert status.returncode == 0, status.stderr
        for node in cluster.nodes:
            assert f"@{node.ip}/" in status.stdout, status.stdout
        assert not tagged_processes("spread", cluster.root)
    finally:
        kill_tagged("spread", cluster.root)


def test_sigkill_of_the_driver_then_a_rerun_loses_nothing_and_leaves_no_server(
    cluster: RayCluster, tmp_path: Path
) -> None:
    sweep = cluster_sweep(
        tmp_path, "rkill", [1, 2, 3, 4, 5, 6], 1, **{"load-time": 2.0, "step-ms": 15}
    )
    events = tmp_path / "events.jsonl"
    names = {n.node_id: n.ip for n in cluster.nodes}
    try:
        proc = subprocess.Popen(
            cluster.command(
                *SERVESWEEP, "run", str(sweep), "--quiet", "--ray", cluster.address,
                "--events", str(events),
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=cluster.env,
        )  # fmt: skip
        try:
            # servers run on both nodes, one of them still loading: kill the driver
            for node_id in names:
                wait_for_event(
                    events,
                    lambda e, n=node_id: e["event"] == "trial_started" and e["node_id"] == n,
                    timeout=240,
                )
            wait_for_event(
                events, lambda e: e["event"] == "phase" and e["phase"] == "load", timeout=120
            )
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        left = _fake_gpus_of(tagged_processes("rkill", cluster.root))
        assert left, "the killed run left servers behind"
        rerun = run_on(cluster, sweep, "--quiet")
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        trials = _stored(sweep)
        assert len(trials) == 6 and all(t.outcome.value == "ok" for t in trials), trials
        for t in report_json(sweep)["trials"]:
            levels = [(r["workload"], r["level"], r["repeat"]) for r in t["results"]]
            assert levels == [("chat", "c1", 0)], t
        assert not tagged_processes("rkill", cluster.root), "a server was left running"
        # each node's leftovers were dealt with there
        handled = {
            e.get("node")
            for kind in ("stopped_leftover", "adopted_leftover", "cleaned_before_sweep")
            for e in _events(sweep, kind)
        }
        for gpu_dir in set(left.values()):
            node = next(n for n in cluster.nodes if str(n.gpu_dir) == gpu_dir)
            assert node.ip in handled, (node.ip, handled)
    finally:
        kill_tagged("rkill", cluster.root)


def test_a_cluster_without_enough_gpus_for_a_trial_is_refused_before_anything_starts(
    cluster: RayCluster, tmp_path: Path
) -> None:
    sweep = cluster_sweep(tmp_path, "rbig", [2], 1)
    sweep.write_text(sweep.read_text().replace("gpus_per_trial: 1", "gpus_per_trial: 4"))
    done = run_on(cluster, sweep, "--quiet", timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "budget=2 needs 4 GPUs" in lines[0] and "largest" in lines[0], lines
    assert not (tmp_path / "servesweep.db").exists()


def test_the_load_generator_can_run_from_the_drivers_node_and_the_results_say_so(
    cluster: RayCluster, tmp_path: Path
) -> None:
    sweep = cluster_sweep(tmp_path, "rfrom", [2, 4], 1)
    text = sweep.read_text().replace("gpus_per_trial: 1", "gpus_per_trial: 2")  # one a node
    sweep.write_text(text + "executor:\n  kind: ray\n  bench_from: driver\n")
    head, other = cluster.nodes
    try:
        done = subprocess.run(
            cluster.command(*SERVESWEEP, "run", str(sweep), "--quiet"),
            capture_output=True,
            text=True,
            env=cluster.env,  # the address comes from RAY_ADDRESS
            timeout=400,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        trials = _stored(sweep)
        assert {t.node_id for t in trials} == {head.node_id, other.node_id}
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            for trial in trials:
                (result,) = store.results(trial.id)
                # the driver runs on the head's node; its load generator did too
                assert result.info["load_node_id"] == head.node_id, result.info
                assert result.info["load_generator"] == f"driver node {head.ip}"
                assert result.metrics["error_rate"] == 0
            environment = store.sweep(1).environment
        assert environment["ray"]["bench_from"] == "driver"
        html = tmp_path / "report.html"
        shown = subprocess.run(
            [*SERVESWEEP, "report", str(sweep), "--format", "html", "--out", str(html)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert shown.returncode == 0, shown.stderr
        page = html.read_text()
        assert f"load generator on the driver node {head.ip}" in page
        for node in cluster.nodes:  # the timeline's lanes: node/slot
            assert f"{node.ip}/0" in page
    finally:
        kill_tagged("rfrom", cluster.root)


def test_a_node_lost_during_a_trial_fails_it_node_lost_and_it_runs_again_elsewhere(
    cluster: RayCluster, tmp_path: Path
) -> None:
    """Runs last: the second node stays dead."""
    sweep = cluster_sweep(tmp_path, "rlost", [2, 4, 6], 1, **{"step-ms": 25})
    sweep.write_text(sweep.read_text().replace("gpus_per_trial: 1", "gpus_per_trial: 2"))
    events = tmp_path / "events.jsonl"
    head, other = cluster.nodes[0], cluster.nodes[1]
    try:
        proc = subprocess.Popen(
            cluster.command(
                *SERVESWEEP, "run", str(sweep), "--quiet", "--ray", cluster.address,
                "--events", str(events),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
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
            other.raylet().kill()
            out, err = proc.communicate(timeout=400)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
        assert proc.returncode == 0, out + err
        trials = {t.id: t for t in _stored(sweep)}
        assert len(trials) == 3 and all(t.outcome.value == "ok" for t in trials.values())
        assert trials[lost].attempts == 2 and trials[lost].node_id == head.node_id
        (loss,) = _events(sweep, "node_lost")
        assert loss["trial"] == lost
        assert loss["node_id"] == other.node_id and loss["dead"] is True
        assert "died" in loss["message"], loss  # what Ray said of the actor, kept
        lines = [json.loads(line) for line in events.read_text().splitlines()]
        (failed,) = [e for e in lines if e["event"] == "trial_finished" and e["outcome"] != "ok"]
        assert failed["trial"] == lost and failed["failure_class"] == "node_lost"
        assert other.ip in failed["message"]
        # nothing was placed on the lost node again
        after = lines[lines.index(failed) :]
        assert all(e["node_id"] == head.node_id for e in after if e["event"] == "trial_started"), (
            after
        )
    finally:
        kill_tagged("rlost", cluster.root)
