"""Whose is a process? The rule that keeps concurrent sweeps from touching each other.

Every process of an instance servesweep starts carries, in its environment, the
instance tag (``SERVESWEEP_INSTANCE``, see ``procs``) and its owner: the results
database's id (``SERVESWEEP_STORE_ID``), the run that started it
(``SERVESWEEP_RUN``), the slot it runs in (``SERVESWEEP_SLOT``) and, for people, the
database's path (``SERVESWEEP_STORE``). A run holds its database's lock for as long
as it lives, so:

* ``mine``: this database, this run, this slot — an orphan of our own instance;
* ``sibling``: this database and run, another slot — never touched by this slot;
* ``leftover``: this database, another run — that run is dead (we hold the lock),
  so the instance is ours to adopt or stop;
* ``other_run``: a servesweep instance of another results database (a concurrent
  sweep, maybe of the same name): never signalled, reported with its owner — unless
  the release policy ``kill-own`` says to kill any servesweep instance, and then the
  kill is reported;
* ``foreign``: not started by servesweep.

The liveness of another database's run is read from ``/proc/locks`` (who holds the
``flock`` on its lock file), never by taking its lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from servesweep.servers import procs
from servesweep.servers.leases import flock_holder

__all__ = [
    "OWNER_ENV",
    "Owner",
    "OwnerKind",
    "Ownership",
    "lock_holder",
    "lock_path_for",
    "owner_env",
    "read_owner",
]

STORE_ID_ENV = "SERVESWEEP_STORE_ID"
RUN_ENV = "SERVESWEEP_RUN"
SLOT_ENV = "SERVESWEEP_SLOT"
STORE_PATH_ENV = "SERVESWEEP_STORE"
OWNER_ENV = (STORE_ID_ENV, RUN_ENV, SLOT_ENV, STORE_PATH_ENV)
"""Environment variables that name an instance's owner (never part of its launch identity)."""


class OwnerKind(str, Enum):
    MINE = "mine"
    SIBLING = "sibling"
    LEFTOVER = "leftover"
    OTHER_RUN = "other_run"
    FOREIGN = "foreign"


@dataclass(frozen=True)
class Owner:
    """Who started a process, as far as its environment tells."""

    kind: OwnerKind
    tag: str | None = None
    store_id: str = ""
    run: str = ""
    slot: str = ""
    store_path: str = ""

    def describe(self) -> str:
        """For messages: which database and run an instance belongs to."""
        if self.kind is OwnerKind.FOREIGN:
            return "not started by servesweep"
        where = self.store_path or "an unknown results database"
        if self.kind is OwnerKind.OTHER_RUN:
            holder = lock_holder(self.store_path) if self.store_path else None
            state = f"run {self.run or '?'}"
            if holder is not None:
                state += f", alive: servesweep pid {holder} holds {lock_path_for(self.store_path)}"
            elif self.store_path:
                state += ", whose process has ended"
            return f"a servesweep instance of another sweep ({where}; {state})"
        if self.kind is OwnerKind.SIBLING:
            return f"this run's instance in slot {self.slot}"
        if self.kind is OwnerKind.LEFTOVER:
            return f"an instance left by an earlier run ({self.run}) of this results database"
        return "this slot's own instance"


def owner_env(store_id: str, run: str, slot: int, store_path: str) -> dict[str, str]:
    """The environment that marks an instance as started by this run in this slot."""
    return {
        STORE_ID_ENV: store_id,
        RUN_ENV: run,
        SLOT_ENV: str(slot),
        STORE_PATH_ENV: store_path,
    }


def read_owner(pid: int) -> dict[str, str] | None:
    """The owner variables of a process (None when it is not a servesweep instance or
    its environment cannot be read)."""
    env = procs.environ_of(pid)
    if env is None or procs.TAG_ENV not in env:
        return None
    return {k: env[k] for k in (procs.TAG_ENV, *OWNER_ENV) if k in env}


class Ownership:
    """The point of view of one slot of one run: classifies processes (see module doc)."""

    def __init__(self, store_id: str, run: str, slot: int) -> None:
        self.store_id = store_id
        self.run = run
        self.slot = str(slot)

    def owner(self, pid: int) -> Owner:
        env = read_owner(pid)
        if env is None:
            return Owner(OwnerKind.FOREIGN)
        store_id = env.get(STORE_ID_ENV, "")
        run = env.get(RUN_ENV, "")
        slot = env.get(SLOT_ENV, "")
        if not store_id or store_id != self.store_id:
            kind = OwnerKind.OTHER_RUN
        elif run != self.run:
            kind = OwnerKind.LEFTOVER
        elif slot != self.slot:
            kind = OwnerKind.SIBLING
        else:
            kind = OwnerKind.MINE
        return Owner(
            kind,
            tag=env.get(procs.TAG_ENV),
            store_id=store_id,
            run=run,
            slot=slot,
            store_path=env.get(STORE_PATH_ENV, ""),
        )

    def may_kill(self, pid: int, *, kill_any_servesweep: bool = False) -> bool:
        """Whether this slot may kill ``pid`` as an orphan of its own: its own instance's
        or an earlier dead run's of this database; with ``kill_any_servesweep`` (the
        ``kill-own`` release policy) any servesweep instance but a sibling slot's."""
        kind = self.owner(pid).kind
        if kind in (OwnerKind.MINE, OwnerKind.LEFTOVER):
            return True
        return kill_any_servesweep and kind is OwnerKind.OTHER_RUN


def lock_path_for(store_path: str) -> str:
    """The lock file a run of ``store_path`` holds (see sweep.commands.run.sweep_lock)."""
    return store_path + ".lock"


def lock_holder(store_path: str) -> int | None:
    """The PID holding the run lock of the results database at ``store_path``, read
    from /proc/locks (None when no process holds it or it cannot be told)."""
    return flock_holder(lock_path_for(store_path))
