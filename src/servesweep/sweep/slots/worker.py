"""The work of one trial on the machine that owns its GPUs: one slot.

A slot is a set of GPUs and a port on one machine. Its :class:`SlotWorker` moves the
slot's server from one configuration to the next — stop → release → start → load →
ready → bench → done — and reports every state change as a typed event
(``sweep.events``) through a :class:`~servesweep.sweep.slots.channel.TrialChannel`. It
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

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from servesweep.bench.load import LoadOptions, run_workload_sync
from servesweep.bench.target import Target
from servesweep.bench.workers import WorkerPool
from servesweep.decide.screening import screen_reason
from servesweep.errors import BenchError, DatasetError, Interrupted, TrialFailed
from servesweep.models import Evidence, FailureClass, InstanceRecord, LevelResult, Outcome, Phase
from servesweep.servers.engines import get_preset
from servesweep.servers.gpu import open_probe
from servesweep.servers.launchers import make_launcher
from servesweep.spec.schema import WorkloadSpec
from servesweep.sweep.events import (
    InstanceGone,
    InstanceStarted,
    LevelMeasured,
    PhaseEntered,
    PhaseSeconds,
    Progress,
    Screened,
    SweepWarning,
    TelemetrySampled,
    TrialFinished,
    TrialStarted,
    UnitRestored,
    WorkloadDone,
    headline,
)
from servesweep.sweep.slots.channel import TrialChannel
from servesweep.sweep.slots.data import (
    CurrentInstance,
    LoadRunner,
    Placement,
    SweepContext,
    TrialOrder,
)
from servesweep.sweep.slots.generators import GeneratorPools
from servesweep.sweep.slots.instance import (
    config_mismatches,
    instance_pids,
    placed,
    released_events,
    server_lifecycle,
    stopped_events,
)
from servesweep.sweep.slots.launch import Launch, launch_for, slot_server
from servesweep.sweep.slots.measure import (
    DYING_GRACE_S,
    LevelGate,
    check_errors,
    launch_workloads,
    screening_workloads,
    slot_target,
)
from servesweep.sweep.slots.telemetry import SlotTelemetry

__all__ = ["SlotWorker"]


class _Pruned(Exception):
    def __init__(self, reason: str, why: str = "pruned") -> None:
        super().__init__(reason)
        self.reason = reason
        self.why = why  # the evidence's reason: pruned (the search's early stop) or screened


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
        self.preset = get_preset(self.server.engine)
        self.launcher = make_launcher(self.server)
        self.probe = open_probe(
            self.server.gpu_backend, context.fake_gpu_dir, gpus=self.server.gpus
        )
        self.lifecycle = server_lifecycle(
            context, self.server, self.probe, placement.slot, self.launcher
        )
        self.lifecycle.baseline = dict(baseline or {})
        self.current = current
        self._cancel = threading.Event()
        self._own_generators = generators is None
        self.generators = generators or GeneratorPools()
        self._phase: tuple[Phase, float] | None = None
        self._phase_seconds: dict[str, float] = {}
        """Durations of the running trial's finished phases (for pruning on load_s)."""
        self._telemetry = SlotTelemetry(self.lifecycle, placement.node)
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
        previous = None
        if self._phase is not None:
            previous = self._phase_seconds[self._phase[0].value] = now - self._phase[1]
        self._phase = (phase, now)
        self.emit(PhaseEntered(trial=trial, phase=phase, at=now, previous_seconds=previous))

    def trial_key(self, trial: int) -> str:
        return f"{self.context.spec.name}-{trial}"

    def start_instance(self, order: TrialOrder, launch: Launch, log_path: Path) -> InstanceRecord:
        """Start ``launch`` as the slot's current instance, told to the driver."""
        key = self.trial_key(order.trial)
        started = self.lifecycle.start(launch.argv, launch.env, log_path, key, launch.fingerprint)
        instance = placed(started, self.placement)
        self.current = CurrentInstance(order.trial, instance)
        command = self.lifecycle.launch_command(launch.argv, launch.env)
        self.emit(InstanceStarted(trial=order.trial, instance=instance, launch_command=command))
        return instance

    def launch_of(self, order: TrialOrder) -> Launch:
        """The launch of a trial's configuration here."""
        return launch_for(
            self.context,
            self.placement,
            order.params,
            trial=self.trial_key(order.trial),
            log=order.log_path,
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
        options = LoadOptions(
            probe=self.probe,
            gpus=list(self.server.gpus),
            on_progress=progress,
            workers=workload.workers,
            base_dir=self.context.base_dir,
            after_level=after_level,
            pool=self._generators(workload, target.timeout_s),
        )
        return run_workload_sync(target, workload, options)

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
        current = self.current
        try:
            if current is not None:
                old_pids = instance_pids(self.lifecycle, current.instance)
                stop = self.lifecycle.stop(current.instance)
                self.current = None
                for event in stopped_events(current, stop, trial, self.node):
                    self.emit(event)
            if trial is not None:
                self._enter(trial, Phase.RELEASE)
            result = self.lifecycle.release(
                list(self.server.gpus), old_pids, cancelled=self._cancel.is_set
            )
        finally:
            self._telemetry.fast(False)
            for event in self._telemetry.released(current.trial if current else None, trial):
                self.emit(event)
        for event in released_events(result, tuple(self.server.gpus), trial, self.node):
            self.emit(event)

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
        # the samples taken since the last trial finished (an idle slot, a teardown)
        # belong to no trial: discarded, so the timeline starts with this trial
        self._telemetry.drain(order.trial)
        self._phase, self._phase_seconds = None, {}
        outcome, failure_class, evidence = Outcome.OK, None, None
        try:
            launches = order.relaunch or range(1, self.context.spec.max_launches)
            if not order.relaunch:
                model = self._bring_up(order, log_path)
                self._enter(order.trial, Phase.BENCH)
                if order.screen is not None:
                    self._screen(order, model)
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
            evidence = Evidence(message=pruned.reason, reason=pruned.why)
        finally:
            points = self._telemetry.drain(order.trial)
            if points:
                self.emit(TelemetrySampled(trial=order.trial, points=points))
        self._check_cancel()
        at = time.time()
        self.emit(
            TrialFinished(
                trial=order.trial,
                outcome=outcome,
                failure_class=failure_class,
                evidence=evidence,
                at=at,
                relaunch=bool(order.relaunch),
                last_phase_seconds=None if self._phase is None else at - self._phase[1],
            )
        )

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
        instance = self.start_instance(order, launch, log_path)
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
        for mismatch in config_mismatches(order.trial, self.server, self.preset, instance,
                                          order.params, self.context.api_key):  # fmt: skip
            self.emit(mismatch)
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

    def _target(self, model: str) -> Target:
        """What the load generator sends to: the run's API key, read once where the
        run started (the gate sends the same one)."""
        return slot_target(self.server, self.preset, model, self.context.api_key)

    def _screen(self, order: TrialOrder, model: str) -> None:
        """The screening pass of the launch: its short levels, then the decision
        (stored as a ``Screened`` fact); ``_Pruned`` (``screened``) when it cannot win."""
        assert order.screen is not None
        results = self._bench(order, model, screening=True)
        reason = screen_reason(order.screen, results, self._phase_seconds)
        self.emit(Screened(trial=order.trial, kept=reason is None, reason=reason or "",
                           attempt=order.attempt))  # fmt: skip
        if reason is not None:
            raise _Pruned(reason, "screened")

    def _bench(
        self, order: TrialOrder, model: str, launch: int = 0, *, screening: bool = False
    ) -> list[LevelResult]:
        """The workloads measured in launch ``launch`` of the configuration (all in the
        first; in a later one those whose ``launches`` reach it), or with ``screening``
        the screening pass's short levels (stored as such, never pruned by the search).
        Returns the level results."""
        assert self.current is not None
        target = self._target(model)
        instance = self.current.instance
        spec = self.context.spec
        if screening:
            workloads = screening_workloads(spec)
        else:
            warmed = order.screen is not None and launch == 0
            workloads = launch_workloads(spec, launch, relaunch=bool(order.relaunch), warmed=warmed)
        prune = None if screening else order.prune
        after_level = LevelGate(workloads, prune, self._cancel.is_set, self._phase_seconds)
        measured: list[LevelResult] = []

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
            results = [
                replace(r, launch=launch, screening=screening) if launch or screening else r
                for r in results
            ]
            measured += results
            for result in results:
                self.emit(LevelMeasured(trial=order.trial, result=result))
                for warning in result.warnings:
                    self.warn(f"trial {order.trial} {workload.name}: {warning}", order.trial)
            self.emit(
                WorkloadDone(
                    trial=order.trial,
                    workload=f"{workload.name} (screening)" if screening else workload.name,
                    levels={r.level: headline(r) for r in results},
                )
            )
            self.lifecycle.check_alive(instance)
            if after_level.pruned:
                raise _Pruned(after_level.pruned)
            try:
                check_errors(workload, results)
            except TrialFailed:
                # requests failing because the server is dying (a SIGKILLed engine with
                # large GPU allocations takes a moment to exit) is bench_crash, not
                # bench_errors: give its exit a moment to become visible
                deadline = time.monotonic() + DYING_GRACE_S
                while time.monotonic() < deadline:
                    self.lifecycle.check_alive(instance)
                    time.sleep(0.05)
                raise
        return measured
