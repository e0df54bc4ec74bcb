"""What the fake GPUs need to know about a process, read from ``/proc``.

A holding names its process by PID *and* start time (field 22 of
``/proc/PID/stat``, clock ticks since boot), so a PID reused by a new process is
never mistaken for the holder — and by its PID namespace, so that a holder inside a
container (a systemd-nspawn machine, a container with its own PIDs) is found under
the PID the reader sees (:func:`host_pid`), as NVML names processes by their host PID.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["ProcStat", "host_pid", "own_pid_ns", "proc_cmdline", "proc_name", "read_stat"]


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    """One letter: R, S, D, T, Z (zombie), X (dead)..."""
    start_time: int
    """Clock ticks since boot at which the process started."""

    @property
    def exited(self) -> bool:
        """A zombie has already released everything the driver cares about."""
        return self.state in ("Z", "X")


def read_stat(pid: int) -> ProcStat | None:
    """The process's state and start time, or None when no such process exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces or ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return ProcStat(pid=pid, state=rest[0], start_time=int(rest[19]))
    except (IndexError, ValueError):
        return None


def own_pid_ns() -> str:
    """This process's PID namespace (``pid:[4026531836]``; empty when unreadable)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


_MAPPED: dict[tuple[str, int, int | None], int | None] = {}


def host_pid(pid_ns: str, pid: int, start_time: int | None) -> int | None:
    """The PID, in this process's namespace, of the process that is ``pid`` in the
    PID namespace ``pid_ns`` and started at ``start_time``: ``pid`` itself when the
    namespaces are the same, None when no such process is visible (it exited, or its
    namespace is not below ours)."""
    if not pid_ns or pid_ns == own_pid_ns():
        return pid
    key = (pid_ns, pid, start_time)
    if key in _MAPPED:
        return _MAPPED[key]
    found = None
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        candidate = int(name)
        if _nspid_last(candidate) != pid:
            continue
        try:
            if os.readlink(f"/proc/{candidate}/ns/pid") != pid_ns:
                continue
        except OSError:
            continue
        stat = read_stat(candidate)
        if stat is not None and (start_time is None or stat.start_time == start_time):
            found = candidate
            break
    if found is not None or len(_MAPPED) < 4096:
        _MAPPED[key] = found  # a holder that exited is never seen again either
    return found


def _nspid_last(pid: int) -> int | None:
    """The innermost PID of a process (last field of ``NSpid`` in its status)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    fields = line.split()[1:]
                    return int(fields[-1]) if len(fields) > 1 else None
    except (OSError, ValueError):
        return None
    return None


def proc_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def proc_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def own_start_time() -> int:
    stat = read_stat(os.getpid())
    if stat is None:  # pragma: no cover - /proc always has ourselves on Linux
        raise RuntimeError("cannot read /proc/self/stat")
    return stat.start_time
