"""Find and kill what a sandbox run left behind, by the run's own uid.

When servesweep runs as root every sandbox run gets a fresh uid that no other
process has, so "every process of this uid" is exactly "everything the run
started", wherever it moved (new session, reparented to init).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

__all__ = ["kill_uid", "pids_of_uid"]


def pids_of_uid(uid: int) -> list[int]:
    """PIDs whose real or effective uid is ``uid`` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        real, effective = (int(x) for x in line.split()[1:3])
                        if uid in (real, effective):
                            found.append(int(entry))
                        break
        except (OSError, ValueError):
            continue
    return found


def kill_uid(uid: int, deadline_s: float = 5.0) -> list[int]:
    """SIGKILL every process of ``uid`` until none is left (or the deadline);
    returns the PIDs that were killed. ``uid`` 0 is refused."""
    if uid == 0:
        raise ValueError("refusing to kill every process of uid 0")
    killed: list[int] = []
    end = time.monotonic() + deadline_s
    while True:
        pids = pids_of_uid(uid)
        if not pids or time.monotonic() > end:
            return killed
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.01)
