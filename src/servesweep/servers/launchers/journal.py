"""Which journal entries are one invocation's output, and when the journal holds all of it.

**Which lines.** A unit's stdout and stderr reach journald through a stream socket that
the main process connects before it runs the server. journald tags each line with the
unit's fields (``_SYSTEMD_INVOCATION_ID``, ``_SYSTEMD_CGROUP``, ``_COMM``) by reading
the connecting process's ``/proc`` entry and cgroup when it first reads the stream. A
server that prints its fatal line and exits before journald got to its stream (seen on
a loaded machine, 1 start in 10) is gone by then: its lines are stored with ``_PID``
(the peer's credentials), ``_STREAM_ID``, ``_TRANSPORT=stdout`` and ``_SYSTEMD_UNIT``
(from the stream's header), but *without* ``_SYSTEMD_INVOCATION_ID``, however long one
waits. So an invocation's lines (:class:`Invocation`) are the entries that carry its
invocation ID, plus those that carry none but came from its main process (``_PID``, as
systemd's own PID namespace numbers it) since it was started, and name no other unit.

**When all of them.** journald reads the stream asynchronously: when systemd reports
that a server exited, its last lines (the OOM, the rejected flag) may not be stored
yet. ``wait_complete`` returns once they are:

1. ``journalctl --sync`` asks journald to write everything queued. journald handles
   that request at a lower priority than its input sockets, so when it returns, every
   line the process wrote before it exited has been stored. When the invocation has
   no line yet, the wait goes on as in 2.
2. Where ``--sync`` is not allowed (journald is signalled: root only), or found no line,
   the journal is read until systemd's own record of the invocation's end
   (``UNIT_RESULT``, ``EXIT_CODE``) is there and the invocation's lines have not changed
   for 0.3 s (2 s while it has none).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from servesweep.errors import LaunchError
from servesweep.servers.launchers.external import run_tool

__all__ = ["Invocation", "end_recorded", "sync", "wait_complete"]

_QUIET = 0.3
"""Seconds the invocation's lines must stay unchanged (fallback without --sync)."""
_QUIET_EMPTY = 2.0
"""As ``_QUIET`` while the invocation has no line at all: journald may not have read an
exited process's stream yet; a server that exits without a word costs this much more."""
_POLL = 0.05
_END_FIELDS = ("UNIT_RESULT", "EXIT_CODE", "EXIT_STATUS")
_FIELDS = ("MESSAGE", "_PID", "_SYSTEMD_INVOCATION_ID", "_SYSTEMD_UNIT")
"""What a line query prints (``-o json`` adds the timestamps)."""


@dataclass(frozen=True)
class Invocation:
    """One invocation of a unit, as far as its journal lines go (see the module doc)."""

    unit: str
    invocation_id: str
    main_pid: int | None = None
    """systemd's ``ExecMainPID`` (journald's PID namespace); None: only lines that carry
    the invocation ID are its own."""
    since: float = 0.0
    """Epoch seconds at or before its start: a line without the invocation ID from
    ``main_pid`` is its own only from then on (PIDs are reused)."""

    def matches(self, *pid_also: str) -> list[str]:
        """journalctl's match arguments for its lines: its invocation ID, or its main
        process since its start (a superset: ``owns`` decides), with ``pid_also``."""
        argv = [f"_SYSTEMD_INVOCATION_ID={self.invocation_id}"]
        if self._by_pid():
            argv += ["+", f"_PID={self.main_pid}", *pid_also, f"--since=@{int(self.since) - 1}"]
        return argv

    def _by_pid(self) -> bool:
        return bool(self.main_pid) and self.since > 0

    def owns(self, entry: Mapping[str, object]) -> bool:
        """Whether a journal entry (journalctl's ``-o json`` object) is its output."""
        found = entry.get("_SYSTEMD_INVOCATION_ID")
        if found is not None:
            return found == self.invocation_id
        if not self._by_pid() or entry.get("_PID") != str(self.main_pid):
            return False
        if entry.get("_SYSTEMD_UNIT", self.unit) != self.unit:
            return False
        try:
            stored = int(str(entry.get("__REALTIME_TIMESTAMP")))
        except ValueError:
            return False
        return stored >= self.since * 1e6

    def select(self, json_lines: str) -> str:
        """Its lines' messages from journalctl's ``-o json`` output, as ``-o cat``
        prints them."""
        out: list[str] = []
        for line in json_lines.splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict) and self.owns(entry):
                    out.append(_message(entry.get("MESSAGE")) + "\n")
        return "".join(out)

    def follow_argv(self, journalctl: Sequence[str]) -> list[str]:
        """``journalctl -f`` of its lines, while it runs (those of its main process only
        where they name its unit: ``read`` at the end adds any it missed)."""
        matches = self.matches(f"_SYSTEMD_UNIT={self.unit}")
        return [*journalctl, *matches, "-o", "cat", "--no-pager", "-q", "-f", "-n", "all"]

    def read(
        self, journalctl: Sequence[str], timeout: float, last: int | None = None
    ) -> tuple[str, bool]:
        """Its lines as ``-o cat`` prints them (the last ``last``), and whether journalctl
        exited 0; LaunchError when it cannot run or times out."""
        argv = [*journalctl, *self.matches(), "-o", "json", "--all", "--no-pager", "-q"]
        argv.append(f"--output-fields={','.join(_FIELDS)}")
        if last is not None:
            argv += ["-n", str(last)]
        done = run_tool(argv, timeout=max(timeout, 0.1), check=False, what=self.unit)
        return self.select(done.stdout), done.returncode == 0


def _message(value: object) -> str:
    """A MESSAGE field: a string, or bytes as a list of numbers (not valid UTF-8)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value).decode(errors="replace")
    return ""


def sync(journalctl: Sequence[str], timeout: float) -> bool:
    """``journalctl --sync``; whether it succeeded within ``timeout``."""
    try:
        done = run_tool([*journalctl, "--sync"], timeout=max(timeout, 0.1), check=False)
    except LaunchError:
        return False
    return done.returncode == 0


def _lines(journalctl: Sequence[str], invocation: Invocation, deadline: float) -> str | None:
    try:
        return invocation.read(journalctl, deadline - time.monotonic())[0]
    except LaunchError:
        return None


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


def wait_complete(journalctl: Sequence[str], invocation: Invocation, timeout: float) -> bool:
    """Block (at most ``timeout``) until the journal holds every line the exited
    invocation wrote. Returns whether it does."""
    deadline = time.monotonic() + timeout
    if sync(journalctl, timeout) and (_lines(journalctl, invocation, deadline) or "").strip():
        return True
    last: str | None = None
    quiet_since = time.monotonic()
    while True:
        if deadline - time.monotonic() <= 0:
            return False
        text = _lines(journalctl, invocation, deadline)
        if text is None:
            return False
        now = time.monotonic()
        if text != last:
            last, quiet_since = text, now
        elif now - quiet_since >= (_QUIET if text.strip() else _QUIET_EMPTY) and end_recorded(
            journalctl, invocation.unit, invocation.invocation_id, deadline - now
        ):
            return True
        time.sleep(_POLL)
