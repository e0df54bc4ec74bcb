"""What the fake GPUs need to know about a process, read from ``/proc``.

A holding names its process by PID *and* start time (field 22 of
``/proc/PID/stat``, clock ticks since boot), so a PID reused by a new process is
never mistaken for the holder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["ProcStat", "proc_cmdline", "proc_name", "read_stat"]


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
