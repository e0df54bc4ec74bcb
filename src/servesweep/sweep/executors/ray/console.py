"""What Ray prints on the driver's console: a raylet's death said once.

``ray.init(log_to_driver=False)`` keeps the workers' output off the console, but Ray's
driver still prints the errors its cluster publishes to every driver (a thread of
``ray._private.worker``, ``listen_error_messages``). When a node's raylet dies, two
processes of that node watch it, the dashboard agent and the runtime-env agent
(``ray._private.process_watcher.report_raylet_error_logs``), and each publishes the
same block: ``Raylet is terminated. Termination is unexpected. ... Last 20 lines of
the Raylet logs:`` and those lines. Ray's log deduplicator holds the second copy and
prints it again when its 5 s window closes with no third (Ray 2.60), so the block came
twice, the second minutes later among the trials' lines.

:func:`print_raylet_errors_once` lets the first copy of each raylet message through
and drops the copies that follow; every other line Ray prints is unchanged. It wraps
the function the listener calls by name, ``ray._private.worker.print_to_stdstream``
(Ray's private module: when it is missing, nothing is changed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["print_raylet_errors_once"]

_ATTR = "print_to_stdstream"
_wrapped: set[int] = set()
"""The ids of the wrappers installed (installing twice wraps once)."""


def print_raylet_errors_once(module: ModuleType | None = None) -> None:
    """Make Ray's driver print each message its raylets publish once (``module``:
    where the printing function lives, ``ray._private.worker`` unless given)."""
    if module is None:
        from ray._private import worker as module
    original: Callable[[dict[str, Any], bool], None] | None = getattr(module, _ATTR, None)
    if original is None or id(original) in _wrapped:
        return
    seen: set[str] = set()
    lock = threading.Lock()

    def print_once(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            text = "\n".join(str(line) for line in data.get("lines") or ())
            with lock:
                if text in seen:
                    return
                seen.add(text)
        original(data, ignore_prefix)

    _wrapped.add(id(print_once))
    setattr(module, _ATTR, print_once)
