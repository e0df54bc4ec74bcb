"""Run a sweep file: plan, resume, run every pending trial, clean up.

``run_sweep`` is the library entry point behind ``servesweep run``. It is
idempotent: run it again on the same file and it continues where the last run
stopped — finished trials are skipped, a trial left ``running`` by a crash is run
again after its recorded instance has been stopped (or adopted when it already
runs a pending trial's launch), so two servers never share the GPUs. The work is
done by a :class:`~servesweep.sweep.core.driver.Driver` and its slots, on the run's site
(``sweep.executors.site``): threads of this process, or actors on the nodes of a Ray
cluster (``--ray``); nothing here knows which.
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
from typing import Any

from servesweep import __version__
from servesweep.decide.memory import PREDICTED_OOM
from servesweep.decide.perf.gate import PREDICTED_WORSE
from servesweep.errors import ConfigError, StoreError
from servesweep.models import Outcome
from servesweep.servers.engines import engine_version
from servesweep.servers.ownership import lock_path_for
from servesweep.spec.expand import expand_configs
from servesweep.spec.load import LoadedSweep, load_sweep, load_sweep_text
from servesweep.spec.schema import ServerSpec, SweepSpec
from servesweep.store import Store, SweepRecord, TrialRecord, open_store
from servesweep.sweep.core.driver import Driver
from servesweep.sweep.core.identity import changes
from servesweep.sweep.core.rules import max_slots
from servesweep.sweep.core.run_state import RunSettings
from servesweep.sweep.core.seams import TrialSource
from servesweep.sweep.core.search_source import SearchSource
from servesweep.sweep.events import Event, NullObserver, Observer, SweepFinished, SweepWarning
from servesweep.sweep.executors.fake_gpus import fake_gpu_dir
from servesweep.sweep.executors.site import Site, open_site
from servesweep.sweep.slots.data import SweepContext, this_node

__all__ = [
    "RunOptions",
    "SweepSummary",
    "fake_gpu_dir",
    "new_run_id",
    "open_sweep",
    "run_sweep",
    "server_api_key",
    "store_path_for",
    "sweep_context",
    "sweep_lock",
]

PREDICTED = (PREDICTED_OOM, PREDICTED_WORSE)
"""The reasons of trials skipped on a prediction: ``--no-predict`` runs them."""


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

    When the sweep file changed what a trial measures (``sweep.core.identity``) and trials
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


def _environment(server: ServerSpec) -> dict[str, Any]:
    """What the sweep ran with (no secrets): versions, the machine running it; its site
    adds what the run's machines are."""
    return {
        "servesweep": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "engine": server.engine,
        "engine_version": engine_version(server),
        "launcher": server.launcher,
    }


def server_api_key(spec: SweepSpec) -> str | None:
    """The server's API key (``server.api_key_env``), read once where the run starts:
    it travels with the sweep (``SweepContext.api_key``) to the readiness gate and the
    benchmark of every slot, wherever it runs. ConfigError when the variable is unset."""
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
    api_key = server_api_key(loaded.spec)
    site = open_site(loaded, options.ray)
    try:
        return _run_on(site, loaded, options, observer, api_key)
    finally:
        site.close()  # also when the run ends before its executor does


def _run_on(
    site: Site,
    loaded: LoadedSweep,
    options: RunOptions,
    observer: Observer,
    api_key: str | None,
) -> SweepSummary:
    for line in site.check():
        observer.event(SweepWarning(message=line))
    store_path = store_path_for(loaded, options.store)
    spec = site.scheduled(loaded.spec)
    with (
        sweep_lock(store_path),
        site.leases(
            spec,
            store_path,
            slots=max_slots(spec, options.slots),
            wait=options.wait,
            notify=lambda line: observer.event(SweepWarning(message=line)),
        ),
    ):
        store = open_store(store_path)
        try:
            return _run(site, loaded, store, store_path, options, observer, api_key)
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
    site: Site,
    loaded: LoadedSweep,
    store: Store,
    store_path: Path,
    options: RunOptions,
    observer: Observer,
    api_key: str | None,
) -> SweepSummary:
    spec = loaded.spec
    sweep = open_sweep(loaded, store, fresh=options.fresh, keep_results=options.keep_results)
    run = new_run_id()
    context = sweep_context(loaded, store, store_path, sweep, run, api_key)
    scheduled = site.scheduled(spec)
    context = replace(context, spec=scheduled, slots=max_slots(scheduled, options.slots))
    store.add_event(sweep.id, "run_started", {"run": run, "pid": os.getpid(), "node": this_node()})
    environment = {**sweep.environment, **_environment(spec.server), **site.environment(context)}
    store.set_environment(sweep.id, environment)

    trials = store.trials(sweep.id, in_plan_only=True)
    if options.retry_failed:
        for trial in trials:
            if trial.outcome in (Outcome.FAILED, Outcome.INTERRUPTED):
                store.reset_trial(trial.id)
    if not options.predict:  # --no-predict: what the prediction skipped runs now
        for trial in trials:
            if trial.evidence is not None and trial.evidence.reason in PREDICTED:
                store.reset_trial(trial.id)
        trials = store.trials(sweep.id, in_plan_only=True)
    if spec.screening_pass is None:  # screening off: what it screened out is measured now
        for trial in trials:
            if trial.evidence is not None and trial.evidence.reason == "screened":
                store.reset_trial(trial.id)
    for trial in store.trials(sweep.id):
        if trial.outcome is Outcome.RUNNING:
            # the run that owned it died; its results are incomplete: run it again
            store.reset_trial(trial.id)
    trials = store.trials(sweep.id, in_plan_only=True)
    only = _only_ids(options.only, trials, spec.name)
    todo = [t for t in trials if not t.outcome.final and (not only or t.id in only)]

    events: queue.Queue[Event] = queue.Queue()
    executor = site.executor(context, events)
    if todo or spec.search.samples:
        try:
            executor.check()  # what would fail every trial, said before anything starts
        except BaseException:
            executor.close()
            raise
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
        # the guide starts from the earlier sweeps the performance gate starts from and
        # keeps clear of what the memory gate predicts over its capacity (given before
        # the search replays the stored trials: it asks the guide again)
        search = SearchSource(
            store,
            sweep,
            spec,
            predict=options.predict,
            earlier=driver.perf.earlier,
            memory=driver.memory.over_by,
        )
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
