"""Watch and clean up a sandbox run's processes.

When servesweep runs as root every sandbox run gets a fresh uid that no other
process has, so "every process of this uid" is exactly "everything the run
started", wherever it moved (new session, reparented to init). The memory of a
run is the resident memory of the whole tree under its first process (inside a
PID namespace, orphans are reparented to the namespace's init, which stays in the
tree).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

__all__ = ["kill_uid", "kill_uids", "pids_of_uid", "tree_rss"]

_PAGE = os.sysconf("SC_PAGE_SIZE")


def pids_of_uid(uid: int) -> list[int]:
    """PIDs whose real or effective uid is ``uid`` (read from /proc). A zombie
    (dead, waiting for its parent, often init, to collect its exit status) is not
    counted, unless other threads of it still run."""
    return _pids_of({uid})


def _pids_of(uids: set[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            real, effective = (int(x) for x in fields["Uid"].split()[:2])
        except (OSError, ValueError, KeyError):
            continue
        dead = (
            fields.get("State", "").strip().startswith("Z")
            and fields.get("Threads", "").strip() == "1"
        )
        if (real in uids or effective in uids) and not dead:
            found.append(int(entry))
    return found


def kill_uid(uid: int, deadline_s: float = 5.0) -> list[int]:
    """SIGKILL every process of ``uid`` until none is left (or the deadline);
    returns the PIDs that were killed. ``uid`` 0 is refused."""
    return kill_uids({uid}, deadline_s)


def kill_uids(uids: set[int], deadline_s: float = 5.0) -> list[int]:
    """:func:`kill_uid` for several uids at once (one scan of /proc per round)."""
    if 0 in uids:
        raise ValueError("refusing to kill every process of uid 0")
    killed: list[int] = []
    end = time.monotonic() + deadline_s
    while uids:
        pids = _pids_of(uids)
        if not pids or time.monotonic() > end:
            return killed
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.01)
    return killed


def tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (0 when it is gone)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    total = 0
    todo = [root]
    seen: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            continue
    return total
