"""Preparing a machine for a run (``sweep.slots.node``): a service the sweep runs through,
found running on a slot, is found on that slot's own port — ``server.ports[k]`` when
the sweep lists its ports — and stopped before the sweep (no processes: the service
manager is a fake that answers for the ports it knows) — and the one rule for which
pending trial, if any, keeps a leftover instance running."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesweep.models import InstanceRecord
from servesweep.servers.launchers.base import ExitStatus, LaunchRequest, StopResult
from servesweep.spec.load import load_sweep_text
from servesweep.spec.slots import slot_port
from servesweep.sweep.events import Event
from servesweep.sweep.slots import node
from servesweep.sweep.slots.data import Placement, SweepContext
from servesweep.sweep.slots.launch import launch_for

_SWEEP = """
name: svc
server:
  engine: sim
  launcher: systemd
  gpu_backend: none
  port: 8100
  ports: [8100, 8200]
  systemd:
    unit: srv@.service
params:
  grid:
    budget: [1, 2]
workloads:
  - name: chat
    concurrency: [1]
    requests: 2
"""


class _Service:
    """A systemd launcher's answers for running units, by port: nothing else runs."""

    name = "systemd"

    def __init__(self, running: dict[int, InstanceRecord], asked: list[int], stopped: list[str]):
        self._running = running
        self._asked = asked
        self._stopped = stopped
        self.warnings: list[str] = []

    def current(self, port: int | None = None) -> InstanceRecord | None:
        assert port is not None
        self._asked.append(port)
        return self._running.get(port)

    def pids(self, instance: InstanceRecord) -> set[int]:
        return set()

    def stop(self, instance: InstanceRecord, grace: float, kill_timeout: float) -> StopResult:
        self._stopped.append(instance.unit or "")
        return StopResult(seconds=0.0)

    def alive(self, instance: InstanceRecord) -> bool:
        return False

    def poll(self, instance: InstanceRecord) -> ExitStatus | None:
        return None

    def start(self, request: LaunchRequest) -> InstanceRecord:
        raise AssertionError("nothing starts while a machine is prepared")


class _Channel:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def send(self, event: Event) -> None:
        self.events.append(event)


def test_a_running_service_is_found_on_its_slots_listed_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load_sweep_text(_SWEEP).spec
    assert slot_port(spec, 1) == 8200  # not server.port + 1
    running = {
        8100: InstanceRecord(launcher="systemd", unit="srv@0.service", port=8100),
        8200: InstanceRecord(launcher="systemd", unit="srv@1.service", port=8200),
    }
    asked: list[int] = []
    stopped: list[str] = []
    monkeypatch.setattr(node, "make_launcher", lambda server: _Service(running, asked, stopped))
    context = SweepContext(
        spec=spec,
        sweep_id=1,
        store_id="store",
        store_path=str(tmp_path / "servesweep.db"),
        run="r1",
        log_root=str(tmp_path / "logs"),
    )
    pool = Placement("here", 0, (), slot_port(spec, 0))

    prepared = node.prepare_node(context, pool, [], None, _Channel(), service_slots=(0, 1))

    assert asked == [8100, 8200]
    assert stopped == ["srv@0.service", "srv@1.service"]
    assert prepared.restart_services == ("srv@0.service", "srv@1.service")


_POOL = """
name: left
server:
  engine: sim
  gpu_backend: none
  port: 8100
  ports: [8100, 8200]
  gpus: [0, 1, 2, 3]
  gpus_per_trial: 2
params:
  grid:
    budget: [1, 2]
workloads:
  - name: chat
    concurrency: [1]
    requests: 2
"""


def _context(tmp_path: Path, text: str) -> SweepContext:
    return SweepContext(
        spec=load_sweep_text(text).spec,
        sweep_id=1,
        store_id="store",
        store_path=str(tmp_path / "servesweep.db"),
        run="r2",
        log_root=str(tmp_path / "logs"),
    )


def _instance(context: SweepContext, slot: Placement, params: dict[str, int]) -> InstanceRecord:
    """What an earlier run recorded for ``params`` started on ``slot``."""
    fp = launch_for(context, slot, params).fingerprint
    return InstanceRecord(launcher="subprocess", port=slot.port, gpus=slot.gpus, fingerprint=fp)


def test_a_leftover_is_kept_for_the_trial_that_would_run_its_launch_on_its_slot(
    tmp_path: Path,
) -> None:
    context = _context(tmp_path, _POOL)
    spec = context.spec
    slots = [Placement("here", k, (0, 1, 2, 3), slot_port(spec, k)) for k in (0, 1)]
    on_slot_1 = Placement("here", 1, (2, 3), 8200)
    left = _instance(context, on_slot_1, {"budget": 2})
    wanted = [(11, {"budget": 1}), (12, {"budget": 2})]

    assert node.leftover_of(context, 5, left, slots, wanted).adopt_for == 12
    # the same launch on another port, or on GPUs outside the slots, is nobody's
    elsewhere = _instance(context, Placement("here", 1, (2, 3), 8101), {"budget": 2})
    assert node.leftover_of(context, 5, elsewhere, slots, wanted).adopt_for is None
    narrow = [Placement("here", k, (0, 1), slot_port(spec, k)) for k in (0, 1)]
    assert node.leftover_of(context, 5, left, narrow, wanted).adopt_for is None
    # nor is a configuration no pending trial runs
    assert node.leftover_of(context, 5, left, slots, wanted[:1]).adopt_for is None


def test_apply_keeps_only_an_instance_of_its_launch_on_its_one_slot(tmp_path: Path) -> None:
    context = _context(tmp_path, _POOL)
    apply_slot = Placement("here", 0, (0, 1), 8100)
    same = _instance(context, apply_slot, {"budget": 2})
    wanted = [(7, {"budget": 2})]

    assert node.leftover_of(context, 3, same, [apply_slot], wanted).adopt_for == 7
    other_gpus = _instance(context, Placement("here", 0, (2, 3), 8100), {"budget": 2})
    assert node.leftover_of(context, 3, other_gpus, [apply_slot], wanted).adopt_for is None
