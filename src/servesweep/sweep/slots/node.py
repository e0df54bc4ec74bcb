"""Make one machine ready for a sweep run: deal with what earlier runs left, take the
GPU baseline. Runs on the machine itself (in ``servesweep run`` for local slots, in a
Ray task on a cluster node), before any trial starts there.

* An instance an earlier (dead) run of this results database left running is adopted
  when a pending trial has exactly its launch on exactly its slot; every other one
  is stopped, and its GPU memory waited for.
* A service the sweep runs through (a systemd unit) found running the user's own
  configuration is stopped, and its memory waited for; it is started again at the
  end of the sweep (unless ``--keep-running``).
* The baseline — the memory the release gate waits for — is taken on idle GPUs only:
  the stored baseline of an earlier run of this sweep on this machine is reused
  (lowered when the GPUs now use less), and a fresh one is measured only once every
  instance stopped here has released its memory (see ``servers.release``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from servesweep.errors import ConfigError, TrialFailed
from servesweep.models import InstanceRecord
from servesweep.servers import ports as port_tools
from servesweep.servers.gpu import open_probe
from servesweep.servers.gpu.base import GpuProbe
from servesweep.servers.launchers import make_launcher
from servesweep.servers.ownership import OwnerKind, Ownership
from servesweep.spec.slots import gpu_need, slot_port
from servesweep.sweep.events import (
    BaselineTaken,
    InstanceGone,
    LeftoverStopped,
    OrphansCleaned,
    SweepWarning,
)
from servesweep.sweep.slots.channel import TrialChannel
from servesweep.sweep.slots.data import Placement, SweepContext
from servesweep.sweep.slots.instance import instance_pids, server_lifecycle
from servesweep.sweep.slots.launch import launch_for, slot_server

__all__ = [
    "Leftover",
    "NodePrepared",
    "baseline_without",
    "check_slot_ports",
    "leftover_of",
    "prepare_node",
]


@dataclass(frozen=True)
class Leftover:
    """An instance the results database records as running on this machine."""

    trial: int
    instance: InstanceRecord
    adopt_for: int | None = None
    """The pending trial that would run exactly this launch on its slot (keep it)."""
    label: str = ""
    """The configuration it runs, for messages (``budget=8 topk=4``)."""


def leftover_of(
    context: SweepContext,
    trial: int,
    instance: InstanceRecord,
    slots: Sequence[Placement],
    wanted: Iterable[tuple[int, Mapping[str, Any]]],
    label: str = "",
) -> Leftover:
    """The one rule for what a recorded live instance (of trial ``trial``) is to this
    run: kept for the first trial of ``wanted`` (pending trials and their params) that
    would run exactly its launch on exactly its slot, otherwise stopped.

    Its slot is the one of ``slots`` (where this run places trials) that listens on
    its port and whose GPUs include the instance's; the trial must need as many GPUs as
    the instance holds, and its launch there, on the instance's GPUs, must have the
    instance's fingerprint."""
    gpus = tuple(instance.gpus)
    slot = next((s for s in slots if s.port == instance.port), None)
    if slot is None or not set(gpus) <= set(slot.gpus):
        return Leftover(trial, instance, label=label)
    placement = replace(slot, gpus=gpus)
    need = gpu_need(context.spec)
    for candidate, params in wanted:
        if need.of(params) != max(1, len(gpus)):
            continue
        if launch_for(context, placement, params).fingerprint == instance.fingerprint:
            return Leftover(trial, instance, adopt_for=candidate, label=label)
    return Leftover(trial, instance, label=label)


@dataclass(frozen=True)
class NodePrepared:
    baseline: dict[int, int]
    adopted: tuple[Leftover, ...] = ()
    """Leftovers kept running for their pending trial."""
    restart_services: tuple[str, ...] = ()
    """Units that ran before the sweep and were stopped: start them again at the end."""
    details: Mapping[str, Any] = field(default_factory=dict)


def baseline_without(probe: GpuProbe, gpus: Sequence[int], pids: set[int]) -> dict[int, int]:
    """Used memory per GPU minus what the processes ``pids`` hold."""
    baseline = {}
    for state in probe.snapshot(list(gpus)):
        held = sum(h.used_bytes for h in state.holders if h.pid in pids)
        baseline[state.index] = max(0, state.used_bytes - held)
    return baseline


def check_slot_ports(
    context: SweepContext, host: str, ports: Sequence[int], *, first: bool = False
) -> None:
    """Every port a slot beyond the first may use (``ports[k]`` is slot k's) is free on
    this machine, or held by this database's own instances; with ``first``, slot 0's
    port too (otherwise it is checked at each start, as always). ConfigError
    otherwise."""
    ownership = Ownership(context.store_id, context.run, -1)
    start = 0 if first else 1
    for k, port in enumerate(ports[start:], start=start):
        for info in port_tools.listeners(host, port):
            if info.pid > 0 and ownership.owner(info.pid).kind in (
                OwnerKind.LEFTOVER,
                OwnerKind.MINE,
                OwnerKind.SIBLING,
            ):
                continue
            if k == 0:
                who = info.describe()
                owner = ownership.owner(info.pid) if info.pid > 0 else None
                if owner is not None and owner.kind is OwnerKind.OTHER_RUN:
                    who += f": {owner.describe()}"
                free = port_tools.free_port_near(host, port, avoid=ports, span=len(ports))
                other = f"run on another port with --port {free}" if free else "use --port N"
                raise ConfigError(
                    f"port {port} is in use by {who}; stop that program, or {other}",
                    key="server.port",
                )
            raise ConfigError(
                f"slot {k} would listen on port {port}, which is in use "
                f"({info.describe()}); free it, choose another server.port, list "
                "server.ports, or use fewer --slots",
                key="server.port",
            )


def prepare_node(
    context: SweepContext,
    pool: Placement,
    leftovers: Sequence[Leftover],
    stored_baseline: Mapping[int, int] | None,
    channel: TrialChannel,
    *,
    service_slots: Sequence[int] = (0,),
) -> NodePrepared:
    """Recover and take the baseline of ``pool`` (all the GPUs of the sweep on this
    machine, slot 0's port); see the module doc. Events go through ``channel``."""
    server = slot_server(context.spec.server, pool)
    probe = open_probe(server.gpu_backend, context.fake_gpu_dir, gpus=server.gpus)
    try:
        return _prepare(
            context, pool, server, probe, leftovers, stored_baseline, channel, service_slots
        )
    finally:
        probe.close()


def _prepare(
    context: SweepContext,
    pool: Placement,
    server: Any,
    probe: GpuProbe,
    leftovers: Sequence[Leftover],
    stored_baseline: Mapping[int, int] | None,
    channel: TrialChannel,
    service_slots: Sequence[int],
) -> NodePrepared:
    def warn(message: str) -> None:
        return channel.send(SweepWarning(message=message))

    departing: set[int] = set()
    adopted: list[Leftover] = []
    idle_estimate: dict[int, int] = {}
    for left in leftovers:
        instance = left.instance
        launcher = make_launcher(_server_of(context, instance, server))
        if not launcher.alive(instance):
            channel.send(InstanceGone(trial=left.trial))
            continue
        if left.adopt_for is not None:
            warn(
                f"found the instance of trial {left.trial} still running the launch of "
                f"trial {left.adopt_for}: adopting it"
            )
            adopted.append(left)
            continue
        lifecycle = server_lifecycle(
            context, _server_of(context, instance, server), probe, pool.slot, launcher
        )
        pids = instance_pids(lifecycle, instance)
        _expect(idle_estimate, probe, pool.gpus, pids)
        what = f"trial {left.trial}" + (f" ({left.label})" if left.label else "")
        warn(
            f"stopping the instance of {what}, left running by an earlier run or by "
            "`servesweep apply`: no trial to run needs exactly its launch"
        )
        try:
            stop = lifecycle.stop(instance)
        except TrialFailed as failure:
            warn(f"cannot stop the instance of trial {left.trial}: {failure}")
            raise
        departing |= pids
        channel.send(InstanceGone(trial=left.trial))
        channel.send(
            LeftoverStopped(
                instance_of=left.trial,
                signalled=tuple(stop.signalled),
                killed=tuple(stop.killed),
                reason="left by an earlier run of this results database",
                node=pool.node,
            )
        )
    restart: list[str] = []
    for slot in service_slots:
        unit, pids = _stop_running_service(context, slot, pool, probe, warn, idle_estimate)
        if unit:
            restart.append(unit)
            departing |= pids
    held = {g for left in adopted for g in left.instance.gpus}
    free = [g for g in pool.gpus if g not in held]
    lifecycle = server_lifecycle(context, server, probe, pool.slot, make_launcher(server))
    baseline: dict[int, int] = {}
    if free:
        stored = {g: v for g, v in (stored_baseline or {}).items() if g in free} or None
        expected = {g: v for g, v in idle_estimate.items() if g in free} or None
        baseline.update(
            lifecycle.prepare(free, stored=stored, departing=departing, expected=expected)
        )
        for note in lifecycle.baseline_notes:
            warn(note)
        if lifecycle.cleaned:
            cleaned = tuple(p.describe() for p in lifecycle.cleaned)
            channel.send(OrphansCleaned(cleaned=cleaned, node=pool.node))
            warn("cleaned orphaned servesweep processes: " + ", ".join(cleaned))
        source = lifecycle.baseline_source
    else:
        source = "stored"
    if held:
        # adopted instances hold these GPUs: the stored baseline, or what the GPUs use
        # beside those instances
        pids = {p for left in adopted for p in left.instance.pids}
        beside = baseline_without(probe, sorted(held), pids) if probe.name != "none" else {}
        for gpu in held:
            stored_value = (stored_baseline or {}).get(gpu)
            baseline[gpu] = stored_value if stored_value is not None else beside.get(gpu, 0)
    if baseline:
        channel.send(BaselineTaken(node=pool.node, bytes_by_gpu=dict(baseline), source=source))
    return NodePrepared(baseline=baseline, adopted=tuple(adopted), restart_services=tuple(restart))


def _expect(idle: dict[int, int], probe: GpuProbe, gpus: Sequence[int], pids: set[int]) -> None:
    """Before an instance is stopped: what the GPUs use beside it (its processes are
    listed as holders only while they live), the lowest such reading kept per GPU."""
    if not gpus or probe.name == "none":
        return
    for gpu, value in baseline_without(probe, list(gpus), pids).items():
        idle[gpu] = min(value, idle.get(gpu, value))


def _server_of(context: SweepContext, instance: InstanceRecord, pool_server: Any) -> Any:
    """The server section as the slot of a recorded instance saw it (its port, GPUs)."""
    if instance.port is None:
        return pool_server
    return pool_server.model_copy(
        update={"port": instance.port, "gpus": list(instance.gpus) or pool_server.gpus}
    )


def _stop_running_service(
    context: SweepContext,
    slot: int,
    pool: Placement,
    probe: GpuProbe,
    warn: Callable[[str], None],
    idle_estimate: dict[int, int],
) -> tuple[str, set[int]]:
    """A launcher that manages an existing service (systemd) may find it running the
    user's own configuration: stop it before the first start (its memory is waited for
    with the baseline). Returns the unit (to start again at the end) and its PIDs."""
    port = slot_port(context.spec, slot)
    slot_place = Placement(pool.node, slot, pool.gpus, port, pool.node_id)
    slot_spec = slot_server(context.spec.server, slot_place)
    if slot_spec.launcher != "systemd":
        return "", set()
    launcher = make_launcher(slot_spec)
    running = launcher.current(slot_spec.port)
    if running is None:
        return "", set()
    lifecycle = server_lifecycle(context, slot_spec, probe, pool.slot, launcher)
    pids = instance_pids(lifecycle, running)
    _expect(idle_estimate, probe, pool.gpus, pids)
    unit = running.unit or ""
    warn(
        f"stopping the running {unit or 'service'} before the sweep "
        "(it is started again when the sweep ends, unless --keep-running)"
    )
    lifecycle.stop(running)
    return unit, pids
