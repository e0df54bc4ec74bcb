"""The server's API key is read once, where the run starts (``server.api_key_env``), and
travels with the sweep to every slot: a slot on a machine whose environment lacks the
variable (a Ray node started without it) still sends the key to the readiness gate, the
same key its benchmark sends. The gate's HTTP exchange is replaced by a recorder."""

from __future__ import annotations

from typing import Any

import pytest

from servesweep.models import InstanceRecord
from servesweep.servers import lifecycle
from servesweep.servers.readiness import ReadyInfo
from servesweep.spec.load import load_sweep_text
from servesweep.sweep.events import Event
from servesweep.sweep.slots.data import Placement, SweepContext
from servesweep.sweep.slots.worker import SlotWorker

_VARIABLE = "SERVESWEEP_TEST_NODE_API_KEY"

_SWEEP = f"""
name: keyed
server:
  engine: sim
  port: 18471
  api_key_env: {_VARIABLE}
params:
  grid:
    budget: [1]
workloads:
  - name: chat
    concurrency: [1]
    requests: 2
"""


class _Events:
    def __init__(self) -> None:
        self.seen: list[Event] = []

    def send(self, event: Event) -> None:
        self.seen.append(event)


def test_a_slot_whose_machine_lacks_the_key_variable_sends_the_runs_key_to_the_gate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(_VARIABLE, raising=False)  # this "node" was started without it
    spec = load_sweep_text(_SWEEP).spec
    context = SweepContext(
        spec=spec,
        sweep_id=1,
        store_id="s",
        store_path="/r/db",
        run="r1",
        log_root="/r/runs",
        api_key="key-read-where-the-run-started",
    )
    sent: list[str | None] = []

    def gate(*args: Any, api_key: str | None = None, **kwargs: Any) -> ReadyInfo:
        sent.append(api_key)
        return ReadyInfo(model="m", load_s=0.1, ready_s=0.2)

    monkeypatch.setattr(lifecycle, "wait_ready", gate)
    worker = SlotWorker(context, Placement("node-b", 0, (), 18471, "f158"), _Events(), current=None)
    try:
        worker.lifecycle.wait_ready(InstanceRecord("subprocess", pids=(1,), port=18471))
        benchmark_key = worker._target("m").api_key
    finally:
        worker.close()
    assert sent == ["key-read-where-the-run-started"]
    assert benchmark_key == sent[0]
