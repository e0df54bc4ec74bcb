"""Where slots run is the executor's alone: the orchestrator and the driver import no
executor (they ask a ``Site`` and an ``Executor``), and the local executor's own rules —
each slot's CPU cores, the warning when there are too few — hold on its own."""

from __future__ import annotations

import ast
import queue
from dataclasses import replace
from pathlib import Path

import pytest

from servesweep.spec.load import load_sweep_text
from servesweep.sweep.events import Event
from servesweep.sweep.executors import local
from servesweep.sweep.executors.local import LocalExecutor
from servesweep.sweep.slots.data import SweepContext

_SWEEP_PACKAGE = Path(local.__file__).parents[1]
_EXECUTORS = ("servesweep.sweep.executors.local", "servesweep.sweep.executors.ray")


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize("module", ["commands/run.py", "core/driver.py"])
def test_the_orchestrator_and_the_driver_import_no_executor(module: str) -> None:
    imported = _imported(_SWEEP_PACKAGE / module)
    assert any(n.startswith("servesweep.sweep.") for n in imported)
    named = sorted(n for n in imported if n.startswith(_EXECUTORS))
    assert not named, named


def _executor(slots: int) -> LocalExecutor:
    spec = load_sweep_text(
        "name: cores\nserver:\n  engine: sim\nparams:\n  grid:\n    budget: [1]\n"
        "workloads:\n  - name: chat\n    concurrency: [1]\n    requests: 2\n"
    ).spec
    context = SweepContext(
        spec=spec, sweep_id=1, store_id="s", store_path="/r/db", run="r", log_root="/r/runs"
    )
    events: queue.Queue[Event] = queue.Queue()
    return LocalExecutor(replace(context, slots=slots), events)


def test_each_local_slot_gets_cores_of_its_own_when_there_are_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(local.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4}, raising=False)
    executor = _executor(slots=2)
    # core 0 is left to the driver
    assert [executor._cpus(0), executor._cpus(1)] == [(1, 2), (3, 4)]
    assert executor.warnings() == []
    assert _executor(slots=1)._cpus(0) == ()  # one slot: no pinning


def test_local_slots_that_must_share_cores_are_said_to_compete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(local.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    executor = _executor(slots=2)
    assert executor._cpus(0) == ()
    (line,) = executor.warnings()
    assert line.startswith("2 slots share 2 CPU core(s): the load generators"), line
    assert _executor(slots=1).warnings() == []
