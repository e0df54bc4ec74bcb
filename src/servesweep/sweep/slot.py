"""The work of one trial on the machine that owns its GPUs: one slot.

A slot is a set of GPUs and a port on one machine. Its :class:`SlotWorker` moves the
slot's server from one configuration to the next — stop → release → start → load →
ready → bench → done — and reports every state change as a typed event
(``sweep.events``) through a :class:`~servesweep.sweep.channel.TrialChannel`. It
never reads or writes the results database: the driver, which owns the database and
the search, hands it a :class:`TrialOrder` and applies its events. The same worker
runs in a thread of ``servesweep run`` (local slots) and inside a Ray actor on
another machine (cluster slots); only the channel differs.

A failed trial is data: the lifecycle raises ``TrialFailed``; the worker reports the
failure class and the evidence and is ready for the next order. ``interrupt`` (from
another thread) stops the slot's instance and makes the running work end with
``Interrupted``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from servesweep.bench.capacity import error_checked
from servesweep.bench.load import run_workload_sync
from servesweep.bench.target import Target
from servesweep.bench.workers import WorkerPool
from servesweep.errors import BenchError, DatasetError, Interrupted, TrialFailed
from servesweep.models import (
    Evidence,
    FailureClass,
    InstanceRecord,
    LevelResult,
    Outcome,
    Phase,
    fingerprint,
)
from servesweep.search.prune import PrunePolicy, prune_reason
from servesweep.servers.engines import build_launch, get_preset
from servesweep.servers.gpu import FAKE_GPUS_ENV, open_probe
from servesweep.servers.launchers import make_launcher
from servesweep.servers.lifecycle import ServerLifecycle
from servesweep.servers.ownership import Ownership
from servesweep.spec.schema import ServerSpec, SweepSpec, WorkloadSpec
from servesweep.store.records import TelemetryPoint
from servesweep.sweep.channel import TrialChannel
from servesweep.sweep.events import (
    GpusReleased,
    InstanceGone,
    InstanceStarted,
    InstanceStopped,
    LevelMeasured,
    PhaseEntered,
    PhaseSeconds,
    Progress,
    SweepWarning,
    TelemetrySampled,
    TrialFinished,
    TrialStarted,
    UnitRestored,
    WorkloadDone,
    headline,
)

__all__ = [
    "CurrentInstance",
    "GeneratorPools",
    "Launch",
    "LoadRunner",
    "NodeInfo",
    "Placement",
    "SlotWorker",
    "SweepContext",
    "TrialOrder",
    "instance_pids",
    "launch_fingerprint",
    "launch_for",
    "slot_server",
    "stop_instance",
    "stop_timeout",
]

DYING_GRACE_S = 2.0
"""How long a server whose requests failed may take to show that it exited."""

LoadRunner = Callable[
    [Target, WorkloadSpec, Callable[[str], None], Callable[[LevelResult], bool]],
    list[LevelResult],
]
"""Runs one workload against a slot's server — ``(target, workload, progress,
after_level)``, ``after_level`` saying after each level whether to go on — and returns
its level results (raising ``BenchError`` like the load generator): by default the
load generator on the server's machine; on a cluster it may run on another node."""


@dataclass(frozen=True)
class SweepContext:
    """What every slot of one sweep run needs; plain data (it travels to other machines)."""

    spec: SweepSpec
    sweep_id: int
    store_id: str
    """The results database's id: part of every instance's owner tag."""
    store_path: str
    run: str
    """This run's id: instances of other (dead) runs of the database are leftovers."""
    log_root: str
    base_dir: str | None = None
    """Folder of the sweep file: relative dataset and suite paths start there."""
    fake_gpu_dir: str | None = None
    api_key: str | None = field(default=None, repr=False)
    """The server's API key, from the environment; never stored or logged."""
    slots: int = 1
    """How many slots may run at once on a machine: with more than one, each slot's
    load generator runs in processes of its own (never in the driver's interpreter,
    where the slots' threads would compete for it)."""


@dataclass(frozen=True)
class NodeInfo:
    """One machine a sweep runs on."""

    name: str
    """Its hostname, as records store it (``InstanceRecord.node``)."""
    gpus: tuple[int, ...]
    """The GPU pool there."""
    node_id: str = ""
    """The cluster's id of it (Ray's node id); empty on this machine alone."""

    @property
    def key(self) -> str:
        """Unique among the machines of a run (two cluster nodes may share a hostname)."""
        return self.node_id or self.name


@dataclass(frozen=True)
class Placement:
    """Where a slot is: the machine, its slot number there, its GPUs and its port."""

    node: str
    slot: int
    gpus: tuple[int, ...]
    port: int
    node_id: str = ""

    @property
    def node_key(self) -> str:
        return self.node_id or self.node

    @property
    def key(self) -> tuple[str, int]:
        return (self.node_key, self.slot)


@dataclass(frozen=True)
class TrialOrder:
    """One attempt of one trial, as the driver hands it to a slot."""

    trial: int
    seq: int
    attempt: int
    fingerprint: str
    params: Mapping[str, Any]
    log_path: str
    prune: PrunePolicy | None = None
    """When set, the benchmark stops early once the trial can no longer win (see
    ``search.prune``): the outcome is ``pruned`` with the reason."""
    number: int = 0
    """The trial's number within its sweep, for people (0: use ``trial``)."""
    relaunch: tuple[int, ...] = ()
    """The confirm phase: measure the finished trial again in launches of these
    numbers (each a fresh start of its configuration), appended to its results."""


class _Pruned(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class CurrentInstance:
    """The instance running in the slot, and the trial that started it."""

    trial: int
    instance: InstanceRecord
    model: str | None = None
    """The served model name once a readiness check has proven it generates."""


def slot_server(server: ServerSpec, placement: Placement) -> ServerSpec:
    """The sweep's server section as one slot sees it: its port and GPUs, and a
    systemd unit template (``name@.service``) instantiated with the slot number."""
    update: dict[str, Any] = {"port": placement.port, "gpus": list(placement.gpus)}
    if server.systemd is not None and "@." in server.systemd.unit:
        unit = server.systemd.unit.replace("@.", f"@{placement.slot}.", 1)
        update["systemd"] = server.systemd.model_copy(update={"unit": unit})
    return server.model_copy(update=update)


def launch_fingerprint(server: ServerSpec, argv: Sequence[str], env: Mapping[str, str]) -> str:
    """What makes two instances the same measurement target: the exact command line and
    environment, the launcher and what it runs in. Adoption requires it to be equal."""
    launcher: dict[str, Any] = {"kind": server.launcher}
    if server.systemd is not None:
        launcher["unit"] = server.systemd.unit
    if server.docker is not None:
        launcher["docker"] = server.docker.model_dump()
    if server.commands is not None:
        launcher["commands"] = server.commands.model_dump()
    return fingerprint({"argv": list(argv), "env": dict(env), "launcher": launcher})


@dataclass(frozen=True)
class Launch:
    """How a configuration starts on a slot: its command line, its environment and the
    launch fingerprint (what adoption compares)."""

    argv: list[str]
    env: dict[str, str]
    fingerprint: str


def launch_for(
    context: SweepContext,
    placement: Placement,
    params: Mapping[str, Any],
    *,
    trial: str | None = None,
    log: str | None = None,
) -> Launch:
    """The launch of a configuration on a slot: the one place it is built.

    ``trial`` (the trial's key) and ``log`` fill a command template's ``{trial}``,
    ``{log}`` and ``{pid_file}``; left out, the template keeps its placeholders (the
    launch of no trial in particular). The fingerprint always leaves them out, so an
    instance started for one trial is recognised as the same launch by another."""
    server = slot_server(context.spec.server, placement)
    extra = {FAKE_GPUS_ENV: context.fake_gpu_dir} if context.fake_gpu_dir else {}

    def build(trial: str, log: str) -> tuple[list[str], dict[str, str]]:
        argv, env = build_launch(server, params, trial=trial, log=log)
        return argv, {**extra, **env}

    # the same launch for any trial: the template's own placeholders stand for them
    plain = build("{trial}", "{log}")
    fp = launch_fingerprint(server, *plain)
    argv, env = plain if trial is None and log is None else build(trial or "", log or "")
    return Launch(argv, env, fp)


def instance_pids(lifecycle: ServerLifecycle, instance: InstanceRecord) -> set[int]:
    """Every PID of an instance before it is stopped: what its launcher finds now plus
    the recorded ones, which the release gate must also see gone from the GPUs."""
    return set(lifecycle.launcher.pids(instance)) | set(instance.pids)


class _Telemetry:
    """Samples the slot's GPUs in the background for the report's memory timeline:
    every ``interval`` seconds, and every ``fast_interval`` while an instance stops
    and its memory comes back (so no release falls between two samples)."""

    def __init__(
        self, lifecycle: ServerLifecycle, node: str, interval: float = 0.25, fast: float = 0.05
    ) -> None:
        self._probe = lifecycle.probe
        self._gpus = list(lifecycle.spec.gpus)
        self._node = node
        self._interval = interval
        self._fast_interval = fast
        self._fast = False
        self._points: list[tuple[float, int, int, float | None, float | None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        if self._probe.name == "none" or not self._gpus:
            return
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def fast(self, on: bool) -> None:
        self._fast = on

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                states = self._probe.snapshot(self._gpus)
            except Exception:
                states = []
            now = time.time()
            with self._lock:
                for s in states:
                    self._points.append((now, s.index, s.used_bytes, s.utilization_pct, s.power_w))
            self._stop.wait(self._fast_interval if self._fast else self._interval)

    def drain(self, trial_id: int) -> tuple[TelemetryPoint, ...]:
        with self._lock:
            points, self._points = self._points, []
        return tuple(
            TelemetryPoint(trial_id, t, g, u, ut, p, self._node) for t, g, u, ut, p in points
        )

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


class GeneratorPools:
    """Load-generator processes by slot number, started once and kept across the
    slots that take that number (a slot's thread, pinned to its cores, starts them)."""

    def __init__(self) -> None:
        self._pools: dict[int, WorkerPool] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, slot: int, n: int, timeout_s: float) -> WorkerPool:
        """The slot number's ``n`` generator processes, started when missing (a second
        caller for the same slot waits for the first one's)."""
        with self._lock:
            slot_lock = self._locks.setdefault(slot, threading.Lock())
        with slot_lock:
            pool = self._pools.get(slot)
            if pool is not None and (pool.n != n or not pool.alive):
                pool.close()
                pool = None
            if pool is None:
                pool = WorkerPool.started(n, timeout_s)
                with self._lock:
                    self._pools[slot] = pool
            return pool

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


class SlotWorker:
    """Runs trials on one slot; reports through ``channel`` (see the module doc)."""

    def __init__(
        self,
        context: SweepContext,
        placement: Placement,
        channel: TrialChannel,
        *,
        current: CurrentInstance | None = None,
        baseline: Mapping[int, int] | None = None,
        generators: GeneratorPools | None = None,
        load: LoadRunner | None = None,
    ) -> None:
        self.context = context
        self.placement = placement
        self.channel = channel
        self._load: LoadRunner = load or self._load_here
        self.server = slot_server(context.spec.server, placement)
        self.workloads: list[WorkloadSpec] = list(context.spec.workloads)
        self.preset = get_preset(self.server.engine)
        self.launcher = make_launcher(self.server)
        self.probe = open_probe(
            self.server.gpu_backend, context.fake_gpu_dir, gpus=self.server.gpus
        )
        self.lifecycle = ServerLifecycle(
            self.server,
            self.preset,
            self.launcher,
            self.probe,
            ownership=Ownership(context.store_id, context.run, placement.slot),
            store_path=context.store_path,
        )
        self.lifecycle.baseline = dict(baseline or {})
        self.current = current
        self._cancel = threading.Event()
        self._own_generators = generators is None
        self.generators = generators or GeneratorPools()
        self._phase: tuple[Phase, float] | None = None
        self._phase_seconds: dict[str, float] = {}
        """Durations of the running trial's finished phases (for pruning on load_s)."""
        self._telemetry = _Telemetry(self.lifecycle, placement.node)
        self._telemetry.start()
        for warning in self.launcher.warnings:
            # what the service's own settings imply (systemd: Type=simple, KillMode...)
            self.warn(str(warning))

    # -- plumbing -------------------------------------------------------------------

    @property
    def node(self) -> str:
        return self.placement.node

    def emit(self, event: Any) -> None:
        self.channel.send(event)

    def warn(self, message: str, trial: int | None = None) -> None:
        self.emit(SweepWarning(trial=trial, message=message))

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise Interrupted("the sweep is being stopped")

    def _enter(self, trial: int, phase: Phase) -> None:
        self._check_cancel()
        now = time.time()
        if self._phase is not None:
            self._phase_seconds[self._phase[0].value] = now - self._phase[1]
        self._phase = (phase, now)
        self.emit(PhaseEntered(trial=trial, phase=phase, at=now))

    def trial_key(self, trial: int) -> str:
        return f"{self.context.spec.name}-{trial}"

    def launch_of(self, order: TrialOrder) -> Launch:
        """The launch of a trial's configuration here."""
        return launch_for(
            self.context,
            self.placement,
            order.params,
            trial=self.trial_key(order.trial),
            log=order.log_path,
        )

    def _target(self, model: str) -> Target:
        return Target(
            base_url=f"http://{self.server.host}:{self.server.port}",
            model=model,
            api_key=self.context.api_key,
            request_extras=dict(self.preset.request_extras),
            supports_ignore_eos=self.preset.supports_ignore_eos,
            metrics_path=self.preset.metrics_path,
            tokenize_path=self.preset.tokenize_path,
            spec_decode_counters=dict(self.preset.spec_decode_counters),
            timeout_s=self.server.timeouts.request,
        )

    def _load_here(
        self,
        target: Target,
        workload: WorkloadSpec,
        progress: Callable[[str], None],
        after_level: Callable[[LevelResult], bool],
    ) -> list[LevelResult]:
        """The load generator on this machine (the slot's generator processes),
        sampling the slot's GPUs as it runs."""
        return run_workload_sync(
            target,
            workload,
            probe=self.probe,
            gpus=list(self.server.gpus),
            on_progress=progress,
            workers=workload.workers,
            base_dir=self.context.base_dir,
            after_level=after_level,
            pool=self._generators(workload, target.timeout_s),
        )

    def interrupt(self) -> None:
        """From any thread: make the running work end with ``Interrupted`` and stop the
        slot's instance at once (no release wait: the process is exiting)."""
        self._cancel.set()
        current = self.current
        if current is None:
            return
        try:
            self.lifecycle.stop(current.instance)
        except TrialFailed as failure:
            self.warn(f"stop after interrupt: {failure}", current.trial)
        self.emit(InstanceGone(trial=current.trial))
        self.current = None

    def _generators(self, workload: WorkloadSpec, timeout_s: float) -> WorkerPool | None:
        """Load-generator processes for ``workload``: when slots run side by side, every
        slot's generator runs in processes of its own (the slots' threads would otherwise
        compete for one interpreter), kept for the slot number's later trials."""
        n = max(1, workload.workers)
        if n == 1 and self.context.slots <= 1:
            return None
        return self.generators.get(self.placement.slot, n, timeout_s)

    def close(self) -> None:
        if self._own_generators:
            self.generators.close()
        self._telemetry.stop()
        self.probe.close()

    # -- the slot's instance --------------------------------------------------------

    def stop_current(self, trial: int | None = None) -> None:
        """Stop the slot's instance and wait for its GPU memory.

        With ``trial`` the two phases are recorded on it; raises TrialFailed
        (``stop_failed`` / ``gpu_busy``) like any phase.
        """
        old_pids: set[int] = set()
        if trial is not None:
            self._enter(trial, Phase.STOP)
        self._telemetry.fast(True)
        try:
            current = self.current
            if current is not None:
                old_pids = instance_pids(self.lifecycle, current.instance)
                stop = self.lifecycle.stop(current.instance)
                self.current = None
                self.emit(InstanceGone(trial=current.trial))
                self.emit(
                    InstanceStopped(
                        trial=trial,
                        instance_of=current.trial,
                        seconds=round(stop.seconds, 3),
                        signalled=tuple(stop.signalled),
                        killed=tuple(stop.killed),
                        node=self.node,
                    )
                )
            if trial is not None:
                self._enter(trial, Phase.RELEASE)
            result = self.lifecycle.release(
                list(self.server.gpus), old_pids, cancelled=self._cancel.is_set
            )
        finally:
            self._telemetry.fast(False)
        cleaned = tuple(p.describe() for p in result.cleaned)
        self.emit(
            GpusReleased(
                trial=trial,
                seconds=round(result.seconds, 3),
                polls=result.polls,
                cleaned=cleaned,
                node=self.node,
                gpus=tuple(self.server.gpus),
            )
        )
        if cleaned:
            self.warn(f"cleaned orphaned processes of our instance: {', '.join(cleaned)}", trial)

    def teardown(self) -> None:
        """Stop the slot's instance and wait for its memory (the GPUs go back to the pool)."""
        if self.current is not None:
            trial = self.current.trial
            try:
                self.stop_current()
            except TrialFailed as failure:
                self.warn(f"stopping the instance of trial {trial}: {failure}")

    def finish(self, keep_running: bool, restart_units: Sequence[str] = ()) -> None:
        """The sweep is over for this slot: stop the last instance (unless
        ``keep_running``) and give a service manager's unit its own settings back
        (started again when it ran before the sweep: ``restart_units``)."""
        if not keep_running:
            self.teardown()
        self.restore(
            keep_running=keep_running and self.current is not None, restart_units=restart_units
        )

    def restore(self, *, keep_running: bool, restart_units: Sequence[str] = ()) -> None:
        """Give a service manager's unit back (see ``SystemdLauncher.restore``)."""
        unit = self.server.systemd.unit if self.server.systemd else ""
        message = self.launcher.restore(keep_running=keep_running, restart=unit in restart_units)
        if message:
            self.emit(UnitRestored(unit=unit, message=message, node=self.node))

    # -- one trial ------------------------------------------------------------------

    def run(self, order: TrialOrder) -> None:
        """Run one attempt of a trial to a final outcome (or raise ``Interrupted``)."""
        log_path = Path(order.log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.emit(
            TrialStarted(
                trial=order.trial,
                seq=order.seq,
                number=order.number or order.trial,
                params=dict(order.params),
                attempt=order.attempt,
                at=time.time(),
                log_path=order.log_path,
                node=self.node,
                node_id=self.placement.node_id,
                slot=self.placement.slot,
                gpus=tuple(self.server.gpus),
                port=self.server.port,
                relaunch=bool(order.relaunch),
            )
        )
        self._telemetry.drain(order.trial)
        self._phase, self._phase_seconds = None, {}
        outcome, failure_class, evidence = Outcome.OK, None, None
        try:
            launches = order.relaunch or range(1, self.context.spec.max_launches)
            if not order.relaunch:
                model = self._bring_up(order, log_path)
                self._enter(order.trial, Phase.BENCH)
                self._bench(order, model)
            for launch in launches:
                # measured again in a launch of its own: stop, release, start, ready
                model = self._bring_up(order, log_path, fresh=True)
                self._enter(order.trial, Phase.BENCH)
                self._bench(order, model, launch)
        except TrialFailed as failure:
            outcome, failure_class, evidence = (
                Outcome.FAILED,
                failure.failure_class,
                failure.evidence,
            )
        except _Pruned as pruned:
            outcome = Outcome.PRUNED
            evidence = Evidence(message=pruned.reason, reason="pruned")
        finally:
            points = self._telemetry.drain(order.trial)
            if points:
                self.emit(TelemetrySampled(trial=order.trial, points=points))
        self._check_cancel()
        self.emit(
            TrialFinished(
                trial=order.trial,
                outcome=outcome,
                failure_class=failure_class,
                evidence=evidence,
                at=time.time(),
                relaunch=bool(order.relaunch),
            )
        )

    def serve(self, order: TrialOrder) -> tuple[str, float]:
        """Move the slot to the configuration of ``order`` and leave it running (no
        phases, no benchmark: ``servesweep apply``). Returns the served model and how
        long it took to become ready; raises TrialFailed like a trial's bring-up."""
        log_path = Path(order.log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        launch = self.launch_of(order)
        current = self.current
        if current is not None and current.instance.fingerprint == launch.fingerprint:
            info = self.lifecycle.wait_ready(current.instance)
            return info.model, 0.0
        self.stop_current()
        instance = _on_node(
            self.lifecycle.start(
                launch.argv, launch.env, log_path, self.trial_key(order.trial), launch.fingerprint
            ),
            self.placement,
        )
        self.current = CurrentInstance(order.trial, instance)
        self.emit(
            InstanceStarted(
                trial=order.trial,
                instance=instance,
                launch_command=self.lifecycle.launch_command(launch.argv, launch.env),
            )
        )
        info = self.lifecycle.wait_ready(instance)
        self.current = CurrentInstance(order.trial, instance, info.model)
        return info.model, info.ready_s

    def _bring_up(self, order: TrialOrder, log_path: Path, *, fresh: bool = False) -> str:
        """Stop, release, start, load, ready; or adopt a running instance of this launch
        (never when ``fresh``: a configuration's next launch)."""
        launch = self.launch_of(order)
        current = self.current
        if (
            not fresh
            and current is not None
            and current.instance.fingerprint == launch.fingerprint
            and self.launcher.poll(current.instance) is None
        ):
            self.warn(f"trial {order.trial}: adopting the running instance", order.trial)
            if current.trial != order.trial:
                self.emit(InstanceGone(trial=current.trial))
            self.emit(InstanceStarted(trial=order.trial, instance=current.instance, adopted=True))
            self.current = CurrentInstance(order.trial, current.instance, current.model)
            self._enter(order.trial, Phase.READY)
            info = self.lifecycle.wait_ready(current.instance, self._progress(order.trial))
            return info.model

        self.stop_current(order.trial)
        self._enter(order.trial, Phase.START)
        instance = self.lifecycle.start(
            launch.argv, launch.env, log_path, self.trial_key(order.trial), launch.fingerprint
        )
        instance = _on_node(instance, self.placement)
        self.current = CurrentInstance(order.trial, instance)
        self.emit(
            InstanceStarted(
                trial=order.trial,
                instance=instance,
                launch_command=self.lifecycle.launch_command(launch.argv, launch.env),
            )
        )
        self._enter(order.trial, Phase.LOAD)
        load_started = time.time()
        in_ready = False
        report = self._progress(order.trial)

        def progress(phase: str, elapsed: float, line: str) -> None:
            nonlocal in_ready
            if phase == Phase.READY.value and not in_ready:
                in_ready = True
                self._enter(order.trial, Phase.READY)
            report(phase, elapsed, line)

        info = self.lifecycle.wait_ready(instance, progress)
        if not in_ready:
            # became ready between two polls: the whole wait was loading
            self._enter(order.trial, Phase.READY)
            self.emit(
                PhaseSeconds(
                    trial=order.trial, phase=Phase.LOAD, seconds=time.time() - load_started
                )
            )
        self.current = CurrentInstance(order.trial, instance, info.model)
        return info.model

    def _progress(self, trial: int) -> Callable[[str, float, str], None]:
        def progress(phase: str, elapsed: float, line: str) -> None:
            self._check_cancel()
            self.emit(Progress(trial=trial, phase=phase, elapsed=elapsed, line=line))

        return progress

    def _bench(self, order: TrialOrder, model: str, launch: int = 0) -> None:
        """The workloads measured in launch ``launch`` of the configuration (all in the
        first; in a later one those whose ``launches`` reach it)."""
        assert self.current is not None
        target = self._target(model)
        instance = self.current.instance
        measured: list[LevelResult] = []
        spec = self.context.spec
        if order.relaunch:
            # the confirm phase measures every workload a launch can measure again
            workloads = [w for w in self.workloads if w.capacity is None]
        else:
            workloads = [w for w in self.workloads if spec.launches_of(w) > launch]
        loads = [w for w in workloads if not w.is_eval and w.capacity is None]
        if loads and loads[0].warmup == "auto":
            # the launch's first load workload warms the fresh server until it settles
            warm = loads[0].model_copy(update={"warmup": "launch"})
            workloads = [warm if w is loads[0] else w for w in workloads]
        left = sum(_levels(w) for w in workloads)
        pruned: list[str] = []

        def after_level(result: LevelResult) -> bool:
            """Keep benchmarking unless the trial can no longer win (pruning)."""
            nonlocal left
            measured.append(result)
            left -= 1
            if self._cancel.is_set():
                return False
            if order.prune is None or left <= 0:
                return True
            reason = prune_reason(order.prune, measured, self._phase_seconds)
            if reason:
                pruned.append(reason)
                return False
            return True

        for workload in workloads:
            self._check_cancel()

            def progress(message: str, name: str = workload.name) -> None:
                self.emit(Progress(trial=order.trial, phase="bench", line=message, workload=name))

            try:
                results = self._load(target, workload, progress, after_level)
            except DatasetError:
                raise
            except BenchError as exc:
                self._check_cancel()
                self.lifecycle.check_alive(instance)
                raise TrialFailed(
                    FailureClass.BENCH_ERRORS,
                    Evidence(message=f"{workload.name}: {exc}", reason="bench_error"),
                ) from exc
            self._check_cancel()
            # what was measured is kept, even when the server died during the workload
            results = [replace(r, launch=launch) if launch else r for r in results]
            for result in results:
                self.emit(LevelMeasured(trial=order.trial, result=result))
                for warning in result.warnings:
                    self.warn(f"trial {order.trial} {workload.name}: {warning}", order.trial)
            self.emit(
                WorkloadDone(
                    trial=order.trial,
                    workload=workload.name,
                    levels={r.level: headline(r) for r in results},
                )
            )
            self.lifecycle.check_alive(instance)
            if pruned:
                raise _Pruned(pruned[0])
            try:
                _check_errors(workload, results)
            except TrialFailed:
                # requests failing because the server is dying (a SIGKILLed engine with
                # large GPU allocations takes a moment to exit) is bench_crash, not
                # bench_errors: give its exit a moment to become visible
                deadline = time.monotonic() + DYING_GRACE_S
                while time.monotonic() < deadline:
                    self.lifecycle.check_alive(instance)
                    time.sleep(0.05)
                raise


def _levels(workload: WorkloadSpec) -> int:
    """How many level results a workload gives (for telling whether any come after)."""
    if workload.is_eval or workload.capacity is not None:
        return 1
    return (len(workload.concurrency) + len(workload.rate)) * workload.repeats


def _on_node(instance: InstanceRecord, placement: Placement) -> InstanceRecord:
    return replace(instance, node=placement.node, node_id=placement.node_id)


def _check_errors(workload: WorkloadSpec, results: Sequence[LevelResult]) -> None:
    if workload.is_eval:
        return
    # a capacity search goes beyond the load the server sustains on purpose: only the
    # levels it judged are held to the error limit
    for result in error_checked(workload, results):
        rate = result.metrics.get("error_rate", 0.0)
        if rate > workload.max_error_rate:
            errors = result.info.get("errors_by_type") or result.info.get("errors") or {}
            raise TrialFailed(
                FailureClass.BENCH_ERRORS,
                Evidence(
                    message=(
                        f"{workload.name} {result.level}: {rate:.1%} of requests failed "
                        f"(limit {workload.max_error_rate:.1%})"
                    ),
                    reason="error_rate",
                    details={"errors": errors, "level": result.level},
                ),
            )


def stop_instance(
    context: SweepContext,
    placement: Placement,
    channel: TrialChannel,
    current: CurrentInstance,
    baseline: Mapping[int, int] | None,
    warning: str = "",
) -> None:
    """Stop ``current`` (an instance no slot of this run drives any more) with a
    throwaway slot on its GPUs: the stop, then the release gate against ``baseline``
    (the node's idle memory; without it the gate expects empty GPUs)."""
    where = replace(placement, gpus=tuple(current.instance.gpus) or placement.gpus)
    mine = {g: v for g, v in (baseline or {}).items() if g in where.gpus}
    worker = SlotWorker(context, where, channel, current=current, baseline=mine)
    try:
        if warning:
            worker.warn(warning)
        worker.teardown()
    finally:
        worker.close()


def stop_timeout(server: ServerSpec) -> float:
    """How long stopping an instance may take at most: its stop, kill and release
    timeouts, and a minute for everything around them."""
    t = server.timeouts
    return t.stop + t.kill + t.release + 60.0


def this_node() -> str:
    """The name of this machine, as records store it."""
    return socket.gethostname()


def pin_current_thread(cpus: Sequence[int]) -> None:
    """Keep the calling thread (and the processes it starts, such as load-generator
    workers) on ``cpus`` (Linux: the affinity of one thread)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cpus))
