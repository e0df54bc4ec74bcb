"""A dead raylet's log block is printed once on the driver's console
(``sweep.executors.ray.console``)."""

from __future__ import annotations

import inspect
import types
from typing import Any

from servesweep.sweep.executors.ray.console import print_raylet_errors_once

BLOCK = (
    "Raylet is terminated. Termination is unexpected. Possible reasons include: (1) SIGKILL "
    "by the user or system OOM killer, (2) Invalid memory access from Raylet causing SIGSEGV "
    "or SIGBUS, (3) Other termination signals. Last 20 lines of the Raylet logs:\n"
    "    [2026-12-06 18:37:37,897 I 27623 27623] (raylet) worker_pool.cc:564: Started worker "
    "process with pid 28252\n"
)
NODE_DEAD = (
    "The node with node id: 03b7 and address: 127.0.0.3 and node name: 127.0.0.3 has been "
    "marked dead because the detector has missed too many heartbeats from it."
)


def _fake_worker() -> tuple[types.ModuleType, list[dict[str, Any]]]:
    printed: list[dict[str, Any]] = []
    module = types.ModuleType("fake_ray_worker")

    def print_to_stdstream(data: dict[str, Any], ignore_prefix: bool) -> None:
        printed.append(data)

    module.print_to_stdstream = print_to_stdstream  # type: ignore[attr-defined]
    return module, printed


def _raylet(message: str) -> dict[str, Any]:
    return {"lines": [message], "pid": "raylet", "is_err": False}


def test_the_raylet_block_both_agents_publish_is_printed_once() -> None:
    module, printed = _fake_worker()
    print_raylet_errors_once(module)
    print_raylet_errors_once(module)  # installing twice wraps once
    show = module.print_to_stdstream
    # the dashboard agent's and the runtime-env agent's copies, then another message
    show(_raylet(BLOCK), False)
    show(_raylet(BLOCK), False)
    show(_raylet(NODE_DEAD), False)
    # a worker's lines are never held back, repeated or not
    line = {"lines": ["hello"], "pid": 4242, "ip": "127.0.0.2", "is_err": False}
    show(line, False)
    show(line, False)
    assert printed == [_raylet(BLOCK), _raylet(NODE_DEAD), line, line]


def test_rays_printing_function_is_where_the_wrapper_expects_it() -> None:
    # the wrapper changes nothing when Ray moves it: this says so on an upgrade
    from ray._private import worker

    assert list(inspect.signature(worker.print_to_stdstream).parameters)[:2] == [
        "data",
        "ignore_prefix",
    ]
    assert "print_to_stdstream(" in inspect.getsource(worker.listen_error_messages)
