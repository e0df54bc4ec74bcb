"""The memory gate inside the driver: a trial's memory is predicted when it is placed on
a slot, with the calibration the trials before it gave (not when it was queued), and
what its server held on the GPU (the slot's samples less the machine's baseline)
calibrates the rest of the sweep. Slots here are fakes that write what llama-server
writes to its log and report GPU samples as a slot's telemetry does (no processes)."""

from __future__ import annotations

import json
import queue
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.fake_executor import FakeExecutor, FakeSlot
from helpers.gguf_model import write_tiny_gguf
from servesweep.models import Outcome, Phase
from servesweep.records import TelemetryPoint
from servesweep.servers.memory import Capacity, MemoryModel
from servesweep.servers.memory.rules import CUDA_CONTEXT
from servesweep.spec.load import load_sweep_text
from servesweep.spec.schema import SweepSpec
from servesweep.store import Store, SweepRecord, open_store
from servesweep.sweep.commands.run import open_sweep
from servesweep.sweep.core.driver import Driver
from servesweep.sweep.core.memory_gate import MemoryGate
from servesweep.sweep.core.run_state import RunSettings
from servesweep.sweep.core.search_source import SearchSource
from servesweep.sweep.events import (
    Event,
    NullObserver,
    PhaseEntered,
    TelemetrySampled,
    TrialFinished,
    TrialStarted,
)
from servesweep.sweep.slots.data import (
    CurrentInstance,
    NodeInfo,
    Placement,
    SweepContext,
    TrialOrder,
)

GiB, MiB = 2**30, 2**20
BASELINE = 2 * GiB
"""What the fake machine's GPU holds with no server on it."""
SMALL, BIG = 4096, 1 << 22
"""The two ctx-size values of the grid."""


@dataclass
class _Machine:
    """What each fake trial reports: its log lines, and what its server held on GPU 0
    above the baseline (None: no samples)."""

    log: Callable[[Mapping[str, Any]], list[str]]
    held: Callable[[Mapping[str, Any]], int | None]
    events: queue.Queue[Event] = field(default_factory=queue.Queue)
    ran: list[int] = field(default_factory=list)


class _Slot(FakeSlot):
    def __init__(self, placement: Placement, machine: _Machine) -> None:
        super().__init__(placement, machine.events)
        self._m = machine

    def run(self, order: TrialOrder) -> None:
        put, p = self._m.events.put, self.placement
        self._m.ran.append(order.params["ctx-size"])
        put(
            TrialStarted(
                trial=order.trial,
                node=p.node,
                node_id=p.node_id,
                slot=p.slot,
                log_path=order.log_path,
                gpus=p.gpus,
            )
        )
        # the previous instance still held the GPU while the slot stopped it
        before = TelemetryPoint(order.trial, 99.0, 0, BASELINE + 60 * GiB, node=p.node)
        put(PhaseEntered(trial=order.trial, phase=Phase.START, at=100.0))
        log = Path(order.log_path)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("\n".join(self._m.log(order.params)) + "\n")
        held = self._m.held(order.params)
        if held is not None:
            points = [before] + [
                TelemetryPoint(order.trial, 100.0 + i, 0, BASELINE + v, node=p.node)
                for i, v in enumerate((held // 2, held, held - MiB))
            ]
            put(TelemetrySampled(trial=order.trial, points=tuple(points)))
        put(TrialFinished(trial=order.trial, outcome=Outcome.OK))
        self._idle()


class _Executor(FakeExecutor):
    def __init__(self, machine: _Machine) -> None:
        super().__init__([NodeInfo("host-A", (0,), "A")], {0: BASELINE})
        self._m = machine

    def open(
        self, placement: Placement, *, current: CurrentInstance | None, baseline: Mapping[int, int]
    ) -> _Slot:
        return _Slot(placement, self._m)


def _text(tmp_path: Path, capacity: int) -> str:
    model = tmp_path / "tiny.gguf"
    if not model.exists():
        write_tiny_gguf(model)
    return json.dumps(
        {
            "name": "memdriver",
            "server": {
                "engine": "llama-server",
                "model": str(model),
                "gpus": [0],
                "fake_gpu_dir": str(tmp_path / "no-gpus-here"),
                "fake_gpus": {"count": 1, "memory": capacity},
            },
            "params": {"grid": {"ctx-size": [SMALL, BIG]}},
            "search": {"predict": "skip"},
            "workloads": [{"name": "chat", "concurrency": [1], "requests": 2}],
        }
    )


def _raw(tmp_path: Path) -> MemoryModel:
    """The sweep's predictor before any trial calibrated it."""
    spec = load_sweep_text(_text(tmp_path, 1000 * GiB)).spec
    return MemoryModel.of_sweep(spec, Capacity(1000 * GiB, "gpu", "test"))


def _cuda_log(weights: int, kv: int, compute: int) -> list[str]:
    return [
        "llama_model_loader: loaded meta data with 30 key-value pairs",
        f"load_tensors:        CUDA0 model buffer size = {weights / MiB:10.2f} MiB",
        f"llama_kv_cache:      CUDA0 KV buffer size = {kv / MiB:10.2f} MiB",
        f"sched_reserve:      CUDA0 compute buffer size = {compute / MiB:10.2f} MiB",
    ]


def _run(tmp_path: Path, capacity: int, machine: _Machine) -> tuple[Store, int]:
    store, sweep, _ = _drive(tmp_path, capacity, machine)
    return store, sweep


def _driver(store: Store, sweep: SweepRecord, spec: SweepSpec, machine: _Machine) -> Driver:
    context = SweepContext(
        spec=spec,
        sweep_id=sweep.id,
        store_id=store.store_id,
        store_path=str(store.path),
        run="r1",
        log_root=str(Path(store.path).parent / "runs"),
    )
    settings = RunSettings(max_slots=1)
    return Driver(
        context, store, sweep, _Executor(machine), machine.events, NullObserver(), settings
    )


def _drive(tmp_path: Path, capacity: int, machine: _Machine) -> tuple[Store, int, Driver]:
    loaded = load_sweep_text(_text(tmp_path, capacity))
    store = open_store(tmp_path / "db")
    sweep = open_sweep(loaded, store)
    driver = _driver(store, sweep, loaded.spec, machine)
    todo = store.trials(sweep.id)
    source = SearchSource(store, sweep, loaded.spec, only=[t.fingerprint for t in todo])
    assert source.planned  # a grid's plan: every trial queued at the start
    driver.run(source, todo_count=len(todo), total=len(todo), done=0)
    return store, sweep.id, driver


def _outcomes(store: Store, sweep: int) -> dict[int, Outcome]:
    return {t.params["ctx-size"]: t.outcome for t in store.trials(sweep)}


def test_a_queued_trial_is_judged_with_the_calibration_when_it_is_placed(
    tmp_path: Path,
) -> None:
    """A grid queues its plan at once; the big context is predicted not to fit before
    any trial ran, but the first trial's log shows a KV cache and a compute buffer half
    the size predicted, and by then it fits: it is launched, not skipped on the stale
    prediction."""
    raw = _raw(tmp_path)
    small, big = raw.predict({"ctx-size": SMALL}), raw.predict({"ctx-size": BIG})
    calibrated = big.per_gpu_bytes - (big.kv_cache + big.workspace - CUDA_CONTEXT) // 2
    capacity = (big.per_gpu_bytes + calibrated) // 2  # between the two
    assert big.per_gpu_bytes - capacity > big.margin and calibrated < capacity

    def log(params: Mapping[str, Any]) -> list[str]:
        p = small if params["ctx-size"] == SMALL else big
        return _cuda_log(p.weights, p.kv_cache // 2, (p.workspace - CUDA_CONTEXT) // 2)

    machine = _Machine(log=log, held=lambda params: None)
    store, sweep = _run(tmp_path, capacity, machine)
    assert machine.ran == [SMALL, BIG]
    assert _outcomes(store, sweep) == {SMALL: Outcome.OK, BIG: Outcome.OK}
    memory = {e["trial"]: e for e in store.events(sweep, "memory")}
    assert [m["predicted"]["calibrated"] for m in memory.values()] == [0, 1]
    store.close()


def test_a_queued_trial_that_calibration_shows_too_large_is_skipped(tmp_path: Path) -> None:
    """The reverse: predicted to fit when queued, over the capacity once the first
    trial showed a KV cache and a compute buffer twice the size predicted: skipped,
    never launched."""
    raw = _raw(tmp_path)
    small, big = raw.predict({"ctx-size": SMALL}), raw.predict({"ctx-size": BIG})
    calibrated = big.per_gpu_bytes + big.kv_cache + big.workspace - CUDA_CONTEXT
    capacity = (big.per_gpu_bytes + calibrated) // 2
    assert capacity > big.per_gpu_bytes and calibrated - capacity > big.margin

    def log(params: Mapping[str, Any]) -> list[str]:
        p = small if params["ctx-size"] == SMALL else big
        return _cuda_log(p.weights, 2 * p.kv_cache, 2 * (p.workspace - CUDA_CONTEXT))

    machine = _Machine(log=log, held=lambda params: None)
    store, sweep = _run(tmp_path, capacity, machine)
    assert machine.ran == [SMALL]
    assert _outcomes(store, sweep) == {SMALL: Outcome.OK, BIG: Outcome.SKIPPED}
    skipped = next(t for t in store.trials(sweep) if t.params["ctx-size"] == BIG)
    assert skipped.evidence is not None and skipped.evidence.reason == "predicted_oom"
    store.close()


def test_what_the_gpu_saw_the_server_hold_calibrates_the_sweep(tmp_path: Path) -> None:
    """llama-server's buffer report matches the prediction exactly; the slot's GPU
    samples (after the server's start, less the baseline) show 64 MiB beside it where
    the uncalibrated prediction assumes 512 MiB (CUDA_CONTEXT). The memory event
    records the device figure, and the big context, over by more than the margin
    before, fits by the measured overhead and is launched."""
    raw = _raw(tmp_path)
    small, big = raw.predict({"ctx-size": SMALL}), raw.predict({"ctx-size": BIG})
    overhead = 64 * MiB
    capacity = big.per_gpu_bytes - big.margin - 100 * MiB
    assert big.per_gpu_bytes - CUDA_CONTEXT + overhead < capacity

    def report(params: Mapping[str, Any]) -> list[str]:
        p = small if params["ctx-size"] == SMALL else big
        return _cuda_log(p.weights, p.kv_cache, p.workspace - CUDA_CONTEXT)

    def held(params: Mapping[str, Any]) -> int:
        p = small if params["ctx-size"] == SMALL else big
        return p.per_gpu_bytes - CUDA_CONTEXT + overhead

    machine = _Machine(log=report, held=held)
    store, sweep = _run(tmp_path, capacity, machine)
    memory = {e["trial"]: e for e in store.events(sweep, "memory")}
    first = memory[min(memory)]["measured"]
    reported = small.per_gpu_bytes - CUDA_CONTEXT
    assert abs(first["device_used"] - held({"ctx-size": SMALL})) < MiB
    assert abs(first["device_used"] - reported - overhead) < MiB  # not the 60 GiB before it
    assert machine.ran == [SMALL, BIG]
    assert _outcomes(store, sweep) == {SMALL: Outcome.OK, BIG: Outcome.OK}
    second = memory[max(memory)]["predicted"]
    assert abs(second["per_gpu_bytes"] - held({"ctx-size": BIG})) < 2 * MiB
    store.close()


def test_the_gate_tells_a_guided_search_how_far_over_its_capacity_a_config_is(
    tmp_path: Path,
) -> None:
    """What the guide of a sampling search reads (``MemoryGate.over_by``): the gate's
    prediction against the capacity, negative where there is room; None with the gate
    off."""
    raw = _raw(tmp_path)
    big = raw.predict({"ctx-size": BIG})
    capacity = big.per_gpu_bytes - GiB
    spec = load_sweep_text(_text(tmp_path, capacity)).spec
    gate = MemoryGate(spec)
    assert gate.model is not None
    expected = gate.model.predict({"ctx-size": BIG})
    assert gate.over_by({"ctx-size": BIG}) == expected.per_gpu_bytes - expected.capacity > 0
    small = gate.over_by({"ctx-size": SMALL})
    assert small is not None and small < 0
    assert MemoryGate(spec, enabled=False).over_by({"ctx-size": BIG}) is None


def test_a_later_run_predicts_with_the_calibration_the_stored_trials_gave(tmp_path: Path) -> None:
    """The first test's sweep (the small context's log shows a KV cache and a compute
    buffer half the size predicted), then the driver of a later run of it: its memory
    gate is rebuilt from the stored ``memory`` events, so it predicts what the gate of
    the run that measured them predicts at its end, and, as of a point of the history
    (what a resumed search's replay reads), what that gate predicted then: before the
    first trial ended, uncalibrated."""
    raw = _raw(tmp_path)
    small, big = raw.predict({"ctx-size": SMALL}), raw.predict({"ctx-size": BIG})
    capacity = big.per_gpu_bytes - big.margin - GiB // 4

    def log(params: Mapping[str, Any]) -> list[str]:
        p = small if params["ctx-size"] == SMALL else big
        return _cuda_log(p.weights, p.kv_cache // 2, (p.workspace - CUDA_CONTEXT) // 2)

    machine = _Machine(log=log, held=lambda params: None)
    store, sweep_id, first = _drive(tmp_path, capacity, machine)
    assert first.memory.model is not None and first.memory.model.calibration.trials == 2
    spec, sweep = first.spec, store.sweep(sweep_id)
    later = _driver(store, sweep, spec, machine).memory
    uncalibrated = MemoryGate(spec)
    assert later.model is not None
    assert later.model.calibration == first.memory.model.calibration
    for ctx in (SMALL, BIG):
        assert later.over_by({"ctx-size": ctx}) == first.memory.over_by({"ctx-size": ctx})
    one, two = sorted(store.trials(sweep_id), key=lambda t: t.id)
    assert one.finished_at is not None and two.finished_at is not None
    before, after_one = one.finished_at - 0.001, one.finished_at
    assert later.over_by({"ctx-size": BIG}, at=before) == uncalibrated.over_by({"ctx-size": BIG})
    calibrated_once = later.over_by({"ctx-size": BIG}, at=after_one)
    assert calibrated_once is not None
    assert calibrated_once < (uncalibrated.over_by({"ctx-size": BIG}) or 0)
    # what the first run predicted for the big context at its placement, after one trial
    stored = {e["trial"]: e for e in store.events(sweep_id, "memory")}
    assert stored[two.id]["applied"]["trials"] == 1 and stored[two.id]["ended"] == two.finished_at
    assert calibrated_once == stored[two.id]["predicted"]["per_gpu_bytes"] - capacity
    # events stored before they carried the calibration their prediction was made with:
    # the trials ran one at a time, each predicted with the calibration before it
    old = [
        {k: v for k, v in e.items() if k not in ("applied", "ended")}
        for e in store.events(sweep_id, "memory")
    ]
    assert MemoryGate(spec, stored=old).over_by({"ctx-size": BIG}) == later.over_by(
        {"ctx-size": BIG}
    )
    store.close()
