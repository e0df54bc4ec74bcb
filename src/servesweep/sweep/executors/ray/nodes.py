"""What a sweep on a cluster needs to know, as plain data and pure functions: which
nodes can run trials and what they are called, how a node sees the sweep, how a
slot buffers its events until the driver fetches them, and how a lost node is
reported. ``sweep.executors.ray.executor`` does the talking to Ray; nothing here imports it.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from servesweep.errors import (
    BenchError,
    ConfigError,
    DatasetError,
    ServesweepError,
    TrialFailed,
)
from servesweep.models import Evidence, FailureClass
from servesweep.spec.expand import expand_configs
from servesweep.spec.schema import ServerSpec, SweepSpec
from servesweep.spec.slots import gpu_need, params_label
from servesweep.sweep.events import Event
from servesweep.sweep.slots.data import NodeInfo, SweepContext
from servesweep.sweep.slots.handle import error_text

__all__ = [
    "MIN_RAY_VERSION",
    "BufferChannel",
    "ClusterNode",
    "RemoteFailure",
    "check_cluster",
    "check_fit",
    "check_ray_version",
    "cluster_spec",
    "gpu_ids",
    "gpu_nodes",
    "lost_evidence",
    "node_context",
    "node_infos",
    "short_error",
    "trial_needs",
]

MIN_RAY_VERSION = (2, 60, 0)
"""The oldest Ray servesweep is tested with (``pip install servesweep[ray]``)."""


def check_ray_version(version: str) -> None:
    """ConfigError when ``version`` (``ray.__version__``) is older than
    :data:`MIN_RAY_VERSION` or cannot be read."""
    want = ".".join(str(p) for p in MIN_RAY_VERSION)
    parts = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if parts is None:
        raise ConfigError(f"cannot read the Ray version {version!r}; servesweep needs ray>={want}")
    found = tuple(int(p or 0) for p in parts.groups())
    if found < MIN_RAY_VERSION:
        raise ConfigError(
            f"Ray {version} is too old: servesweep needs ray>={want} "
            f"(pip install -U 'servesweep[ray]') on the driver and on every node",
            key="--ray",
        )


@dataclass(frozen=True)
class ClusterNode:
    """An alive node of the cluster, as the cluster lists it."""

    node_id: str
    hostname: str
    ip: str
    gpus: int
    """How many GPUs the node declares to the cluster."""


def gpu_nodes(raw: Iterable[Mapping[str, Any]]) -> list[ClusterNode]:
    """The alive nodes with GPUs, from ``ray.nodes()``, in a stable order (address,
    then id)."""
    out = []
    for node in raw:
        if not node.get("Alive"):
            continue
        resources = node.get("Resources") or {}
        count = int(float(resources.get("GPU", 0) or 0))
        if count < 1:
            continue
        out.append(
            ClusterNode(
                node_id=str(node.get("NodeID", "")),
                hostname=str(node.get("NodeManagerHostname") or node.get("NodeManagerAddress")),
                ip=str(node.get("NodeManagerAddress", "")),
                gpus=count,
            )
        )
    return sorted(out, key=lambda n: (n.ip, n.node_id))


def node_infos(nodes: Sequence[ClusterNode], gpus: Mapping[str, tuple[int, ...]]) -> list[NodeInfo]:
    """One :class:`NodeInfo` per node: named by its hostname, or by its address when
    several nodes share the hostname (``address#id`` when they share that too), with
    the GPU indexes Ray uses there (``gpus`` by node id)."""
    hosts = Counter(n.hostname for n in nodes)
    ips = Counter(n.ip for n in nodes)
    out = []
    for n in nodes:
        name = n.hostname
        if hosts[n.hostname] > 1:
            name = n.ip if ips[n.ip] == 1 else f"{n.ip}#{n.node_id[:8]}"
        out.append(NodeInfo(name, gpus[n.node_id], n.node_id))
    return out


def gpu_ids(count: int, visible: str | None) -> tuple[int, ...]:
    """The GPU indexes Ray hands out on a node with ``count`` GPUs: the first
    ``count`` entries of the node's ``CUDA_VISIBLE_DEVICES`` when it was set (Ray
    maps its GPUs onto them), else ``0..count-1``. ConfigError for ids that are not
    indexes (GPU UUIDs)."""
    if visible is None or not visible.strip():
        return tuple(range(count))
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if not all(v.isdigit() for v in ids):
        raise ConfigError(
            f"a node's CUDA_VISIBLE_DEVICES ({visible}) names GPUs by UUID; servesweep "
            "needs GPU indexes there (start the node with CUDA_VISIBLE_DEVICES=0,1,...)"
        )
    return tuple(int(v) for v in ids[:count])


def node_host(server: ServerSpec, ip: str) -> str:
    """The address a node's servers listen on: the sweep file's ``server.host`` when it
    sets one, else the node's address as Ray knows it (``ip``)."""
    if "host" in server.model_fields_set or not ip:
        return server.host
    return ip


def node_context(
    context: SweepContext,
    *,
    ip: str,
    fake_gpu_dir: str | None,
    bind_node_address: bool | None = None,
) -> SweepContext:
    """The sweep as a node sees it: its own fake GPUs (the node's
    ``SERVESWEEP_FAKE_GPUS`` wins over the sweep file's), and servers listening on
    the node's address when the sweep file did not choose ``server.host``
    (:func:`node_host`; ``bind_node_address`` True or False decides instead)."""
    spec = context.spec
    if bind_node_address is None:
        host = node_host(spec.server, ip)
    else:
        host = ip if bind_node_address and ip else spec.server.host
    if host != spec.server.host:
        server = spec.server.model_copy(update={"host": host})
        spec = spec.model_copy(update={"server": server})
    return replace(context, spec=spec, fake_gpu_dir=fake_gpu_dir or context.fake_gpu_dir)


class BufferChannel:
    """A slot's channel inside a Ray actor: events wait here until the driver takes
    them (in order). ``send`` never blocks."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._cond = threading.Condition()

    def send(self, event: Event) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()

    def wake(self) -> None:
        """Make a waiting :meth:`take` return now."""
        with self._cond:
            self._cond.notify_all()

    def take(self, timeout: float) -> list[Event]:
        """Every event sent so far (waiting up to ``timeout`` s for the first)."""
        with self._cond:
            if not self._events:
                self._cond.wait(timeout)
            out, self._events = self._events, []
        return out


@dataclass(frozen=True)
class RemoteFailure:
    """An error raised on another node, as plain data (servesweep's exceptions do not
    all survive pickling); :meth:`error` raises it again on this side."""

    message: str
    kind: str = "error"
    failure_class: FailureClass | None = None
    evidence: Evidence | None = None

    @classmethod
    def of(cls, exc: BaseException) -> RemoteFailure:
        if isinstance(exc, TrialFailed):
            return cls(str(exc), "trial_failed", exc.failure_class, exc.evidence)
        for kind, exc_type in _KINDS.items():
            if isinstance(exc, exc_type):
                return cls(str(exc), kind)
        if isinstance(exc, ServesweepError):
            return cls(str(exc))
        return cls(error_text(exc), "internal")

    def error(self, where: str = "") -> Exception:
        """The exception to raise here; ``where`` (a node) prefixes the message. A bug
        on the node is a RuntimeError naming its last line (an internal error here
        too); its traceback is attached as a note."""
        if self.kind == "trial_failed" and self.failure_class and self.evidence:
            return TrialFailed(self.failure_class, self.evidence)
        prefix = f"{where}: " if where else ""
        if self.kind == "internal":
            lines = self.message.strip().splitlines() or ["?"]
            bug = RuntimeError(prefix + lines[-1])
            if hasattr(bug, "add_note"):  # Python 3.11+
                bug.add_note(self.message)
            return bug
        return _KINDS.get(self.kind, ServesweepError)(prefix + self.message)


_KINDS: dict[str, type[ServesweepError]] = {
    "dataset": DatasetError,
    "bench": BenchError,
    "config": ConfigError,
}
"""Kinds that travel as themselves (most specific first)."""


def short_error(text: str, limit: int = 300) -> str:
    """The lines of a cluster's error message that say what happened, on one line, at
    most ``limit`` characters: cut after a whole word, with ``...`` when cut."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    keep = [
        line for line in lines if not re.match(r"(class_name|actor_id|pid|namespace|name):", line)
    ]
    joined = " ".join(keep)
    if len(joined) <= limit:
        return joined
    cut = joined[: max(0, limit - 3)]
    if " " in cut and not joined[len(cut)].isspace():
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:") + "..."


def lost_evidence(
    node: NodeInfo, slot: int, trial: int, cluster_error: str, *, dead: bool
) -> Evidence:
    """The evidence of a trial whose node (or slot process) was lost."""
    what = f"node {node.name}" if dead else f"the slot's process on node {node.name}"
    return Evidence(
        message=f"trial {trial}: {what} was lost ({short_error(cluster_error, 200)})",
        reason="node_died" if dead else "slot_process_died",
        details={
            "node": node.name,
            "node_id": node.node_id,
            "slot": slot,
            "node_dead": dead,
            "cluster_error": cluster_error[:2000],
        },
    )


def cluster_spec(spec: SweepSpec, nodes: Sequence[NodeInfo]) -> SweepSpec:
    """The sweep as the driver schedules it on a cluster: the GPU pool is the largest
    node's GPUs as Ray numbers them (each node's own pool is what Ray offers there), so
    ``gpus_per_trial`` left out means a whole node."""
    if not nodes:
        return spec
    largest = max(nodes, key=lambda n: len(n.gpus))
    server = spec.server.model_copy(update={"gpus": list(largest.gpus)})
    return spec.model_copy(update={"server": server})


def trial_needs(
    spec: SweepSpec, configs: Sequence[Mapping[str, Any]], nodes: Sequence[NodeInfo]
) -> dict[str, int]:
    """GPUs each configuration (label -> GPUs) needs on a cluster, before any node's
    size is applied: a number, a whole node, or the expression's value."""
    labels = [params_label(p) for p in configs]
    raw = spec.server.gpus_per_trial
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if isinstance(raw, int):
        return dict.fromkeys(labels, raw)
    if raw is None:
        return dict.fromkeys(labels, max((len(n.gpus) for n in nodes), default=1))
    need = replace(gpu_need(cluster_spec(spec, nodes)), pool=2**31)
    return {label: need.of(p) for label, p in zip(labels, configs, strict=True)}


def check_fit(needs: Mapping[str, int], nodes: Sequence[NodeInfo], where: str) -> list[str]:
    """ConfigError when the cluster has no node with GPUs, or no configuration (label ->
    GPUs it needs) fits on any node; the warnings for those that fit on none (the run
    skips them, with the reason)."""
    if not nodes:
        raise ConfigError(
            f"the Ray cluster at {where} has no alive node with GPUs (declare them with "
            "`ray start --num-gpus N`, or start the nodes on machines with GPUs)",
            key="--ray",
        )
    largest = max(nodes, key=lambda n: len(n.gpus))
    too_big = {label: need for label, need in needs.items() if need > len(largest.gpus)}
    lines = [
        f"{label} needs {need} GPUs, but no node of the Ray cluster at {where} has that "
        f"many (largest: {largest.name} with {len(largest.gpus)})"
        for label, need in too_big.items()
    ]
    if lines and len(too_big) == len(needs):
        raise ConfigError(lines[0], key="server.gpus_per_trial")
    return [f"{line}: skipped" for line in lines]


def check_cluster(spec: SweepSpec, nodes: Sequence[NodeInfo], where: str) -> list[str]:
    """Before anything is created: ConfigError when no configuration of the plan fits on
    any node or ``gpus_per_trial`` is bad; the warnings to show (the configurations that
    fit on no node, which the run skips; ``server.gpus`` is not used on a cluster). A
    sampling search's configurations are checked as it proposes them."""
    warnings = []
    if not spec.search.samples:
        configs = [c.params for c in expand_configs(spec)]
        warnings += check_fit(trial_needs(spec, configs, nodes), nodes, where)
    gpu_need(cluster_spec(spec, nodes))
    if not spec.server.gpus:
        return warnings
    # said whenever the list is set, even when it happens to match a node's GPUs
    return [
        *warnings,
        f"server.gpus {spec.server.gpus} is not used on a Ray cluster: each node's GPUs "
        "are those Ray offers there",
    ]
