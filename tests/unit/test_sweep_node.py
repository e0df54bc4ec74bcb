"""Preparing a machine for a run (``sweep.node``): a service the sweep runs through,
found running on a slot, is found on that slot's own port — ``server.ports[k]`` when
the sweep lists its ports — and stopped before the sweep (no processes: the service
manager is a fake that answers for the ports it knows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesweep.models import InstanceRecord
from servesweep.servers.launchers.base import ExitStatus, LaunchRequest, StopResult
from servesweep.spec.load import load_sweep_text
from servesweep.spec.slots import slot_port
from servesweep.sweep import node
from servesweep.sweep.events import Event
from servesweep.sweep.slot import Placement, SweepContext

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
