"""One server instance of a slot: the lifecycle that starts, watches and stops it, built
in one place (:func:`server_lifecycle`), and stopping one instance with its release
gate, as a slot does between trials and as a run does for an instance no slot drives
any more (:func:`stop_instance`: no slot is built for it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from servesweep.errors import TrialFailed
from servesweep.models import InstanceRecord
from servesweep.servers import logs
from servesweep.servers.config_check import check_server
from servesweep.servers.engines import EnginePreset, get_preset
from servesweep.servers.gpu import open_probe
from servesweep.servers.gpu.base import GpuProbe
from servesweep.servers.http_probe import connect_host
from servesweep.servers.launchers import Launcher, make_launcher
from servesweep.servers.launchers.base import StopResult
from servesweep.servers.lifecycle import ServerLifecycle
from servesweep.servers.ownership import Ownership
from servesweep.servers.release import ReleaseResult
from servesweep.spec.schema import ServerSpec
from servesweep.sweep.events import (
    ConfigMismatched,
    Event,
    GpusReleased,
    InstanceGone,
    InstanceStopped,
    SweepWarning,
)
from servesweep.sweep.slots.channel import TrialChannel
from servesweep.sweep.slots.data import CurrentInstance, Placement, SweepContext
from servesweep.sweep.slots.launch import slot_server

__all__ = [
    "config_mismatches",
    "instance_pids",
    "placed",
    "released_events",
    "server_lifecycle",
    "stop_instance",
    "stop_timeout",
    "stopped_events",
]


def server_lifecycle(
    context: SweepContext,
    server: ServerSpec,
    probe: GpuProbe,
    slot: int,
    launcher: Launcher | None = None,
) -> ServerLifecycle:
    """The lifecycle of ``server`` (a slot's view of the server section) on slot ``slot``
    of this run: its engine's preset, ``launcher`` (by default the one the section
    names), the run's ownership tag and the results database's path."""
    return ServerLifecycle(
        server,
        get_preset(server.engine),
        launcher or make_launcher(server),
        probe,
        ownership=Ownership(context.store_id, context.run, slot),
        store_path=context.store_path,
        api_key=context.api_key,
    )


def instance_pids(lifecycle: ServerLifecycle, instance: InstanceRecord) -> set[int]:
    """Every PID of an instance before it is stopped: what its launcher finds now plus
    the recorded ones, which the release gate must also see gone from the GPUs."""
    return set(lifecycle.launcher.pids(instance)) | set(instance.pids)


def placed(instance: InstanceRecord, placement: Placement) -> InstanceRecord:
    """``instance`` as started on ``placement``'s machine (its records say where)."""
    return replace(instance, node=placement.node, node_id=placement.node_id)


def stopped_events(
    current: CurrentInstance, stop: StopResult, trial: int | None, node: str
) -> list[Event]:
    """What a stopped instance reports: it is gone, and how its stop went (``trial``:
    the trial whose phase stopped it, if any)."""
    return [
        InstanceGone(trial=current.trial),
        InstanceStopped(
            trial=trial,
            instance_of=current.trial,
            seconds=round(stop.seconds, 3),
            signalled=tuple(stop.signalled),
            killed=tuple(stop.killed),
            node=node,
        ),
    ]


def released_events(
    result: ReleaseResult, gpus: tuple[int, ...], trial: int | None, node: str
) -> list[Event]:
    """What the release gate reports: how long the GPUs took, and the orphans it
    cleaned (worth a warning)."""
    cleaned = tuple(p.describe() for p in result.cleaned)
    events: list[Event] = [
        GpusReleased(
            trial=trial,
            seconds=round(result.seconds, 3),
            polls=result.polls,
            cleaned=cleaned,
            node=node,
            gpus=gpus,
        )
    ]
    if cleaned:
        message = f"cleaned orphaned processes of our instance: {', '.join(cleaned)}"
        events.append(SweepWarning(trial=trial, message=message))
    return events


def stop_instance(
    context: SweepContext,
    placement: Placement,
    channel: TrialChannel,
    current: CurrentInstance,
    baseline: Mapping[int, int] | None,
    warning: str = "",
) -> None:
    """Stop ``current`` (an instance no slot of this run drives any more) on its GPUs:
    the stop, then the release gate against ``baseline`` (the node's idle memory;
    without it the gate expects empty GPUs). A failed stop is a warning."""
    where = replace(placement, gpus=tuple(current.instance.gpus) or placement.gpus)
    server = slot_server(context.spec.server, where)
    probe = open_probe(server.gpu_backend, context.fake_gpu_dir, gpus=server.gpus)
    try:
        lifecycle = server_lifecycle(context, server, probe, where.slot)
        lifecycle.baseline = {g: v for g, v in (baseline or {}).items() if g in where.gpus}
        for note in lifecycle.launcher.warnings:
            channel.send(SweepWarning(message=str(note)))
        if warning:
            channel.send(SweepWarning(message=warning))
        try:
            pids = instance_pids(lifecycle, current.instance)
            stop = lifecycle.stop(current.instance)
            for event in stopped_events(current, stop, None, where.node):
                channel.send(event)
            result = lifecycle.release(list(server.gpus), pids, cancelled=lambda: False)
            for event in released_events(result, tuple(server.gpus), None, where.node):
                channel.send(event)
        except TrialFailed as failure:
            channel.send(
                SweepWarning(message=f"stopping the instance of trial {current.trial}: {failure}")
            )
    finally:
        probe.close()


def stop_timeout(server: ServerSpec) -> float:
    """How long stopping an instance may take at most: its stop, kill and release
    timeouts, and a minute for everything around them."""
    t = server.timeouts
    return t.stop + t.kill + t.release + 60.0


def config_mismatches(
    trial: int,
    server: ServerSpec,
    preset: EnginePreset,
    instance: InstanceRecord,
    params: Mapping[str, Any],
    api_key: str | None,
) -> list[ConfigMismatched]:
    """What the ready server of ``trial`` runs differently from its swept ``params``,
    as the engine says it (:func:`servesweep.servers.config_check.check_server`)."""
    lines: list[str] = []
    if preset.name == "vllm" and instance.log_path:
        lines = logs.instance_lines(instance.log_path, instance.invocation_id)
    found = check_server(
        preset.name,
        connect_host(server.host),
        instance.port or server.port,
        params,
        api_key=api_key,
        log_lines=lines,
    )
    return [
        ConfigMismatched(
            trial=trial,
            message=f"trial {trial}: the server does not run what was asked: {m.describe()}",
            **m.to_dict(),
        )
        for m in found
    ]
