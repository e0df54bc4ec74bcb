"""Run a sweep file: plan, resume, run every pending trial, clean up.

``run_sweep`` is the library entry point behind ``servesweep run``. It is
idempotent: run it again on the same file and it continues where the last run
stopped — finished trials are skipped, a trial left ``running`` by a crash is run
again after its recorded instance has been stopped (or adopted when it already
runs a pending trial's launch), so two servers never share the GPUs. The work is
done by a :class:`~servesweep.sweep.driver.Driver` and its slots: threads of this
process, or actors on the nodes of a Ray cluster (``--ray``, ``sweep.ray_exec``,
imported only then).
"""

from __future__ import annotations

import fcntl
import os
import platform
import queue
import secrets
import socket
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesweep import __version__
from servesweep.errors import ConfigError, StoreError
from servesweep.models import Outcome
from servesweep.servers.engines import engine_version
from servesweep.servers.gpu import FAKE_GPUS_ENV, open_probe
from servesweep.servers.ownership import lock_path_for
from servesweep.spec.expand import expand_configs
from servesweep.spec.load import LoadedSweep, load_sweep, load_sweep_text
from servesweep.spec.schema import ServerSpec, SweepSpec
from servesweep.spec.slots import gpu_need, slot_ports
from servesweep.store import Store, SweepRecord, TrialRecord, open_store
from servesweep.sweep.cluster import check_fit, check_ray_version, cluster_spec, trial_needs
from servesweep.sweep.driver import (
    Driver,
    Executor,
    RunSettings,
    TrialSource,
    max_slots,
)
from servesweep.sweep.events import Event, NullObserver, Observer, SweepFinished, SweepWarning
from servesweep.sweep.identity import changes
from servesweep.sweep.leases import run_leases
from servesweep.sweep.local import LocalExecutor
from servesweep.sweep.node import check_slot_ports
from servesweep.sweep.search_source import SearchSource
from servesweep.sweep.slot import SweepContext, this_node

if TYPE_CHECKING:
    from servesweep.sweep.ray_exec import RayConnection

__all__ = [
    "RunOptions",
    "SweepSummary",
    "fake_gpu_dir",
    "new_run_id",
    "open_sweep",
    "run_sweep",
    "store_path_for",
    "sweep_context",
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
    """Run only these trials, by their number in the sweep (``--trial N``, as the
    reports show it); the others stay as they are."""
    keep_results: bool = False
    """Keep results measured before the sweep file changed what a trial measures."""
    slots: int | None = None
    """At most this many trials at once per machine (default: the sweep file's
    ``parallel``, else as many as fit in the GPU pool)."""
    predict: bool = True
    """``--no-predict``: False (no memory prediction, every configuration launched)."""
    ray: str | None = None
    """``--ray``: run on a Ray cluster at this address (``""``: the sweep file's
    ``executor.address``, else ``RAY_ADDRESS``, else this machine's cluster); None:
    as the sweep file's ``executor`` says."""
    wait: bool = False
    """``--wait``: wait for the ports and GPUs another run holds (default: refuse)."""
    port: int | None = None
    """``--port``: slot 0's port instead of the sweep file's ``server.port``."""


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


def open_sweep(
    loaded: LoadedSweep, store: Store, *, fresh: bool = False, keep_results: bool = False
) -> SweepRecord:
    """Find the sweep of this file in the store (or create it) and sync its trials.

    When the sweep file changed what a trial measures (``sweep.identity``) and trials
    already have results, refuse (ConfigError naming what changed) unless
    ``keep_results`` says to keep them as they are."""
    spec_path = str(loaded.path) if loaded.path else "<string>"
    sweep = None if fresh else store.latest_sweep(loaded.spec.name)
    if sweep is None:
        sweep = store.create_sweep(
            loaded.spec.name, spec_path, loaded.text, loaded.spec_hash, __version__
        )
    elif sweep.spec_hash != loaded.spec_hash or sweep.spec_path != spec_path:
        if not keep_results:
            _refuse_changed(loaded, store, sweep)
        store.update_sweep_spec(sweep.id, spec_path, loaded.text, loaded.spec_hash)
    if not loaded.spec.search.samples:
        # a grid's plan is fixed; a sampling search adds its trials as it proposes them
        store.sync_trials(sweep.id, expand_configs(loaded.spec))
    return store.sweep(sweep.id)


def _refuse_changed(loaded: LoadedSweep, store: Store, sweep: SweepRecord) -> None:
    try:
        old = load_sweep_text(sweep.spec_text, sweep.spec_path).spec
    except ConfigError:
        return  # written by another servesweep version: nothing to compare
    changed = changes(old, loaded.spec)
    if not changed:
        return
    measured = [
        t for t in store.trials(sweep.id) if t.outcome.final and t.outcome is not Outcome.SKIPPED
    ]
    if not measured:
        return
    raise ConfigError(
        f"the sweep file changed what a trial measures since {len(measured)} trial(s) of "
        f"sweep {sweep.name!r} (#{sweep.id}) were measured: {'; '.join(changed)}; "
        "start over with --fresh, give the sweep a new name, or keep those results with "
        "--keep-results"
    )


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


def _environment(server: ServerSpec, fake_dir: str | None, *, gpus: bool = True) -> dict[str, Any]:
    """What the sweep ran on (no secrets): versions, the machine, its GPUs (``gpus``)."""
    env: dict[str, Any] = {
        "servesweep": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "engine": server.engine,
        "engine_version": engine_version(server),
        "launcher": server.launcher,
    }
    if not gpus:
        return env
    probe = open_probe(server.gpu_backend, fake_dir)
    try:
        env["gpu_backend"] = probe.name
        env.update({f"gpu.{k}": v for k, v in probe.describe().items()})
    except Exception as exc:
        env["gpu.error"] = str(exc)
    finally:
        probe.close()
    return env


def _on_cluster(context: SweepContext, cluster: RayConnection, observer: Observer) -> SweepContext:
    """The run's context on a cluster: the GPU pool is the nodes' (see
    ``cluster.cluster_spec``)."""
    spec = context.spec
    scheduled = cluster_spec(spec, cluster.nodes)
    if spec.server.gpus:
        # said whenever the list is set, even when it happens to match a node's GPUs
        observer.event(
            SweepWarning(
                message=f"server.gpus {spec.server.gpus} is not used on a Ray cluster: each "
                "node's GPUs are those Ray offers there"
            )
        )
    return replace(context, spec=scheduled)


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


def run_sweep(
    path: str | Path,
    options: RunOptions | None = None,
    observer: Observer | None = None,
) -> SweepSummary:
    """Run (or continue) the sweep in ``path``; returns when every trial is final.

    Raises ConfigError for a bad sweep file and Interrupted (after stopping the
    running instances and marking their trials ``interrupted``) on KeyboardInterrupt.
    """
    options = options or RunOptions()
    observer = observer or NullObserver()
    loaded = with_port(load_sweep(path), options.port)
    api_key = _api_key(loaded.spec)
    cluster = join_cluster(loaded, options.ray)
    try:
        return _run_joined(loaded, options, observer, api_key, cluster)
    finally:
        if cluster is not None:  # also when the run ends before its executor does
            from servesweep.sweep import ray_exec

            ray_exec.leave()


def _run_joined(
    loaded: LoadedSweep,
    options: RunOptions,
    observer: Observer,
    api_key: str | None,
    cluster: RayConnection | None,
) -> SweepSummary:
    if cluster is not None and not loaded.spec.search.samples:
        # every configuration of the plan fits on some node (a sampling search's are
        # checked as it proposes them)
        configs = [c.params for c in expand_configs(loaded.spec)]
        needs = trial_needs(loaded.spec, configs, cluster.nodes)
        check_fit(needs, cluster.nodes, cluster.address)
    # a bad gpus_per_trial is a usage error before anything starts
    gpu_need(cluster_spec(loaded.spec, cluster.nodes) if cluster else loaded.spec)
    if cluster is None:  # (a cluster's nodes are checked when they are prepared)
        # GPUs named that no backend can see: an error before anything is created
        open_probe(
            loaded.spec.server.gpu_backend, fake_gpu_dir(loaded), gpus=loaded.spec.server.gpus
        ).close()
    store_path = store_path_for(loaded, options.store)
    spec = cluster_spec(loaded.spec, cluster.nodes) if cluster else loaded.spec
    with (
        sweep_lock(store_path),
        run_leases(
            spec,
            store_path,
            slots=max_slots(spec, options.slots),
            fake_gpu_dir=None if cluster else fake_gpu_dir(loaded),
            wait=options.wait,
            notify=lambda line: observer.event(SweepWarning(message=line)),
            cluster=cluster,
        ),
    ):
        store = open_store(store_path)
        try:
            return _run(loaded, store, store_path, options, observer, api_key, cluster)
        finally:
            store.close()


def with_port(loaded: LoadedSweep, port: int | None) -> LoadedSweep:
    """The sweep with ``--port``: slot 0 listens on ``port``, slot k on ``port + k``
    (what is measured does not change: ports are not part of a trial's identity)."""
    if port is None:
        return loaded
    if not 1 <= port <= 65535:
        raise ConfigError(f"{port} is not a port (1-65535)", key="--port")
    server = loaded.spec.server
    if server.ports:
        raise loaded.error(
            "--port does not apply to a sweep file that lists server.ports: edit them",
            "server.ports",
        )
    spec = loaded.spec.model_copy(update={"server": server.model_copy(update={"port": port})})
    return replace(loaded, spec=spec)


def join_cluster(loaded: LoadedSweep, ray_option: str | None) -> RayConnection | None:
    """The Ray cluster to run on (``--ray`` or ``executor: {kind: ray}``), joined and
    described; None to run here. Ray is imported only then; ConfigError when it is
    missing, too old or unreachable."""
    executor = loaded.spec.executor
    if ray_option is None and executor.kind != "ray":
        return None
    try:
        import ray
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "ray":
            raise
        message = "Ray is not installed: pip install 'servesweep[ray]'"
        if ray_option is None:
            raise loaded.error(message, "executor.kind") from None
        raise ConfigError(message, key="--ray") from None
    check_ray_version(str(getattr(ray, "__version__", "?")))  # before Ray's newer names
    from servesweep.sweep import ray_exec

    return ray_exec.connect(ray_option or executor.address)


@contextmanager
def sweep_lock(store_path: Path) -> Iterator[None]:
    """One writer per results database: a second ``run``/``apply`` on the same store
    would fight over the same servers. The lock (``flock`` on ``DB.lock``) dies with
    its process, so a killed servesweep never leaves it behind; while it is held,
    every instance tagged with another run of this database is a leftover of a dead
    run (see ``servers.ownership``)."""
    lock_path = Path(lock_path_for(str(store_path)))
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


def _only_ids(only: Sequence[int], trials: Sequence[TrialRecord], name: str) -> set[int]:
    """The ids of the trials ``--trial N`` names by their number in the sweep's plan;
    a number that is not there is a usage error (not an empty run that exits 0)."""
    by_number = {t.number: t.id for t in trials}
    unknown = [n for n in only if n not in by_number]
    if unknown:
        listed = ", ".join(str(t.number) for t in trials) or "none"
        raise ConfigError(
            f"no trial {unknown[0]} in sweep {name!r} (its trials: {listed}; "
            "see servesweep status)",
            key="--trial",
        )
    return {by_number[n] for n in only}


def new_run_id() -> str:
    """A run's id: unique, and readable in a process's environment."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def sweep_context(
    loaded: LoadedSweep,
    store: Store,
    store_path: Path,
    sweep: SweepRecord,
    run: str,
    api_key: str | None,
) -> SweepContext:
    spec = loaded.spec
    log_root = (
        loaded.resolve(spec.server.log_dir)
        if spec.server.log_dir
        else store_path.parent / "runs" / f"{spec.name}-{sweep.id}"
    )
    return SweepContext(
        spec=spec,
        sweep_id=sweep.id,
        store_id=store.store_id,
        store_path=str(store_path.resolve()),
        run=run,
        log_root=str(log_root),
        base_dir=str(loaded.base_dir),
        fake_gpu_dir=fake_gpu_dir(loaded),
        api_key=api_key,
    )


def _run(
    loaded: LoadedSweep,
    store: Store,
    store_path: Path,
    options: RunOptions,
    observer: Observer,
    api_key: str | None,
    cluster: RayConnection | None = None,
) -> SweepSummary:
    spec = loaded.spec
    sweep = open_sweep(loaded, store, fresh=options.fresh, keep_results=options.keep_results)
    run = new_run_id()
    context = sweep_context(loaded, store, store_path, sweep, run, api_key)
    if cluster is not None:
        context = _on_cluster(context, cluster, observer)
    context = replace(context, slots=max_slots(context.spec, options.slots))
    store.add_event(sweep.id, "run_started", {"run": run, "pid": os.getpid(), "node": this_node()})
    if cluster is None:
        environment = {**sweep.environment, **_environment(spec.server, context.fake_gpu_dir)}
    else:
        environment = {**sweep.environment, **_environment(spec.server, None, gpus=False)}
        environment["ray"] = {**cluster.describe(), "bench_from": spec.executor.bench_from}
    store.set_environment(sweep.id, environment)

    trials = store.trials(sweep.id, in_plan_only=True)
    if options.retry_failed:
        for trial in trials:
            if trial.outcome in (Outcome.FAILED, Outcome.INTERRUPTED):
                store.reset_trial(trial.id)
    if not options.predict:  # --no-predict: what the prediction skipped runs now
        for trial in trials:
            if trial.evidence is not None and trial.evidence.reason == "predicted_oom":
                store.reset_trial(trial.id)
        trials = store.trials(sweep.id, in_plan_only=True)
    for trial in store.trials(sweep.id):
        if trial.outcome is Outcome.RUNNING:
            # the run that owned it died; its results are incomplete: run it again
            store.reset_trial(trial.id)
    trials = store.trials(sweep.id, in_plan_only=True)
    only = _only_ids(options.only, trials, spec.name)
    todo = [t for t in trials if not t.outcome.final and (not only or t.id in only)]
    if cluster is None and spec.server.launcher == "subprocess" and (todo or spec.search.samples):
        # a program on the port would fail every trial: say so before anything starts
        # (other launchers may find their own service there, and stop it)
        ports = slot_ports(spec, context.slots)
        check_slot_ports(context, spec.server.host, ports, first=True)

    events: queue.Queue[Event] = queue.Queue()
    executor: Executor
    if cluster is None:
        executor = LocalExecutor(context, events)
    else:
        from servesweep.sweep.ray_exec import RayExecutor

        executor = RayExecutor(cluster, context, events, bench_from=spec.executor.bench_from)
    driver = Driver(
        context,
        store,
        sweep,
        executor,
        events,
        observer,
        RunSettings(
            keep_running=options.keep_running,
            fail_fast=options.fail_fast,
            max_slots=options.slots,
            predict=options.predict,
        ),
    )
    source: TrialSource
    capped = spec.search.trials is not None or spec.search.budget is not None
    if spec.search.samples or (capped and not options.only):
        search = SearchSource(store, sweep, spec)
        for note in search.notes:
            observer.event(SweepWarning(message=note))
        source = search
        cap = spec.search.trials
        todo_count = len(todo) if cap is None else max(len(todo), cap - len(trials) + len(todo))
    else:
        # a grid without a cap or budget, or --trial N: exactly the pending trials
        planned = [t.fingerprint for t in todo]
        source, todo_count = SearchSource(store, sweep, spec, only=planned), len(todo)
    ran = driver.run(
        source,
        todo_count=todo_count,
        total=len(trials),
        done=sum(1 for t in trials if t.outcome.final),
    )
    store.finish_sweep(sweep.id)
    final = store.trials(sweep.id, in_plan_only=True)
    summary = SweepSummary(
        sweep=store.sweep(sweep.id),
        store_path=store_path,
        trials=tuple(final),
        ran=tuple(ran),
    )
    observer.event(
        SweepFinished(sweep=sweep.id, counts={o.value: summary.count(o) for o in Outcome})
    )
    return summary
