"""A Ray cluster as a run's site (``sweep.executors.site.Site``), for ``servesweep run
--ray``: the plan checked against the cluster's nodes before anything is created, the
run's leases (its slots' ports, each node's GPUs) held on every node by a small actor
there while the run lives — Ray ends it with the driver, and the locks end with it —,
the cluster described for the sweep's record, and the run's
:class:`~servesweep.sweep.executors.ray.executor.RayExecutor`.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError

from servesweep.errors import ResourceBusy, ServesweepError
from servesweep.servers.leases import Busy, Holder, Lease, Resource, resources_for
from servesweep.spec.load import LoadedSweep
from servesweep.spec.schema import SweepSpec
from servesweep.spec.slots import slot_ports
from servesweep.sweep.events import Event
from servesweep.sweep.executors.ray.actor import on_node
from servesweep.sweep.executors.ray.executor import RayConnection, RayExecutor, leave
from servesweep.sweep.executors.ray.nodes import (
    RemoteFailure,
    check_cluster,
    cluster_spec,
    node_host,
    short_error,
)
from servesweep.sweep.slots.data import SweepContext
from servesweep.sweep.slots.leases import busy_message, owner_of, waiting_message

__all__ = ["RaySite", "hold_node_leases"]

_CALL_TIMEOUT_S = 120.0
_CLOSE_S = 10.0
_LEASE_POLL_S = 0.5


# -- the run's leases on every node ----------------------------------------------------


class LeaseHolder:
    """Holds the run's leases on one node while the run lives (a Ray actor: Ray ends
    it with the driver, and the locks end with it)."""

    def __init__(self, owner: Holder) -> None:
        self._lease = Lease(owner)

    def take(self, resources: Sequence[Resource]) -> Busy | RemoteFailure | None:
        try:
            return self._lease.take(resources)
        except OSError as exc:
            return RemoteFailure.of(
                ServesweepError(f"cannot take the run's leases in {self._lease.directory}: {exc}")
            )

    def release(self) -> None:
        self._lease.release()


_RemoteLeases = ray.remote(LeaseHolder)


def hold_node_leases(
    connection: RayConnection,
    spec: SweepSpec,
    ports: Sequence[int],
    owner: Holder,
    *,
    wait: bool,
    notify: Callable[[str], None],
) -> Callable[[], None]:
    """Take the run's leases (its slots' ports, each node's GPUs) on every node of the
    cluster; returns what lets them go. ResourceBusy when another run holds one (with
    ``wait``: waits, telling ``notify``)."""
    actors: list[Any] = []

    def release() -> None:
        if ray.is_initialized():  # (once the run has left the cluster, Ray ended them)
            for actor in actors:
                with contextlib.suppress(Exception):  # Ray raises more than RayError here
                    ray.get(actor.release.remote(), timeout=_CLOSE_S)
                    ray.kill(actor)
        actors.clear()

    try:
        for node in connection.nodes:
            actor: Any = _RemoteLeases.options(
                num_cpus=0, scheduling_strategy=on_node(node.node_id)
            ).remote(owner)
            actors.append(actor)
            resources = resources_for(
                ports,
                node.gpus,
                spec.server.gpu_backend,
                connection.fake_gpu_dirs[node.node_id],
                node_host(spec.server, connection.ips[node.node_id]),
            )
            last: Busy | None = None
            while True:
                try:
                    answer: Busy | RemoteFailure | None = ray.get(
                        actor.take.remote(resources), timeout=_CALL_TIMEOUT_S
                    )
                except RayError as exc:
                    raise ServesweepError(
                        f"cannot take the run's leases on node {node.name}: {short_error(str(exc))}"
                    ) from None
                if isinstance(answer, RemoteFailure):
                    raise answer.error(f"node {node.name}")
                if answer is None:
                    break
                if not wait:
                    raise ResourceBusy(busy_message(answer, node.name))
                if answer != last:
                    notify(waiting_message(answer, node.name))
                    last = answer
                time.sleep(_LEASE_POLL_S)
    except BaseException:
        release()
        raise
    return release


# -- the cluster as a run's site ----------------------------------------------------------


class RaySite:
    """A joined Ray cluster as a run's site (``sweep.executors.site.Site``)."""

    def __init__(self, loaded: LoadedSweep, connection: RayConnection) -> None:
        self._loaded = loaded
        self.connection = connection

    def check(self) -> list[str]:
        connection = self.connection
        return check_cluster(self._loaded.spec, connection.nodes, connection.address)

    def scheduled(self, spec: SweepSpec) -> SweepSpec:
        """The GPU pool is the nodes' (see ``cluster.cluster_spec``)."""
        return cluster_spec(spec, self.connection.nodes)

    @contextmanager
    def leases(
        self,
        spec: SweepSpec,
        store_path: Path,
        *,
        slots: int,
        wait: bool,
        notify: Callable[[str], None],
    ) -> Iterator[None]:
        owner = owner_of(spec, store_path)
        ports = slot_ports(spec, slots)
        release = hold_node_leases(self.connection, spec, ports, owner, wait=wait, notify=notify)
        try:
            yield
        finally:
            release()

    def environment(self, context: SweepContext) -> dict[str, Any]:
        """The cluster and its nodes (their GPUs are each slot's to report)."""
        bench_from = context.spec.executor.bench_from
        return {"ray": {**self.connection.describe(), "bench_from": bench_from}}

    def executor(self, context: SweepContext, events: queue.Queue[Event]) -> RayExecutor:
        return RayExecutor(
            self.connection, context, events, bench_from=context.spec.executor.bench_from
        )

    def close(self) -> None:
        """Leave the cluster (harmless when the executor already did)."""
        leave()
