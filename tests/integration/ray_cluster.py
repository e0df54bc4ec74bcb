"""A real local Ray cluster for the integration tests: a head node and more nodes,
each a ``ray start --block`` process of this test, each with its own fake GPUs
(declared to Ray with ``--num-gpus``, and a fake-GPU directory its workers inherit
through ``SERVESWEEP_FAKE_GPUS``).

Ray listens on every interface of its network namespace (it cannot be told to bind
to loopback alone), so the cluster, and every driver and command that talks to it,
runs in a network namespace of the test's own with nothing but loopback: nodes use
the addresses 127.0.0.2, 127.0.0.3, ... (Ray replaces 127.0.0.1 by the machine's
outward address), no other Ray cluster or server on this machine can be reached or
disturbed. Each node keeps its own ports (they share the namespace).

Everything is stopped by PID (each node's session: ``ray start --block`` and the
raylet, GCS and workers it started; then the namespace's holder), never with a
machine-wide ``ray stop``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from tests.integration.sweep_helpers import SERVESWEEP, write_sweep

from servesweep.fakegpu import FakeGpuDir

RAY = str(Path(sys.executable).with_name("ray"))

TEST_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    # a lost node is declared dead within seconds (the defaults take ~30 s)
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    # Ray kills a dead worker's direct child processes by default (also when the worker
    # dies with its raylet): a killed driver's servers would vanish with its actors.
    # Off here, servers outlive their actor, so a rerun has to find them on their
    # nodes (test_sweep_ray_raylet.py runs with Ray's default: RAY_DEFAULTS_ENV).
    "RAY_kill_child_processes_on_worker_exit": "0",
}
"""The environment of the test cluster and of the drivers that use it (test only)."""

CHAT = [{"name": "chat", "concurrency": [1], "requests": 6, "max_tokens": 16, "ignore_eos": True}]
"""One short streamed chat level: what the cluster sweeps measure."""

RAY_DEFAULTS_ENV = {
    k: v for k, v in TEST_ENV.items() if k != "RAY_kill_child_processes_on_worker_exit"
}
"""As ``TEST_ENV``, with Ray's own handling of a dead worker's child processes (it
kills its direct children): what a cluster does unless told otherwise. Only the
health checks stay fast, so that a lost node is declared dead within seconds."""

_START_TIMEOUT_S = 120.0


class NetNamespace:
    """A network namespace with loopback only, held open by a ``sleep`` of ours."""

    def __init__(self) -> None:
        if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
            pytest.skip("a Ray test cluster needs root and util-linux unshare/nsenter")
        self.holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "infinity"])
        self.prefix = ["nsenter", f"--net=/proc/{self.holder.pid}/ns/net", "--"]
        # first the namespace, then its loopback: set up before unshare has made the
        # namespace, ``ip link`` would reach this one's (and the cluster's loopback
        # would stay down: no node could reach the head)
        deadline = time.monotonic() + 10
        while not self._entered():
            if time.monotonic() > deadline or self.holder.poll() is not None:
                self.close()
                pytest.skip("cannot make a network namespace (unshare --net)")
            time.sleep(0.01)
        up = subprocess.run(
            [*self.prefix, "ip", "link", "set", "lo", "up"], capture_output=True, check=False
        )
        shown = subprocess.run(
            [*self.prefix, "ip", "-o", "link", "show", "lo"], capture_output=True, check=False
        )
        if up.returncode != 0 or ",UP" not in shown.stdout.decode():
            self.close()
            raise AssertionError(
                f"loopback of the test's namespace is not up: {up.stderr.decode()[-300:]}"
                f"{shown.stdout.decode()[-300:]}"
            )
        self._port = 20000

    def _entered(self) -> bool:
        """unshare has made the namespace (not still in ours)."""
        try:
            return os.readlink(f"/proc/{self.holder.pid}/ns/net") != os.readlink(
                "/proc/self/ns/net"
            )
        except OSError:
            return False

    def port(self) -> int:
        """A port of its own (nothing else listens in the namespace)."""
        self._port += 1
        return self._port

    def close(self) -> None:
        if self.holder.poll() is None:
            self.holder.kill()
        self.holder.wait(timeout=10)


@dataclass
class RayNode:
    ip: str
    gpu_dir: Path
    """The node's own fake GPUs (``SERVESWEEP_FAKE_GPUS`` of its workers)."""
    truth: Path
    """Where the simulated engines started on this node write their ground truth."""
    proc: subprocess.Popen[bytes]
    log: Path
    node_id: str = ""

    def processes(self) -> list[psutil.Process]:
        """The node's processes: ``ray start`` and its session (raylet, workers, ...)."""
        try:
            sid = os.getsid(self.proc.pid)
        except OSError:
            return []
        found = []
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(OSError, psutil.Error):
                if os.getsid(proc.pid) == sid:
                    found.append(proc)
        return found

    def raylet(self) -> psutil.Process:
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                if proc.name() == "raylet":
                    return proc
        raise AssertionError(f"no raylet for node {self.ip}")


@dataclass
class RayCluster:
    address: str
    root: Path
    netns: NetNamespace
    nodes: list[RayNode] = field(default_factory=list)
    settings: Mapping[str, str] = field(default_factory=lambda: dict(TEST_ENV))
    """Ray's settings of the nodes and drivers (``TEST_ENV`` or ``RAY_DEFAULTS_ENV``)."""

    @property
    def env(self) -> dict[str, str]:
        """The environment a driver of this cluster runs with (no fake GPUs of its own:
        each node has its own)."""
        env = {**os.environ, **self.settings, "RAY_ADDRESS": self.address, "NO_COLOR": "1"}
        for name in ("SERVESWEEP_FAKE_GPUS", "SERVESWEEP_SIM_TRUTH"):
            env.pop(name, None)
        return env

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the cluster's network namespace."""
        return [*self.netns.prefix, *argv]

    def add(self, ip: str, gpus: int = 2) -> RayNode:
        """Start one more node and wait until the cluster counts it."""
        node = _started(self.root, ip, ["--address", self.address], gpus, self.netns, self.settings)
        self.nodes.append(node)
        _wait_alive(self)
        return node

    def restart(self, node: RayNode, gpus: int = 2) -> RayNode:
        """``node``'s machine joins the cluster again (what is left of the node is
        stopped first): same address, same fake GPUs (their holders kept), a new Ray
        node id. Returns the new node, which takes the old one's place."""
        _stop_node(node)
        new = _started(
            self.root, node.ip, ["--address", self.address], gpus, self.netns, self.settings
        )
        self.nodes[self.nodes.index(node)] = new
        _wait_alive(self)
        return new

    def by_ip(self, ip: str) -> RayNode:
        return next(n for n in self.nodes if n.ip == ip)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            _stop_node(node)


def _node_args(ip: str, root: Path, gpus: int, netns: NetNamespace) -> list[str]:
    return [
        "--node-ip-address",
        ip,
        "--num-cpus",
        "2",
        "--num-gpus",
        str(gpus),
        "--object-store-memory",
        str(96 * 2**20),
        "--node-manager-port",
        str(netns.port()),
        "--object-manager-port",
        str(netns.port()),
        "--metrics-export-port",
        str(netns.port()),
        "--dashboard-agent-listen-port",
        str(netns.port()),
        "--dashboard-agent-grpc-port",
        str(netns.port()),
        "--runtime-env-agent-port",
        str(netns.port()),
        "--temp-dir",
        str(root),
        "--disable-usage-stats",
        "--block",
    ]


def _start_node(
    root: Path,
    ip: str,
    args: list[str],
    gpus: int,
    netns: NetNamespace,
    settings: Mapping[str, str],
) -> RayNode:
    gpu_dir = root / f"gpus-{ip}"
    FakeGpuDir.create(gpu_dir, gpus, 80 * 2**30, name="NVIDIA H200 (fake)")
    log = root / f"node-{ip}.log"
    truth = root / f"truth-{ip}.jsonl"
    env = {
        **os.environ,
        **settings,
        "SERVESWEEP_FAKE_GPUS": str(gpu_dir),
        "SERVESWEEP_SIM_TRUTH": str(truth),
    }
    env.pop("RAY_ADDRESS", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*netns.prefix, RAY, "start", *args, *_node_args(ip, root, gpus, netns)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return RayNode(ip, gpu_dir, truth, proc, log)


def _wait_alive(cluster: RayCluster) -> None:
    """Until Ray counts every node of ``cluster`` alive; learns their ids."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        nodes = alive_nodes(cluster)
        if len(nodes) == len(cluster.nodes):
            break
        assert time.monotonic() < deadline, f"cluster did not come up: {nodes}" + "".join(
            f"\n--- {n.log.name}:\n{n.log.read_text()[-1500:]}" for n in cluster.nodes
        )
        time.sleep(1)
    for node in cluster.nodes:
        node.node_id = str(next(n["id"] for n in nodes if n["ip"] == node.ip))


def _started(
    root: Path,
    ip: str,
    args: list[str],
    gpus: int,
    netns: NetNamespace,
    settings: Mapping[str, str],
    tries: int = 3,
) -> RayNode:
    """A node whose ``ray start`` says the runtime started (tried up to ``tries`` times)."""
    for attempt in range(tries):
        node = _start_node(root, ip, args, gpus, netns, settings)
        deadline = time.monotonic() + _START_TIMEOUT_S
        try:
            while time.monotonic() < deadline and node.proc.poll() is None:
                if "Ray runtime started" in node.log.read_text(errors="replace"):
                    return node
                time.sleep(0.2)
        except BaseException:  # interrupted while it starts: it is not the cluster's yet
            _stop_node(node)
            raise
        _stop_node(node)
        if attempt + 1 == tries:
            raise AssertionError(f"node {ip} did not start: {node.log.read_text()[-2000:]}")
    raise AssertionError("unreachable")


def _stop_node(node: RayNode) -> None:
    """SIGTERM the node's session (``ray start --block`` stops its raylet and workers),
    then SIGKILL whatever is left."""
    procs = node.processes()
    if node.proc.poll() is None:
        node.proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        node.proc.wait(timeout=20)
    if node.proc.poll() is None:
        node.proc.kill()
        node.proc.wait(timeout=10)
    for proc in procs + node.processes():
        with contextlib.suppress(psutil.Error):
            proc.kill()


def alive_nodes(cluster: RayCluster, timeout: float = 60) -> list[dict[str, object]]:
    """The cluster's alive nodes as Ray reports them (asked from a short-lived driver)."""
    code = (
        "import json, ray; ray.init(address='auto', logging_level='ERROR'); "
        "print(json.dumps([{'id': n['NodeID'], 'ip': n['NodeManagerAddress'], "
        "'gpus': n['Resources'].get('GPU', 0)} for n in ray.nodes() if n['Alive']]))"
    )
    done = subprocess.run(
        cluster.command(sys.executable, "-c", code),
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    nodes: list[dict[str, object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return nodes


@contextlib.contextmanager
def ray_cluster(
    ips: tuple[str, ...] = ("127.0.0.2", "127.0.0.3"),
    gpus: int = 2,
    settings: Mapping[str, str] = TEST_ENV,
) -> Iterator[RayCluster]:
    """Start the cluster (head on ``ips[0]``), wait until every node is alive, and stop
    it all by PID at the end, whatever happened. ``settings``: Ray's environment
    (``TEST_ENV``, or ``RAY_DEFAULTS_ENV`` for Ray's own handling of child processes)."""
    # a short path: Ray's unix sockets live under it
    root = Path(tempfile.mkdtemp(prefix="ssray-", dir="/tmp"))
    netns = NetNamespace()
    port = netns.port()
    cluster = RayCluster(f"{ips[0]}:{port}", root, netns, settings=dict(settings))
    try:
        head_args = [
            "--head",
            "--port",
            str(port),
            "--include-dashboard",
            "false",
        ]
        # one node at a time: on a loaded machine a node that registers while another
        # starts can miss Ray's fixed 30 s start-up deadline (then it is started again)
        cluster.nodes.append(_started(root, ips[0], head_args, gpus, netns, settings))
        for ip in ips[1:]:
            joined = _started(root, ip, ["--address", cluster.address], gpus, netns, settings)
            cluster.nodes.append(joined)
        _wait_alive(cluster)
        yield cluster
    finally:
        cluster.stop()
        netns.close()
        shutil.rmtree(root, ignore_errors=True)


def cluster_sweep(
    directory: Path, name: str, budgets: list[int], gpus_per_trial: int, **args: object
) -> Path:
    """A sweep of the simulated engine over ``budgets`` for a Ray cluster: the GPUs come
    from the nodes (no ``server.gpus``, fake GPUs or fake-GPU directory of its own),
    ``gpus_per_trial`` of a node's per trial; ``args`` are the engine's."""
    path = write_sweep(
        directory,
        name=name,
        grid={"budget": budgets},
        args={"load-time": 1.0, **args},
        workloads=CHAT,
        server_extra={"gpus_per_trial": gpus_per_trial},
    )
    spec = path.read_text()
    for line in ("  gpus:\n  - 0\n  - 1\n", "  fake_gpu_dir: gpus\n"):
        assert line in spec
        spec = spec.replace(line, "")
    spec = spec.replace("  fake_gpus:\n    count: 2\n    memory: 80GiB\n", "")
    path.write_text(spec)
    return path


def run_on(
    cluster: RayCluster, sweep: Path, *extra: str, timeout: float = 400
) -> subprocess.CompletedProcess[str]:
    """``servesweep run SWEEP --ray ADDRESS EXTRA...`` in the cluster's namespace."""
    return subprocess.run(
        cluster.command(*SERVESWEEP, "run", str(sweep), "--ray", cluster.address, *extra),
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=timeout,
        check=False,
    )
