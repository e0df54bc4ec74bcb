"""``servesweep stop``: stop what this results database left running on this machine.

What ``servesweep apply`` (or ``run --keep-running``) leaves running, and what a run
that died (SIGKILL, a lost terminal) left behind, is recorded in the results database
as a live instance. ``stop`` takes the database's run lock — so it refuses while a run
of this database is alive, and every instance of the database is then a leftover of a
dead run (see ``servers.ownership``) — and stops each such instance on this machine
through its launcher, the whole instance, as the release gate does. It then stops any
process still tagged with this database's id (an instance a run started but died
before recording). A process whose environment names another results database is
never signalled.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from servesweep.errors import TrialFailed
from servesweep.models import InstanceRecord, ServerConfig
from servesweep.servers import procs
from servesweep.servers.launchers import make_launcher
from servesweep.servers.ownership import STORE_ID_ENV, STORE_PATH_ENV, read_owner
from servesweep.servers.release import stop_instance
from servesweep.spec.load import load_sweep
from servesweep.spec.schema import ServerSpec
from servesweep.store import open_store
from servesweep.sweep.commands.run import store_path_for, sweep_lock
from servesweep.sweep.core.store_writer import StoreWriter
from servesweep.sweep.events import InstanceGone, LeftoverStopped, NullObserver, Observer
from servesweep.sweep.slots.data import this_node

__all__ = ["StopResult", "stop_instances"]


@dataclass(frozen=True)
class StopResult:
    lines: tuple[str, ...]
    """One line per instance (stopped, already gone, not touched) for the user."""
    stopped: int
    ok: bool
    """False when an instance could not be stopped (``stop_failed``) or is elsewhere."""


def stop_instances(
    sweep_file: str | Path, *, store: Path | None = None, observer: Observer | None = None
) -> StopResult:
    loaded = load_sweep(sweep_file)
    store_path = store_path_for(loaded, store)
    if not store_path.exists():
        return StopResult((f"nothing to stop: no results database at {store_path}",), 0, True)
    lines: list[str] = []
    stopped = 0
    ok = True
    node = this_node()
    with sweep_lock(store_path), open_store(store_path) as db:
        sweep = db.latest_sweep(loaded.spec.name)
        if sweep is None:
            return StopResult(
                (f"nothing to stop: no sweep {loaded.spec.name!r} in {store_path}",), 0, True
            )
        writer = StoreWriter(db, sweep.id, observer or NullObserver())
        recorded: set[int] = set()
        for trial in db.live_instances(sweep.id):
            instance = trial.instance
            if instance is None:
                continue
            recorded |= set(instance.pids)
            what = f"trial {trial.number} ({ServerConfig.of(trial.params).label()})"
            if instance.node not in ("", node):
                lines.append(
                    f"{what}: runs on {instance.node}, not this machine: "
                    "run `servesweep stop` there"
                )
                ok = False
                continue
            server = _server_of(loaded.spec.server, instance)
            launcher = make_launcher(server)
            if not launcher.alive(instance):
                writer.apply(InstanceGone(trial=trial.id))
                lines.append(f"{what}: already gone")
                continue
            other = _other_database(instance, db.store_id)
            if other:
                lines.append(f"{what}: pid {instance.main_pid} {other}: not touched")
                ok = False
                continue
            try:
                result = stop_instance(launcher, instance, server.timeouts)
            except TrialFailed as failure:
                lines.append(f"{what}: could not be stopped: {failure.evidence.summary()}")
                ok = False
                continue
            writer.apply(InstanceGone(trial=trial.id))
            writer.apply(
                LeftoverStopped(
                    instance_of=trial.id,
                    signalled=tuple(result.signalled),
                    killed=tuple(result.killed),
                    reason="stopped by servesweep stop",
                    node=node,
                )
            )
            stopped += 1
            where = f"port {instance.port}" if instance.port is not None else "its port"
            who = instance.unit or instance.container_id or f"pid {instance.main_pid}"
            lines.append(f"{what}: stopped {who} on {where} in {result.seconds:.1f}s")
        orphans = _untracked_processes(db.store_id, recorded)
        if orphans:
            line, survivors = _stop_orphans(orphans, loaded.spec.server)
            stopped += 1
            ok = ok and not survivors
            lines.append(line)
    if not lines:
        lines.append(f"nothing to stop: sweep {sweep.name} has no instance running")
    return StopResult(tuple(lines), stopped, ok)


def _server_of(server: ServerSpec, instance: InstanceRecord) -> ServerSpec:
    if instance.port is None:
        return server
    return server.model_copy(
        update={"port": instance.port, "gpus": list(instance.gpus) or server.gpus}
    )


def _other_database(instance: InstanceRecord, store_id: str) -> str:
    """Why an instance's main process is not this database's ('' when it is, or when
    its environment cannot be read and the launcher's identity has to do)."""
    pid = instance.main_pid
    if pid is None:
        return ""
    env = read_owner(pid)
    if env is None or env.get(STORE_ID_ENV, store_id) == store_id:
        return ""
    return "belongs to another results database " + repr(env.get(STORE_PATH_ENV, "?"))


def _untracked_processes(store_id: str, recorded: set[int]) -> set[int]:
    """Live processes tagged with this database's id that no record names."""
    found = set()
    for pid in procs.tagged():
        if pid in recorded:
            continue
        env = read_owner(pid)
        if env is not None and env.get(STORE_ID_ENV) == store_id:
            found.add(pid)
    return found


def _stop_orphans(pids: set[int], server: ServerSpec) -> tuple[str, bool]:
    procs.signal_all(pids, signal.SIGTERM)
    left = procs.wait_gone(pids, server.timeouts.stop)
    if left:
        procs.signal_all(left, signal.SIGKILL)
        left = procs.wait_gone(left, server.timeouts.kill)
    listed = ", ".join(str(p) for p in sorted(pids))
    if left:
        return (
            f"unrecorded processes of this results database ({listed}): "
            f"{len(left)} survived SIGKILL: "
            + "; ".join(p.describe() for p in procs.describe_all(left))
        ), True
    return f"stopped unrecorded processes of this results database (pids {listed})", False
