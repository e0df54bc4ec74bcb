"""Server log files: instance headers, incremental reading, fatal patterns, tails,
progress.

Every launcher writes one header line before an instance's output
(``=== servesweep instance TAG starting at ...: COMMAND``); readers skip to it, so
lines of an earlier instance appended to the same file are not read again.

A log file is appended to by the server while servesweep reads it; lines may
arrive half-written. :class:`LogWatcher` returns only complete lines (a partial
last line is kept until its newline arrives, or returned by ``flush``).
"""

from __future__ import annotations

import os
import re
import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from servesweep.errors import LaunchError
from servesweep.servers.engines import FatalPattern

__all__ = [
    "FatalMatch",
    "LogProgress",
    "LogWatcher",
    "first_error",
    "instance_lines",
    "log_marker",
    "match_fatal",
    "tail",
    "write_header",
]

_MAX_READ = 4 * 2**20
_MAX_LINE = 4096
_MAX_SCAN = 16 * 2**20


def log_marker(tag: str) -> str:
    """The text of the header line a launcher writes before an instance's output."""
    return f"servesweep instance {tag} starting"


def write_header(log_path: Path, tag: str, argv: Sequence[str]) -> None:
    """Append the instance's header line (creating the file and its folder)."""
    stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(f"=== {log_marker(tag)} at {stamp}: {shlex.join(argv)}\n")
    except OSError as exc:
        raise LaunchError(f"cannot write the server log {log_path}: {exc}") from exc


@dataclass(frozen=True)
class FatalMatch:
    pattern: FatalPattern
    line: str


@dataclass(frozen=True)
class LogProgress:
    last_line: str
    """The last non-empty line (may be partial)."""
    idle_s: float
    """Seconds since the log last grew."""
    size: int

    def progressing(self, window_s: float) -> bool:
        return self.idle_s <= window_s


class LogWatcher:
    """Reads the lines appended to a file since the last call.

    ``start_after`` skips the file up to and including the last line containing that
    marker (a launcher writes one per instance), so lines of an earlier instance
    appended to the same file are not read again.
    """

    def __init__(self, path: str | os.PathLike[str], *, start_after: str | None = None) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self._last_line = ""
        self._last_growth = time.monotonic()
        self._size = 0
        if start_after:
            self._offset = _marker_end(self.path, start_after)
            self._size = self._offset

    @property
    def offset(self) -> int:
        """Bytes of the file consumed so far."""
        return self._offset

    def skip(self, count: int) -> None:
        """Do not read the next ``count`` bytes."""
        self._offset += count
        self._partial = b""

    def read_new(self) -> list[str]:
        """Complete lines appended since the last call (without newlines)."""
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self._offset:  # truncated or replaced
                    self._offset = 0
                    self._partial = b""
                if size == self._offset:
                    return []
                fh.seek(self._offset)
                data = fh.read(_MAX_READ)
        except OSError:
            return []
        self._offset += len(data)
        self._size = self._offset
        self._last_growth = time.monotonic()
        data = self._partial + data
        parts = data.split(b"\n")
        self._partial = parts.pop()
        if len(self._partial) > _MAX_LINE * 16:  # a runaway line without newline
            parts.append(self._partial)
            self._partial = b""
        lines = [p.rstrip(b"\r").decode(errors="replace") for p in parts]
        for line in reversed(lines):
            if line.strip():
                self._last_line = line.strip()
                break
        partial = self._partial.decode(errors="replace").strip()
        if partial:
            self._last_line = partial
        return lines

    def flush(self) -> list[str]:
        """New lines plus the partial last line, if any (use when the writer is gone)."""
        lines = self.read_new()
        if self._partial:
            lines.append(self._partial.decode(errors="replace"))
            self._partial = b""
        return lines

    def progress(self) -> LogProgress:
        return LogProgress(
            last_line=self._last_line[:_MAX_LINE],
            idle_s=time.monotonic() - self._last_growth,
            size=self._size,
        )


def _marker_end(path: Path, marker: str) -> int:
    try:
        data = path.read_bytes()
    except OSError:
        return 0
    at = data.rfind(marker.encode())
    if at < 0:
        return 0
    end = data.find(b"\n", at)
    return len(data) if end < 0 else end + 1


def match_fatal(lines: Iterable[str], patterns: Sequence[FatalPattern]) -> FatalMatch | None:
    """The line matching the most specific pattern: patterns earlier in ``patterns``
    win (``oom`` before a generic ``Traceback``); for one pattern, the first line."""
    found = _earliest(lines, [p.pattern for p in patterns])
    return None if found is None else FatalMatch(patterns[found[0]], found[1])


def first_error(lines: Iterable[str], patterns: Sequence[re.Pattern[str]]) -> str | None:
    """The engine's first error line: the first line matching the earliest pattern of
    ``patterns`` that matches any (see ``engine_patterns.PYTHON_ERRORS``)."""
    found = _earliest(lines, patterns)
    return None if found is None else found[1]


def _earliest(lines: Iterable[str], patterns: Sequence[re.Pattern[str]]) -> tuple[int, str] | None:
    """(rank of the earliest pattern that matches a line, the first line it matches)."""
    best: tuple[int, str] | None = None
    for line in lines:
        for rank, pattern in enumerate(patterns):
            if best is not None and rank >= best[0]:
                break
            if pattern.search(line):
                best = (rank, line.strip()[:_MAX_LINE])
                break
    return best


def instance_lines(
    path: str | os.PathLike[str] | None, tag: str | None, limit: int = _MAX_SCAN
) -> list[str]:
    """Every line of one instance's output: after its header line when ``tag`` is
    given, at most the last ``limit`` bytes of it (empty when unreadable)."""
    if path is None:
        return []
    watcher = LogWatcher(path, start_after=log_marker(tag) if tag else None)
    try:
        size = os.stat(path).st_size
    except OSError:
        return []
    skipped = max(0, size - watcher.offset - limit)
    if skipped:
        watcher.skip(skipped)
    lines: list[str] = []
    while True:
        new = watcher.read_new()
        if not new:
            break
        lines += new
    lines += watcher.flush()
    return lines[1:] if skipped else lines  # the first line may be cut


def tail(path: str | os.PathLike[str] | None, n: int = 50) -> list[str]:
    """The last ``n`` lines of a file (empty when it cannot be read)."""
    if path is None or n <= 0:
        return []
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            chunk = 8192
            data = b""
            while size > 0 and data.count(b"\n") <= n:
                step = min(chunk, size)
                size -= step
                fh.seek(size)
                data = fh.read(step) + data
                chunk *= 2
    except OSError:
        return []
    lines = data.decode(errors="replace").splitlines()
    return [line[:_MAX_LINE] for line in lines[-n:]]
