"""Process trees as evidence and as things to stop.

An instance is more than its main PID: engines fork workers, some of them call
``setsid`` or survive their parent. servesweep finds an instance's processes three
ways: the main PID's descendants, the process group, and an environment tag
(``SERVESWEEP_INSTANCE=<tag>``) that every process started by servesweep inherits,
read from ``/proc/PID/environ``. Zombies count as gone: they hold no memory and no
sockets — except a process whose main thread exited while its other threads still
run: ``/proc`` shows it as a zombie, yet its threads keep its memory and sockets, so
it is alive until its last thread ends.

psutil errors never leave this module: a process that vanished is simply gone, a
process we may not read is described with what we can read.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Callable, Iterable

import psutil

from servesweep.models import ProcessInfo

__all__ = [
    "TAG_ENV",
    "alive",
    "all_pids",
    "create_time",
    "describe",
    "describe_all",
    "environ_of",
    "group_members",
    "is_gone",
    "new_instance_tag",
    "signal_all",
    "tag_of",
    "tagged",
    "tree",
    "wait_gone",
]

TAG_ENV = "SERVESWEEP_INSTANCE"
"""Environment variable that marks every process of an instance started by servesweep."""


def new_instance_tag(trial_key: str) -> str:
    """A unique tag for one instance: ``<trial_key>-<8 hex>`` (no spaces)."""
    safe = "".join(c if c.isalnum() or c in "-_.:" else "_" for c in trial_key) or "trial"
    return f"{safe}-{secrets.token_hex(4)}"


def all_pids() -> list[int]:
    """Every PID visible in /proc."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state is index 0)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    end = data.rfind(b")")
    if end < 0:
        return None
    return data[end + 2 :].decode(errors="replace").split()


def is_gone(pid: int) -> bool:
    """True when the PID does not exist or is a zombie whose threads have all ended."""
    fields = _stat_fields(pid)
    if fields is None:
        return True
    return fields[0] in ("Z", "X") and not _threads_run(pid)


def _threads_run(pid: int) -> bool:
    """Whether a zombie's thread group still has live threads (its leader exited first)."""
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith("Threads:"):
            try:
                return int(line.split()[1]) > 1
            except (IndexError, ValueError):
                return False
    return False


def alive(pid: int, started_at: float | None = None, tag: str | None = None) -> bool:
    """Whether ``pid`` runs and is the same process: created no later than
    ``started_at`` allows (guards against PID reuse) and carrying ``tag`` if given."""
    if pid <= 0 or is_gone(pid):
        return False
    if started_at is not None:
        created = create_time(pid)
        if created is not None and created > started_at + 5.0:
            return False
    if tag is not None:
        found = tag_of(pid)
        if found is not None and found != tag:
            return False
    return True


def create_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def tree(pid: int) -> set[int]:
    """``pid`` and its live descendants (empty when ``pid`` is gone)."""
    if is_gone(pid):
        return set()
    try:
        proc = psutil.Process(pid)
        children = proc.children(recursive=True)
    except (psutil.Error, OSError):
        return set()
    return {pid} | {c.pid for c in children if not is_gone(c.pid)}


def group_members(pgid: int) -> set[int]:
    """Live processes whose process group is ``pgid``."""
    out: set[int] = set()
    for pid in all_pids():
        fields = _stat_fields(pid)
        # After the state: ppid, pgrp, session...
        if fields is None or fields[0] in ("Z", "X") or len(fields) < 3:
            continue
        if fields[2] == str(pgid):
            out.add(pid)
    return out


def environ_of(pid: int) -> dict[str, str] | None:
    """A process's initial environment (None when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def tag_of(pid: int) -> str | None:
    """The instance tag in a process's initial environment, if any (None when unreadable)."""
    env = environ_of(pid)
    return None if env is None else env.get(TAG_ENV)


def tagged(tag: str | None = None, *, prefix: str | None = None) -> dict[int, str]:
    """Live processes carrying an instance tag: exactly ``tag``, or starting with
    ``prefix``, or any tag when both are None. Returns ``{pid: tag}``."""
    me = os.getpid()
    out: dict[int, str] = {}
    for pid in all_pids():
        if pid == me:
            continue
        found = tag_of(pid)
        if found is None:
            continue
        if tag is not None and found != tag:
            continue
        if prefix is not None and not found.startswith(prefix):
            continue
        if not is_gone(pid):
            out[pid] = found
    return out


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def describe(pid: int) -> ProcessInfo:
    """A process as evidence: state letter, kernel wait channel, command line, name."""
    fields = _stat_fields(pid)
    if fields is None:
        return ProcessInfo(pid=pid, state="gone")
    wchan = _read(f"/proc/{pid}/wchan").strip()
    if wchan == "0":
        wchan = ""
    cmdline = _read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()
    name = _read(f"/proc/{pid}/comm").strip()
    state = fields[0]
    if state == "Z" and _threads_run(pid):
        # The main thread exited; a live thread still knows the command line.
        state = "Z (main thread exited, other threads run)"
        for tid in _tasks(pid):
            cmdline = cmdline or _read(f"/proc/{pid}/task/{tid}/cmdline").replace("\0", " ").strip()
    return ProcessInfo(pid=pid, state=state, wchan=wchan, cmdline=cmdline, name=name)


def _tasks(pid: int) -> list[str]:
    try:
        return [t for t in os.listdir(f"/proc/{pid}/task") if t != str(pid)]
    except OSError:
        return []


def describe_all(pids: Iterable[int]) -> tuple[ProcessInfo, ...]:
    return tuple(describe(pid) for pid in sorted(pids))


def signal_all(pids: Iterable[int], sig: signal.Signals) -> tuple[int, ...]:
    """Send ``sig`` to each PID; returns those that received it."""
    sent: list[int] = []
    for pid in sorted(pids):
        if pid <= 1 or pid == os.getpid():
            continue
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            continue
        sent.append(pid)
    return tuple(sent)


def wait_gone(
    pids: Iterable[int],
    timeout: float,
    *,
    refresh: Callable[[], set[int]] | None = None,
    on_poll: Callable[[], None] | None = None,
) -> set[int]:
    """Wait up to ``timeout`` seconds until every PID is gone; return the survivors.

    ``refresh`` re-discovers the instance's PIDs (new children) on each poll;
    ``on_poll`` runs each poll (e.g. reaping our own child). Polls start at 5 ms and
    back off to 50 ms.
    """
    pending = set(pids)
    deadline = time.monotonic() + max(0.0, timeout)
    delay = 0.005
    while True:
        if on_poll is not None:
            on_poll()
        if refresh is not None:
            pending |= refresh()
        pending = {pid for pid in pending if not is_gone(pid)}
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 1.5, 0.05)
