"""When the journal holds all of an invocation's output.

A unit's stdout reaches journald through a stream socket that journald reads
asynchronously: when systemd reports that a server exited, its last lines (the OOM,
the rejected flag) may not be stored yet. ``wait_complete`` returns once they are:

1. ``journalctl --sync`` asks journald to write everything queued. journald handles
   that request at a lower priority than its input sockets, so when it returns, every
   line the process wrote before it exited has been stored — except, seen on a loaded
   machine (1 start in 10), a stream journald had not read at all: when ``--sync``
   returns and the invocation has no line yet, the wait goes on as in 2.
2. Where ``--sync`` is not allowed (journald is signalled: root only), or found no line,
   the journal is read until systemd's own record of the invocation's end
   (``UNIT_RESULT``, ``EXIT_CODE``) is there and the invocation's lines have not changed
   for 0.3 s (2 s while it has none).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence

from servesweep.errors import LaunchError
from servesweep.servers.launchers.external import run_tool

__all__ = ["end_recorded", "sync", "wait_complete"]

_QUIET = 0.3
"""Seconds the invocation's lines must stay unchanged (fallback without --sync)."""
_QUIET_EMPTY = 2.0
"""As ``_QUIET`` while the invocation has no line at all: journald may not have read an
exited process's stream yet (seen on a loaded machine after 0.3 s); a server that
exits without a word costs this much more."""
_POLL = 0.05
_END_FIELDS = ("UNIT_RESULT", "EXIT_CODE", "EXIT_STATUS")


def sync(journalctl: Sequence[str], timeout: float) -> bool:
    """``journalctl --sync``; whether it succeeded within ``timeout``."""
    try:
        done = run_tool([*journalctl, "--sync"], timeout=max(timeout, 0.1), check=False)
    except LaunchError:
        return False
    return done.returncode == 0


def _lines(lines_argv: Sequence[str], deadline: float) -> str:
    try:
        left = max(deadline - time.monotonic(), 0.1)
        return run_tool(lines_argv, timeout=left, check=False).stdout
    except LaunchError:
        return ""


def end_recorded(journalctl: Sequence[str], unit: str, invocation: str, timeout: float) -> bool:
    """Whether the journal has systemd's record of how the invocation ended."""
    argv = [*journalctl, "-u", unit, f"INVOCATION_ID={invocation}", "-o", "json", "-q"]
    try:
        done = run_tool([*argv, "--no-pager"], timeout=max(timeout, 0.1), check=False)
    except LaunchError:
        return False
    for line in done.stdout.splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and any(f in entry for f in _END_FIELDS):
                return True
    return False


def wait_complete(
    journalctl: Sequence[str],
    unit: str,
    invocation: str,
    lines_argv: Sequence[str],
    timeout: float,
) -> bool:
    """Block (at most ``timeout``) until the journal holds every line the exited
    invocation wrote; ``lines_argv`` prints those lines. Returns whether it does."""
    deadline = time.monotonic() + timeout
    if sync(journalctl, timeout) and _lines(lines_argv, deadline).strip():
        return True
    last: str | None = None
    quiet_since = time.monotonic()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            text = run_tool(lines_argv, timeout=left, check=False).stdout
        except LaunchError:
            return False
        now = time.monotonic()
        if text != last:
            last, quiet_since = text, now
        elif now - quiet_since >= (_QUIET if text.strip() else _QUIET_EMPTY) and end_recorded(
            journalctl, unit, invocation, deadline - now
        ):
            return True
        time.sleep(_POLL)
