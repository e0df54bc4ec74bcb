"""Sweeps on a Ray cluster (``servesweep run --ray``): the driver stays here, with the
results database and the queue; every slot is a Ray actor on the node whose GPUs it
uses (``sweep.executors.ray.handle``).

* :func:`connect` joins the cluster and describes its nodes — a one-line error for
  an unreachable address, a Ray that is too old, nodes that run another servesweep;
* :class:`RayExecutor` is the driver's ``Executor`` there: ``nodes`` are the alive
  nodes with GPUs (keyed by Ray's node id: two may share a hostname), ``prepare``
  runs ``local.prepare_here`` as a task pinned to the node (the slots' ports checked,
  leftovers of this results database adopted or stopped there, the GPU baseline
  taken on its idle GPUs), ``open`` starts a slot's actor there.

How a node sees the sweep (``sweep.executors.ray.nodes.node_context``): its own fake GPUs when
its ``ray start`` environment names them, and servers listening on its address as
Ray knows it unless the sweep file sets ``server.host``.

The cluster as a run's site (its checks, the run's leases on each node) is
``sweep.executors.ray.site``. Only ``servesweep run --ray`` (or ``executor: {kind: ray}``)
imports these modules, and with them Ray.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayError

from servesweep import __version__
from servesweep.errors import ConfigError, ServesweepError
from servesweep.models import InstanceRecord
from servesweep.servers.gpu import FAKE_GPUS_ENV
from servesweep.sweep.events import Event, NodeLost
from servesweep.sweep.executors.local import prepare_here
from servesweep.sweep.executors.ray.actor import LoadFrom, SlotActor, on_node
from servesweep.sweep.executors.ray.console import print_raylet_errors_once
from servesweep.sweep.executors.ray.handle import RaySlot
from servesweep.sweep.executors.ray.nodes import (
    BufferChannel,
    RemoteFailure,
    check_ray_version,
    gpu_ids,
    gpu_nodes,
    node_context,
    node_infos,
    short_error,
)
from servesweep.sweep.slots.data import CurrentInstance, NodeInfo, Placement, SweepContext
from servesweep.sweep.slots.instance import stop_instance, stop_timeout
from servesweep.sweep.slots.node import Leftover, NodePrepared

__all__ = ["RayConnection", "RayExecutor", "cluster_nodes", "connect", "leave"]

_CONNECT_TIMEOUT_S = 10.0
_CALL_TIMEOUT_S = 120.0
_CLOSE_S = 10.0
_LEASE_POLL_S = 0.5
_SLOT_CONCURRENCY = 4
"""Calls a slot's actor serves at once: a command's stream, an interrupt, a ping."""

_RemoteSlot = ray.remote(SlotActor)


# -- joining the cluster ---------------------------------------------------------------


@dataclass(frozen=True)
class RayConnection:
    """The cluster of this run: its nodes with GPUs and what each one said of itself."""

    address: str
    nodes: tuple[NodeInfo, ...]
    ips: Mapping[str, str]
    """Node id -> the node's address."""
    fake_gpu_dirs: Mapping[str, str | None]
    """Node id -> the fake GPUs its ``ray start`` environment names."""
    driver_node: str
    """Ray's id of the node this driver runs on."""
    driver_name: str
    ray_version: str

    def describe(self) -> dict[str, Any]:
        """For the sweep's environment record."""
        return {
            "address": self.address,
            "version": self.ray_version,
            "driver_node": self.driver_name,
            "nodes": {
                n.name: {"node_id": n.node_id, "ip": self.ips[n.node_id], "gpus": list(n.gpus)}
                for n in self.nodes
            },
        }


def connect(address: str | None) -> RayConnection:
    """Join the cluster at ``address`` (``HOST:PORT`` of its head; None: the
    ``RAY_ADDRESS`` environment variable, else the cluster running on this machine)
    and describe its nodes. ConfigError, before anything starts, when it cannot be
    reached, its Ray is too old, or a node runs another servesweep or Ray."""
    check_ray_version(ray.__version__)
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    if target.startswith("ray://"):
        raise ConfigError(
            f"{target}: Ray Client addresses are not supported; run servesweep on a node "
            "of the cluster and give the head's HOST:PORT",
            key="--ray",
        )
    if target != "auto":
        _check_reachable(target)
    try:
        ray.init(address=target, logging_level=logging.ERROR, log_to_driver=False)
        print_raylet_errors_once()  # a dead raylet's log block, once (not twice)
    except (ConnectionError, RayError, ValueError, RuntimeError) as exc:
        raise ConfigError(
            f"cannot join the Ray cluster at {target}: {short_error(str(exc), 200)}",
            key="--ray",
        ) from None
    try:
        return _describe_cluster(target)
    except BaseException:
        ray.shutdown()  # a later run in this process joins afresh
        raise


def leave() -> None:
    """Leave the cluster (this process's driver); a later run joins afresh. Harmless
    when not joined."""
    ray.shutdown()


def _describe_cluster(target: str) -> RayConnection:
    everything = cluster_nodes()
    raw = gpu_nodes(everything)
    try:
        described = ray.get(
            [_describe.options(scheduling_strategy=on_node(n.node_id)).remote() for n in raw],
            timeout=_CALL_TIMEOUT_S,
        )
    except RayError as exc:
        raise ConfigError(
            f"the nodes of the Ray cluster at {target} do not answer: {short_error(str(exc))}",
            key="--ray",
        ) from None
    gpus, dirs = {}, {}
    for node, about in zip(raw, described, strict=True):
        if about["servesweep"] != __version__ or about["ray"] != ray.__version__:
            raise ConfigError(
                f"node {node.hostname} ({node.ip}) has servesweep {about['servesweep']} and "
                f"Ray {about['ray']}, this driver servesweep {__version__} and Ray "
                f"{ray.__version__}: install the same versions on every node",
                key="--ray",
            )
        gpus[node.node_id] = gpu_ids(node.gpus, about["visible"])
        dirs[node.node_id] = about["fake_gpu_dir"]
    infos = node_infos(raw, gpus)
    driver = ray.get_runtime_context().get_node_id()
    names = {n.node_id: n.name for n in infos}
    driver_name = names.get(driver) or next(
        (str(n.get("NodeManagerHostname")) for n in everything if n.get("NodeID") == driver),
        driver[:12],
    )
    return RayConnection(
        address=target,
        nodes=tuple(infos),
        ips={n.node_id: n.ip for n in raw},
        fake_gpu_dirs=dirs,
        driver_node=driver,
        driver_name=driver_name,
        ray_version=ray.__version__,
    )


def cluster_nodes() -> list[dict[str, Any]]:
    """Every node Ray knows (``ray.nodes()``), alive or dead."""
    return cast(list[dict[str, Any]], ray.nodes())  # type: ignore[no-untyped-call]


def _check_reachable(address: str) -> None:
    """Ray retries an unreachable address for minutes: know in seconds."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{address}: expected HOST:PORT of the cluster's head", key="--ray")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), _CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"cannot reach the Ray cluster at {address} ({reason}); start it with "
            "`ray start --head`, or check the address and the firewall",
            key="--ray",
        ) from None


@ray.remote(num_cpus=0)
def _describe() -> dict[str, Any]:
    return {
        "servesweep": __version__,
        "ray": ray.__version__,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "fake_gpu_dir": os.environ.get(FAKE_GPUS_ENV) or None,
    }


# -- work on a node that is not a slot's -------------------------------------------------


@ray.remote(num_cpus=0)
def _prepare(
    context: SweepContext,
    pool: Placement,
    leftovers: Sequence[Leftover],
    stored: Mapping[int, int] | None,
    service_slots: Sequence[int],
) -> tuple[NodePrepared | None, list[Event], RemoteFailure | None]:
    channel = BufferChannel()
    try:
        prepared = prepare_here(context, pool, leftovers, stored, channel, service_slots)
    except BaseException as exc:
        return None, channel.take(0), RemoteFailure.of(exc)
    return prepared, channel.take(0), None


@ray.remote(num_cpus=0)
def _stop(
    context: SweepContext,
    placement: Placement,
    trial: int,
    instance: InstanceRecord,
    baseline: Mapping[int, int] | None,
) -> list[Event]:
    channel = BufferChannel()
    stop_instance(context, placement, channel, CurrentInstance(trial, instance), baseline)
    return channel.take(0)


# -- the executor -------------------------------------------------------------------------


class RayExecutor:
    """Slots in actors on the nodes of a Ray cluster (see the module doc)."""

    def __init__(
        self,
        connection: RayConnection,
        context: SweepContext,
        events: queue.Queue[Event],
        *,
        bench_from: str = "node",
    ) -> None:
        self.connection = connection
        self.context = context
        self.events = events
        self.bench_from = bench_from
        self._contexts = {
            n.node_id: node_context(
                context,
                ip=connection.ips[n.node_id],
                fake_gpu_dir=connection.fake_gpu_dirs[n.node_id],
            )
            for n in connection.nodes
        }
        self._nodes = {n.node_id: n for n in connection.nodes}
        self._baselines: dict[str, dict[int, int]] = {}
        self._slots: list[RaySlot] = []

    def nodes(self) -> list[NodeInfo]:
        return list(self.connection.nodes)

    def context_for(self, node: NodeInfo) -> SweepContext:
        return self._contexts[node.node_id]

    def links(self, node: NodeInfo) -> dict[tuple[int, int], int] | None:
        """Unknown: Ray chooses which of a node's GPUs a slot gets."""
        return None

    def check(self) -> None:
        """Nothing before the run: each node's ports are checked as it is prepared."""
        return None

    def warnings(self) -> list[str]:
        """None: the load generators run on the nodes (or their own driver's node)."""
        return []

    def prepare(
        self,
        node: NodeInfo,
        pool: Placement,
        leftovers: Sequence[Leftover],
        stored: Mapping[int, int] | None,
        service_slots: Sequence[int],
    ) -> NodePrepared:
        """``prepare_here`` on ``node`` itself; its events join the driver's queue."""
        task = _prepare.options(scheduling_strategy=on_node(node.node_id))
        try:
            prepared, events, failure = ray.get(
                task.remote(
                    self._contexts[node.node_id], pool, list(leftovers), stored, list(service_slots)
                )
            )
        except RayError as exc:
            if self.node_alive(node.node_id):
                raise ServesweepError(
                    f"cannot prepare node {node.name}: {short_error(str(exc))}"
                ) from None
            self.events.put(
                NodeLost(
                    node=node.name, node_id=node.node_id, dead=True, message=short_error(str(exc))
                )
            )
            return NodePrepared(baseline={})
        for event in events:
            self.events.put(event)
        if failure is not None:
            raise failure.error(f"node {node.name}")
        assert prepared is not None
        self._baselines[node.node_id] = dict(prepared.baseline)
        return prepared

    def open(
        self,
        placement: Placement,
        *,
        current: CurrentInstance | None,
        baseline: Mapping[int, int],
    ) -> RaySlot:
        """A slot's actor on its node, asking Ray for as many GPUs as the scheduler
        placed it on (Ray chooses which: the slot reports them); the node's whole
        baseline goes with it."""
        node = self._nodes[placement.node_id]
        load = None
        if self.bench_from == "driver":
            ip = self.connection.ips[node.node_id]
            load = LoadFrom(self.connection.driver_node, self.connection.driver_name, ip)
        actor = _RemoteSlot.options(
            num_gpus=len(placement.gpus),
            num_cpus=0,
            max_concurrency=_SLOT_CONCURRENCY,
            max_restarts=0,
            scheduling_strategy=on_node(node.node_id),
        ).remote(
            self._contexts[node.node_id],
            placement,
            current,
            self._baselines.get(node.node_id, dict(baseline)),
            load,
        )
        slot = RaySlot(self, node, placement, cast(ActorHandle[Any], actor), self.events)
        self._slots.append(slot)
        return slot

    def node_alive(self, node_id: str) -> bool:
        try:
            return any(n["NodeID"] == node_id and n["Alive"] for n in cluster_nodes())
        except RayError:
            return False

    def stop_orphan(
        self, placement: Placement, trial: int, instance: InstanceRecord
    ) -> list[Event]:
        """Stop ``instance`` on its (live) node after its slot's actor died there."""
        context = self._contexts[placement.node_id]
        task = _stop.options(scheduling_strategy=on_node(placement.node_id))
        baseline = self._baselines.get(placement.node_id)
        events: list[Event] = ray.get(
            task.remote(context, placement, trial, instance, baseline),
            timeout=stop_timeout(context.spec.server),
        )
        return events

    def close(self) -> None:
        """End every slot's actor and leave the cluster."""
        for slot in self._slots:
            slot.close(timeout=_CLOSE_S)  # (a slot still waiting for its GPUs is ended)
            slot.kill()
        self._slots.clear()
        leave()
