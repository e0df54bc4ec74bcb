"""Run a sweep file: plan, resume, run every pending trial, clean up.

``run_sweep`` is the library entry point behind ``servesweep run``. It is
idempotent: run it again on the same file and it continues where the last run
stopped — finished trials are skipped, a trial left ``running`` by a crash is run
again after its recorded instance has been stopped (or adopted when it already
runs the next trial's configuration), so two servers never share the GPUs.
"""

from __future__ import annotations

import fcntl
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesweep import __version__
from servesweep.errors import ConfigError, Interrupted, StoreError, TrialFailed
from servesweep.models import InstanceRecord, Outcome
from servesweep.servers.engines import EnginePreset, engine_version, get_preset
from servesweep.servers.gpu import FAKE_GPUS_ENV, open_probe
from servesweep.servers.gpu.base import GpuProbe
from servesweep.servers.launchers import make_launcher
from servesweep.servers.launchers.base import Launcher
from servesweep.servers.lifecycle import ServerLifecycle
from servesweep.spec.expand import expand_configs
from servesweep.spec.load import LoadedSweep, load_sweep
from servesweep.spec.schema import ServerSpec, SweepSpec
from servesweep.store import Store, SweepRecord, TrialRecord, open_store
from servesweep.sweep.events import NullObserver, Observer
from servesweep.sweep.runner import TrialRunner, instance_pids

__all__ = [
    "RunOptions",
    "Slot",
    "SweepSummary",
    "fake_gpu_dir",
    "open_slot",
    "open_sweep",
    "prepare_slot",
    "run_sweep",
    "store_path_for",
    "sweep_lock",
]


@dataclass(frozen=True)
class RunOptions:
    store: Path | None = None
    """Results database; default: the sweep file's ``store`` or ``servesweep.db`` beside it."""
    fresh: bool = False
    """Start a new sweep instead of continuing the latest one of this name."""
    retry_failed: bool = False
    fail_fast: bool = False
    keep_running: bool = False
    """Leave the last instance running at the end (default: stop it)."""
    only: tuple[int, ...] = ()
    """Run only these trial ids (others stay as they are)."""


@dataclass(frozen=True)
class SweepSummary:
    sweep: SweepRecord
    store_path: Path
    trials: tuple[TrialRecord, ...]
    ran: tuple[int, ...] = ()
    """Ids of the trials this invocation ran."""
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def count(self, outcome: Outcome) -> int:
        return sum(1 for t in self.trials if t.outcome is outcome)

    @property
    def exit_code(self) -> int:
        return 1 if any(t.outcome is Outcome.FAILED for t in self.trials) else 0


def store_path_for(loaded: LoadedSweep, override: Path | None = None) -> Path:
    """The results database: ``override`` (``--store``), else the sweep file's
    ``store``, else ``servesweep.db`` beside the sweep file."""
    if override is not None:
        return override
    return loaded.resolve(loaded.spec.store or "servesweep.db")


def open_sweep(loaded: LoadedSweep, store: Store, *, fresh: bool = False) -> SweepRecord:
    """Find the sweep of this file in the store (or create it) and sync its trials."""
    spec_path = str(loaded.path) if loaded.path else "<string>"
    sweep = None if fresh else store.latest_sweep(loaded.spec.name)
    if sweep is None:
        sweep = store.create_sweep(
            loaded.spec.name, spec_path, loaded.text, loaded.spec_hash, __version__
        )
    elif sweep.spec_hash != loaded.spec_hash or sweep.spec_path != spec_path:
        store.update_sweep_spec(sweep.id, spec_path, loaded.text, loaded.spec_hash)
    store.sync_trials(sweep.id, expand_configs(loaded.spec))
    return store.sweep(sweep.id)


def fake_gpu_dir(loaded: LoadedSweep) -> str | None:
    """The fake GPU directory (absolute), created from ``server.fake_gpus`` if missing:
    the sweep file's ``fake_gpu_dir`` (relative to the sweep file), else
    ``SERVESWEEP_FAKE_GPUS`` (relative to the current directory)."""
    server = loaded.spec.server
    if server.fake_gpu_dir:
        path = loaded.resolve(server.fake_gpu_dir)
    elif os.environ.get(FAKE_GPUS_ENV):
        path = Path(os.environ[FAKE_GPUS_ENV]).expanduser().absolute()
    else:
        return None
    if server.fake_gpus is not None and not path.exists():
        from servesweep.fakegpu import FakeGpuDir, FakeGpuError

        try:
            FakeGpuDir.create(
                path, server.fake_gpus.count, server.fake_gpus.memory, name=server.fake_gpus.name
            )
        except (OSError, FakeGpuError) as exc:
            raise loaded.error(
                f"cannot create fake GPUs in {path}: {exc}", "server.fake_gpus"
            ) from exc
    return str(path.resolve())


@dataclass(frozen=True)
class Slot:
    """What runs one server of a sweep: its engine preset, launcher, GPU probe and
    lifecycle gates, where its logs go, and the environment every instance gets."""

    preset: EnginePreset
    launcher: Launcher
    probe: GpuProbe
    lifecycle: ServerLifecycle
    log_root: Path
    instance_env: dict[str, str]


def open_slot(loaded: LoadedSweep, store_path: Path, sweep_id: int) -> Slot:
    spec = loaded.spec
    preset = get_preset(spec.server.engine)
    launcher = make_launcher(spec.server)
    fake_dir = fake_gpu_dir(loaded)
    probe = open_probe(spec.server.gpu_backend, fake_dir, gpus=spec.server.gpus)
    lifecycle = ServerLifecycle(
        spec.server, preset, launcher, probe, own_tag_prefix=f"{spec.name}-"
    )
    log_root = (
        loaded.resolve(spec.server.log_dir)
        if spec.server.log_dir
        else store_path.parent / "runs" / f"{spec.name}-{sweep_id}"
    )
    instance_env = {FAKE_GPUS_ENV: fake_dir} if fake_dir else {}
    return Slot(preset, launcher, probe, lifecycle, log_root, instance_env)


def stored_baseline(sweep: SweepRecord) -> dict[int, int] | None:
    stored = sweep.environment.get("baseline_bytes")
    if not isinstance(stored, dict) or not stored:
        return None
    return {int(k): int(v) for k, v in stored.items()}


def baseline_without(probe: GpuProbe, gpus: Sequence[int], pids: set[int]) -> dict[int, int]:
    """Used memory per GPU minus what the processes ``pids`` hold."""
    baseline = {}
    for state in probe.snapshot(list(gpus)):
        held = sum(h.used_bytes for h in state.holders if h.pid in pids)
        baseline[state.index] = max(0, state.used_bytes - held)
    return baseline


def _environment(probe: GpuProbe, server: ServerSpec) -> dict[str, Any]:
    env: dict[str, Any] = {
        "servesweep": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "engine": server.engine,
        "engine_version": engine_version(server),
        "launcher": server.launcher,
        "gpu_backend": probe.name,
    }
    try:
        env.update({f"gpu.{k}": v for k, v in probe.describe().items()})
    except Exception as exc:
        env["gpu.error"] = str(exc)
    return env


def _api_key(spec: SweepSpec) -> str | None:
    name = spec.server.api_key_env
    if not name:
        return None
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(
            f"environment variable {name} is not set (it holds the API key)",
            key="server.api_key_env",
        )
    return value


ProgressFn = Callable[[int, str, float, str], None]


def run_sweep(
    path: str | Path,
    options: RunOptions | None = None,
    observer: Observer | None = None,
    *,
    on_progress: ProgressFn | None = None,
) -> SweepSummary:
    """Run (or continue) the sweep in ``path``; returns when every trial is final.

    Raises ConfigError for a bad sweep file and Interrupted (after stopping the
    current instance and marking its trial ``interrupted``) on KeyboardInterrupt.
    """
    options = options or RunOptions()
    observer = observer or NullObserver()
    loaded = load_sweep(path)
    spec = loaded.spec
    api_key = _api_key(spec)
    store_path = store_path_for(loaded, options.store)
    with sweep_lock(store_path):
        store = open_store(store_path)
        try:
            return _run(loaded, store, store_path, options, observer, on_progress, api_key)
        finally:
            store.close()


@contextmanager
def sweep_lock(store_path: Path) -> Iterator[None]:
    """One writer per results database: a second ``run``/``apply`` on the same store
    would fight over the same servers. The lock (``flock`` on ``DB.lock``) dies with
    its process, so a killed servesweep never leaves it behind."""
    lock_path = store_path.with_name(store_path.name + ".lock")
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a+", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise StoreError(f"cannot create lock file {lock_path}: {exc.strerror}") from exc
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise StoreError(
                f"{store_path} is in use by {holder}; wait for it to finish (or stop it), "
                "or use another --store"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"servesweep pid {os.getpid()} on {socket.gethostname()}")
        handle.flush()
        yield
    finally:
        handle.close()


def _run(
    loaded: LoadedSweep,
    store: Store,
    store_path: Path,
    options: RunOptions,
    observer: Observer,
    on_progress: ProgressFn | None,
    api_key: str | None,
) -> SweepSummary:
    spec = loaded.spec
    sweep = open_sweep(loaded, store, fresh=options.fresh)
    slot = open_slot(loaded, store_path, sweep.id)
    preset, launcher, probe, lifecycle = slot.preset, slot.launcher, slot.probe, slot.lifecycle
    warnings: list[str] = list(getattr(launcher, "warnings", []) or [])
    for warning in warnings:
        observer.event("warning", {"message": warning})

    runner = TrialRunner(
        store=store,
        sweep_id=sweep.id,
        sweep_name=spec.name,
        server=spec.server,
        preset=preset,
        lifecycle=lifecycle,
        probe=probe,
        workloads=spec.workloads,
        log_root=slot.log_root,
        observer=observer,
        api_key=api_key,
        instance_env=slot.instance_env,
        base_dir=loaded.base_dir,
    )

    trials = store.trials(sweep.id, in_plan_only=True)
    if options.retry_failed:
        for trial in trials:
            if trial.outcome in (Outcome.FAILED, Outcome.INTERRUPTED):
                store.reset_trial(trial.id)
        trials = store.trials(sweep.id, in_plan_only=True)
    todo = [t for t in trials if not t.outcome.final and (not options.only or t.id in options.only)]
    observer.event(
        "sweep_started",
        {
            "sweep": sweep.id,
            "name": spec.name,
            "store": str(store_path),
            "trials": len(trials),
            "todo": len(todo),
            "done": sum(1 for t in trials if t.outcome.final),
        },
    )

    prepare_slot(store, sweep, runner, todo, observer)
    ran: list[int] = []
    runner.open()
    try:
        for trial in todo:
            ran.append(trial.id)

            def progress(phase: str, elapsed: float, line: str, _id: int = trial.id) -> None:
                observer.event(
                    "progress", {"trial": _id, "phase": phase, "elapsed": elapsed, "line": line}
                )
                if on_progress is not None:
                    on_progress(_id, phase, elapsed, line)

            done = runner.run_trial(store.trial(trial.id), progress)
            if done.outcome is Outcome.FAILED and options.fail_fast:
                observer.event(
                    "warning", {"message": f"--fail-fast: stopping after trial {done.id}"}
                )
                break
        if not options.keep_running:
            _final_stop(runner, observer)
        store.finish_sweep(sweep.id)
    except (KeyboardInterrupt, Interrupted):
        _interrupt(store, runner, ran, observer)
        raise Interrupted("interrupted; the current instance was stopped") from None
    except Exception:
        # a bug or an unusable environment ends the sweep: leave no server behind and
        # no trial "running" (the next run continues where this one stopped)
        _interrupt(store, runner, ran, observer)
        raise
    finally:
        runner.close()
        probe.close()
    final = store.trials(sweep.id, in_plan_only=True)
    summary = SweepSummary(
        sweep=store.sweep(sweep.id),
        store_path=store_path,
        trials=tuple(final),
        ran=tuple(ran),
        warnings=tuple(warnings),
    )
    observer.event(
        "sweep_finished",
        {o.value: summary.count(o) for o in Outcome} | {"sweep": sweep.id},
    )
    return summary


def prepare_slot(
    store: Store,
    sweep: SweepRecord,
    runner: TrialRunner,
    todo: list[TrialRecord],
    observer: Observer,
) -> None:
    """Make the slot ready for its first trial: adopt or stop what earlier runs left
    (see ``_recover_instances``), take the GPU baseline the release gate waits for,
    and record it with the environment."""
    _recover_instances(store, runner, todo, observer)
    lifecycle, spec = runner.lifecycle, runner.server
    if runner.current is not None:
        # adopting a running instance: the GPUs are not idle, so the baseline is the
        # stored one, or what the GPUs use beside the adopted instance
        lifecycle.baseline = stored_baseline(sweep) or baseline_without(
            runner.probe, spec.gpus, lifecycle.launcher.pids(runner.current.instance)
        )
    else:
        lifecycle.prepare(list(spec.gpus))
        if lifecycle.cleaned:
            cleaned = [p.describe() for p in lifecycle.cleaned]
            runner.record("cleaned_before_sweep", None, cleaned=cleaned)
            observer.event(
                "warning",
                {"message": "cleaned orphaned servesweep processes: " + ", ".join(cleaned)},
            )
    store.set_environment(
        sweep.id,
        {
            **_environment(runner.probe, spec),
            "baseline_bytes": {str(k): v for k, v in lifecycle.baseline.items()},
        },
    )


def _recover_instances(
    store: Store, runner: TrialRunner, todo: list[TrialRecord], observer: Observer
) -> None:
    """Deal with instances an earlier run left behind: adopt one that already runs
    the next trial's config, stop every other one (never two servers on the GPUs)."""
    next_fp = todo[0].fingerprint if todo else None
    launcher = runner.lifecycle.launcher
    for trial in store.live_instances():
        instance = trial.instance
        if instance is None:
            continue
        if not launcher.alive(instance):
            store.mark_instance_gone(trial.id)
            continue
        same_slot = instance.port == runner.server.port or set(instance.gpus) & set(
            runner.server.gpus
        )
        if not same_slot:
            continue
        if runner.current is None and instance.fingerprint == next_fp and next_fp is not None:
            observer.event(
                "warning",
                {"message": f"found the instance of trial {trial.id} still running its config"},
            )
            runner.adopt(trial.id, instance)
            continue
        observer.event(
            "warning",
            {"message": f"stopping the instance of trial {trial.id} left by an earlier run"},
        )
        _stop_leftover(store, runner, trial.id, instance, observer)
    current = getattr(launcher, "current", None)
    if runner.current is None and callable(current):
        # a launcher that manages an existing service (systemd) may find it running
        # the user's own configuration: stop it before the first start
        running = current(runner.server.port)
        if isinstance(running, InstanceRecord):
            observer.event(
                "warning",
                {"message": f"stopping the running {running.unit or 'service'} before the sweep"},
            )
            runner.lifecycle.stop(running)
    for trial in store.trials(runner.sweep_id):
        if trial.outcome is Outcome.RUNNING:
            # the run that owned it died; its results are incomplete: run it again
            store.reset_trial(trial.id)


def _stop_leftover(
    store: Store,
    runner: TrialRunner,
    trial_id: int,
    instance: InstanceRecord,
    observer: Observer,
) -> None:
    """Stop an instance an earlier run left behind and wait for its GPU memory, so
    that the baseline measured next is of idle GPUs."""
    lifecycle = runner.lifecycle
    gpus = list(runner.server.gpus)
    pids = instance_pids(lifecycle, instance)
    idle = baseline_without(runner.probe, gpus, pids) if gpus else {}
    stop = lifecycle.stop(instance)
    store.mark_instance_gone(trial_id)
    runner.record(
        "stopped_leftover",
        None,
        instance_of=trial_id,
        signalled=list(stop.signalled),
        killed=list(stop.killed),
    )
    lifecycle.baseline = idle
    try:
        lifecycle.release(gpus, pids)
    except TrialFailed as failure:
        observer.event("warning", {"message": f"after stopping a leftover instance: {failure}"})


def _final_stop(runner: TrialRunner, observer: Observer) -> None:
    """Stop the last instance; a systemd unit gets its own ExecStart back."""
    try:
        if runner.current is not None:
            runner.stop_current()
    except TrialFailed as failure:
        observer.event("warning", {"message": f"final stop: {failure}"})
    restore = getattr(runner.lifecycle.launcher, "restore", None)
    if callable(restore):
        restore()


def _interrupt(store: Store, runner: TrialRunner, ran: list[int], observer: Observer) -> None:
    observer.event("warning", {"message": "stopping: stopping the current instance"})
    try:
        if runner.current is not None:
            runner.lifecycle.stop(runner.current.instance)
            store.mark_instance_gone(runner.current.trial_id)
            runner.current = None
    except TrialFailed as failure:
        observer.event("warning", {"message": f"stop after interrupt: {failure}"})
    for trial_id in ran:
        trial = store.trial(trial_id)
        if trial.outcome is Outcome.RUNNING:
            store.finish_trial(trial_id, Outcome.INTERRUPTED, time.time())
