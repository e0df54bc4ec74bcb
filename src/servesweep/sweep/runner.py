"""The trial state machine: stop -> release -> start -> load -> ready -> bench -> done.

One :class:`TrialRunner` drives one server slot (a set of GPUs and a port). It owns
the instance currently running in that slot and moves it from one server config
to the next. Every phase change is committed to the store before the phase's work
starts, so a servesweep killed at any moment leaves a trial whose phase says what
was going on and whose instance says what may still be running.

A failed trial is data: the lifecycle raises ``TrialFailed``; the runner stores the
failure class and the evidence and returns.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesweep.bench.capacity import error_checked
from servesweep.bench.load import run_workload_sync
from servesweep.bench.target import Target
from servesweep.errors import BenchError, DatasetError, TrialFailed
from servesweep.models import Evidence, FailureClass, InstanceRecord, LevelResult, Outcome, Phase
from servesweep.servers.engines import EnginePreset, build_launch
from servesweep.servers.gpu.base import GpuProbe
from servesweep.servers.lifecycle import ServerLifecycle
from servesweep.spec.schema import ServerSpec, WorkloadSpec
from servesweep.store import Store, TelemetryPoint, TrialRecord
from servesweep.sweep.events import Observer

__all__ = ["CurrentInstance", "TrialRunner", "instance_pids"]

DYING_GRACE_S = 2.0
"""How long a server whose requests failed may take to show that it exited."""


def instance_pids(lifecycle: ServerLifecycle, instance: InstanceRecord) -> set[int]:
    """Every PID of an instance before it is stopped: what its launcher finds now plus
    the recorded ones, which the release gate must also see gone from the GPUs."""
    return set(lifecycle.launcher.pids(instance)) | set(instance.pids)


@dataclass(frozen=True)
class CurrentInstance:
    """The instance running in the slot, and the trial that started it."""

    trial_id: int
    instance: InstanceRecord
    model: str | None = None
    """The served model name once a readiness check has proven it generates."""


class _TelemetrySampler:
    """Samples GPU memory in the background for the report's memory timeline."""

    def __init__(self, probe: GpuProbe, gpus: Sequence[int], interval: float = 0.5) -> None:
        self._probe = probe
        self._gpus = list(gpus)
        self._interval = interval
        self._points: list[tuple[float, int, int, float | None, float | None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        if self._probe.name == "none":
            return
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                states = self._probe.snapshot(self._gpus or None)
            except Exception:
                states = []
            now = time.time()
            with self._lock:
                for s in states:
                    self._points.append((now, s.index, s.used_bytes, s.utilization_pct, s.power_w))
            self._stop.wait(self._interval)

    def drain(self, trial_id: int) -> list[TelemetryPoint]:
        with self._lock:
            points, self._points = self._points, []
        return [TelemetryPoint(trial_id, t, g, u, ut, p) for t, g, u, ut, p in points]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


class TrialRunner:
    def __init__(
        self,
        *,
        store: Store,
        sweep_id: int,
        sweep_name: str,
        server: ServerSpec,
        preset: EnginePreset,
        lifecycle: ServerLifecycle,
        probe: GpuProbe,
        workloads: Sequence[WorkloadSpec],
        log_root: Path,
        observer: Observer,
        api_key: str | None = None,
        instance_env: Mapping[str, str] | None = None,
        base_dir: Path | None = None,
    ) -> None:
        self.store = store
        self.sweep_id = sweep_id
        self.sweep_name = sweep_name
        self.server = server
        self.preset = preset
        self.lifecycle = lifecycle
        self.probe = probe
        self.workloads = list(workloads)
        self.log_root = log_root
        self.observer = observer
        self._api_key = api_key
        self._instance_env = dict(instance_env or {})
        self.base_dir = base_dir
        """Folder of the sweep file: relative dataset and suite paths start there."""
        self.current: CurrentInstance | None = None
        self._telemetry = _TelemetrySampler(probe, server.gpus)

    # -- helpers --------------------------------------------------------------------

    def _emit(self, kind: str, **data: Any) -> None:
        self.observer.event(kind, data)

    def _enter(self, trial: TrialRecord, phase: Phase) -> None:
        self.store.enter_phase(trial.id, phase, time.time())
        self._emit("phase", trial=trial.id, phase=phase.value)

    def _log_path(self, trial: TrialRecord, attempt: int) -> Path:
        return self.log_root / f"trial-{trial.id}-attempt-{attempt}" / "server.log"

    def _target(self, model: str) -> Target:
        return Target(
            base_url=f"http://{self.server.host}:{self.server.port}",
            model=model,
            api_key=self._api_key,
            request_extras=dict(self.preset.request_extras),
            supports_ignore_eos=self.preset.supports_ignore_eos,
            metrics_path=self.preset.metrics_path,
            tokenize_path=self.preset.tokenize_path,
            spec_decode_counters=dict(self.preset.spec_decode_counters),
            timeout_s=self.server.timeouts.request,
        )

    def open(self) -> None:
        """Start background GPU telemetry (memory over time, for the report)."""
        self._telemetry.start()

    def close(self) -> None:
        self._telemetry.stop()

    # -- the slot's instance --------------------------------------------------------

    def stop_current(self, trial: TrialRecord | None = None) -> None:
        """Stop the slot's instance and wait for its GPU memory.

        With ``trial`` the two phases are recorded on it; raises TrialFailed
        (``stop_failed`` / ``gpu_busy``) like any phase.
        """
        old_pids: set[int] = set()
        if trial is not None:
            self._enter(trial, Phase.STOP)
        if self.current is not None:
            current = self.current
            old_pids = instance_pids(self.lifecycle, current.instance)
            stop = self.lifecycle.stop(current.instance)
            self.store.mark_instance_gone(current.trial_id)
            self.record(
                "stopped",
                trial,
                instance_of=current.trial_id,
                seconds=round(stop.seconds, 3),
                signalled=list(stop.signalled),
                killed=list(stop.killed),
            )
            self.current = None
        if trial is not None:
            self._enter(trial, Phase.RELEASE)
        result = self.lifecycle.release(list(self.server.gpus), old_pids)
        cleaned = [p.describe() for p in result.cleaned]
        self.record(
            "released", trial, seconds=round(result.seconds, 3), polls=result.polls, cleaned=cleaned
        )
        if cleaned:
            self._emit(
                "warning",
                message=f"cleaned orphaned processes of our instance: {', '.join(cleaned)}",
            )

    def record(self, kind: str, trial: TrialRecord | None, **data: Any) -> None:
        """Keep a lifecycle fact as evidence in the store (events table) and emit it."""
        self.store.add_event(self.sweep_id, kind, data, trial.id if trial else None)
        self._emit(kind, trial=trial.id if trial else None, **data)

    def adopt(self, trial_id: int, instance: InstanceRecord) -> None:
        """Take over an instance that an earlier run (or ``apply``) left running."""
        self.current = CurrentInstance(trial_id=trial_id, instance=instance)

    # -- one trial ------------------------------------------------------------------

    def run_trial(
        self, trial: TrialRecord, on_progress: Callable[[str, float, str], None]
    ) -> TrialRecord:
        """Run one trial to a final outcome (or raise Interrupted/KeyboardInterrupt)."""
        attempt = trial.attempts + 1
        log_path = self._log_path(trial, attempt)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.store.begin_attempt(trial.id, time.time(), str(log_path))
        self._emit("trial_started", trial=trial.id, seq=trial.seq, params=dict(trial.params))
        self._telemetry.drain(trial.id)
        try:
            model = self._bring_up(trial, log_path, on_progress)
            self._enter(trial, Phase.BENCH)
            self._bench(trial, model)
        except TrialFailed as failure:
            self.store.finish_trial(
                trial.id,
                Outcome.FAILED,
                time.time(),
                failure_class=failure.failure_class,
                evidence=failure.evidence,
            )
        else:
            self.store.finish_trial(trial.id, Outcome.OK, time.time())
        finally:
            points = self._telemetry.drain(trial.id)
            if points:
                self.store.add_telemetry(points)
        done = self.store.trial(trial.id)
        self._emit(
            "trial_finished",
            trial=done.id,
            outcome=done.outcome.value,
            failure_class=done.failure_class.value if done.failure_class else None,
            message=done.evidence.summary() if done.evidence else None,
            phase_seconds=dict(done.phase_seconds),
        )
        return done

    def _bring_up(
        self, trial: TrialRecord, log_path: Path, on_progress: Callable[[str, float, str], None]
    ) -> str:
        """Stop, release, start, load, ready; or adopt a running instance of this config."""
        current = self.current
        if (
            current is not None
            and current.instance.fingerprint == trial.fingerprint
            and self.lifecycle.launcher.poll(current.instance) is None
        ):
            self._emit("warning", message=f"trial {trial.id}: adopting the running instance")
            self.store.set_instance(trial.id, current.instance, launch_command=None, adopted=True)
            if current.trial_id != trial.id:
                self.store.mark_instance_gone(current.trial_id)
            self.current = CurrentInstance(trial.id, current.instance, current.model)
            self._enter(trial, Phase.READY)
            info = self.lifecycle.wait_ready(current.instance, on_progress)
            return info.model

        self.stop_current(trial)
        key = f"{self.sweep_name}-{trial.id}"
        argv, env = build_launch(self.server, trial.params, trial=key, log=str(log_path))
        env = {**self._instance_env, **env}
        self._enter(trial, Phase.START)
        instance = self.lifecycle.start(argv, env, log_path, key, trial.fingerprint)
        self.current = CurrentInstance(trial.id, instance)
        launch = self.lifecycle.launch_command(argv, env)
        self.store.set_instance(trial.id, instance, launch_command=launch)
        self._enter(trial, Phase.LOAD)
        load_started = time.time()
        in_ready = False

        def progress(phase: str, elapsed: float, line: str) -> None:
            nonlocal in_ready
            if phase == Phase.READY.value and not in_ready:
                in_ready = True
                self._enter(trial, Phase.READY)
            on_progress(phase, elapsed, line)

        info = self.lifecycle.wait_ready(instance, progress)
        if not in_ready:
            # became ready between two polls: the whole wait was loading
            self._enter(trial, Phase.READY)
            self.store.set_phase_seconds(trial.id, Phase.LOAD, time.time() - load_started)
        self.current = CurrentInstance(trial.id, instance, info.model)
        return info.model

    def _bench(self, trial: TrialRecord, model: str) -> None:
        assert self.current is not None
        target = self._target(model)
        instance = self.current.instance
        for workload in self.workloads:
            self._emit("progress", trial=trial.id, phase="bench", workload=workload.name)

            def progress(message: str, name: str = workload.name) -> None:
                self._emit(
                    "progress", trial=trial.id, phase="bench", workload=name, message=message
                )

            try:
                results = run_workload_sync(
                    target,
                    workload,
                    probe=self.probe,
                    gpus=list(self.server.gpus),
                    on_progress=progress,
                    workers=workload.workers,
                    base_dir=str(self.base_dir) if self.base_dir else None,
                )
            except DatasetError:
                raise
            except BenchError as exc:
                self.lifecycle.check_alive(instance)
                raise TrialFailed(
                    FailureClass.BENCH_ERRORS,
                    Evidence(message=f"{workload.name}: {exc}", reason="bench_error"),
                ) from exc
            self.lifecycle.check_alive(instance)
            for result in results:
                self.store.add_result(trial.id, result)
                for warning in result.warnings:
                    self._emit("warning", message=f"trial {trial.id} {workload.name}: {warning}")
            self._emit(
                "workload_done",
                trial=trial.id,
                workload=workload.name,
                levels={r.level: _headline(r) for r in results},
            )
            try:
                self._check_errors(workload, results)
            except TrialFailed:
                # requests failing because the server is dying (a SIGKILLed engine with
                # large GPU allocations takes a moment to exit) is bench_crash, not
                # bench_errors: give its exit a moment to become visible
                deadline = time.monotonic() + DYING_GRACE_S
                while time.monotonic() < deadline:
                    self.lifecycle.check_alive(instance)
                    time.sleep(0.05)
                raise

    @staticmethod
    def _check_errors(workload: WorkloadSpec, results: Sequence[LevelResult]) -> None:
        if workload.is_eval:
            return
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


def _headline(result: LevelResult) -> Mapping[str, float]:
    keys = ("output_throughput", "ttft_p99_ms", "tpot_mean_ms", "pass_rate", "error_rate")
    return {
        k: result.metrics[k]
        for k in keys
        if k in result.metrics and not math.isnan(result.metrics[k])
    }
