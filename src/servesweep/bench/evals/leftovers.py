"""Names that say which process owns a sandbox run's folder and cgroups, so that
the leftovers of a servesweep that was killed (SIGKILL leaves no chance to clean
up) are removed at the next start, and nothing of a live run ever is.

A name starts ``servesweep-eval-<pidns>-<pid>-<start>-``: the inode of the owner's
PID namespace, its pid and its start time (clock ticks after boot, field 22 of
``/proc/PID/stat``), so a pid reused by another process does not pass for the
owner. An owner in another PID namespace cannot be checked: its names are left
alone.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

__all__ = ["PREFIX", "clean_folders", "owner_is_dead", "owner_prefix"]

PREFIX = "servesweep-eval-"
_NAME = re.compile(r"^servesweep-eval-(\d+)-(\d+)-(\d+)-")


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rfind(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def owner_prefix() -> str:
    """The prefix for names owned by this process."""
    pid = os.getpid()
    return f"{PREFIX}{_pid_namespace()}-{pid}-{_start_time(pid) or 0}-"


def owner_is_dead(name: str) -> bool:
    """Whether ``name`` is owned by a process of this PID namespace that is gone.
    False for names it cannot tell about (not ours, another namespace)."""
    match = _NAME.match(name)
    if match is None:
        return False
    namespace, pid, start = (int(g) for g in match.groups())
    if namespace != _pid_namespace() or namespace == 0:
        return False
    return _start_time(pid) != start


def clean_folders(folder: str | Path) -> list[Path]:
    """Delete the run folders in ``folder`` whose owner is dead; returns them."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for entry in entries:
        ours = entry.name.startswith(PREFIX) and entry.is_dir(follow_symlinks=False)
        if ours and owner_is_dead(entry.name):
            shutil.rmtree(entry.path, ignore_errors=True)
            if not os.path.lexists(entry.path):
                removed.append(Path(entry.path))
    return removed
