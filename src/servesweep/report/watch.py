"""``servesweep report --watch``: rewrite a report as a sweep advances.

The report is rendered again whenever the stored sweep changes (a trial enters a
phase, finishes, a result or telemetry arrives) and written atomically (a temporary
file renamed over the old one), so a browser never reads half a page. While the sweep
is not finished an HTML report reloads itself every ``reload_s`` seconds; the last
rewrite, once the sweep is finished or the watcher stops, leaves a page that no
longer reloads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Hashable
from pathlib import Path

from servesweep.errors import ConfigError
from servesweep.records import SweepData

__all__ = ["DEFAULT_INTERVAL_S", "signature", "watch_report", "write_atomic"]

DEFAULT_INTERVAL_S = 2.0


def signature(data: SweepData) -> Hashable:
    """What changes when the sweep advances."""
    return (
        data.sweep.finished_at,
        tuple(
            (t.id, t.outcome.value, t.phase, t.finished_at, len(t.phase_started), t.attempts)
            for t in data.trials
        ),
        sum(len(r) for r in data.results.values()),
        len(data.telemetry),
    )


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {exc.strerror}", key="--out") from exc


def watch_report(
    load: Callable[[], SweepData],
    render: Callable[[SweepData, bool], str],
    out: Path,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    on_write: Callable[[SweepData], None] = lambda data: None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Write ``render(data, live)`` to ``out`` each time ``load()`` returns a changed
    sweep, until the sweep is finished; returns how many times it wrote. ``live`` is
    True while the sweep runs. An interruption (Ctrl-C) writes the report once more
    with ``live`` False, then propagates."""
    last: Hashable = None
    writes = 0
    data: SweepData | None = None
    try:
        while True:
            data = load()
            finished = data.sweep.finished_at is not None
            current = signature(data)
            if current != last:
                write_atomic(out, render(data, not finished))
                writes += 1
                last = current
                on_write(data)
            if finished:
                return writes
            sleep(interval_s)
    except BaseException:
        if data is not None:
            write_atomic(out, render(data, False))  # a page that stops reloading
        raise
