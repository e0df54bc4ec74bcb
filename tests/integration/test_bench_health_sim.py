"""A load generator that cannot keep time: its level is stored as unreliable, said
once, and never picked by best.

The sweep runs in this process, its load generator in a slot thread. While the
first configuration (the fast one: 1 ms per token) is measured, a thread of this
process burns the interpreter (and so the generator's event loop) in 20 ms slices:
its timestamps are late by more than a token's time. The second configuration
(20 ms per token) is measured on a quiet generator.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import yaml
from tests.integration.sweep_helpers import kill_tagged, write_sweep

from servesweep.decide.best import find_best
from servesweep.store import open_store
from servesweep.sweep.commands.run import RunOptions, run_sweep
from servesweep.sweep.events import Event, SweepWarning, TrialFinished, TrialStarted


class _Burner:
    """Takes the interpreter from the generator while trial 1 runs."""

    def __init__(self) -> None:
        self.burning = threading.Event()
        self.done = threading.Event()
        self.warnings: list[str] = []
        self._thread = threading.Thread(target=self._burn, daemon=True)
        self._thread.start()

    def _burn(self) -> None:
        while not self.done.is_set():
            if not self.burning.wait(0.05):
                continue
            # pure Python: holds the GIL for its whole slice
            sum(i * i for i in range(200_000))

    def event(self, event: Event) -> None:
        if isinstance(event, TrialStarted) and event.trial == 1:
            self.burning.set()
        elif isinstance(event, TrialFinished) and event.trial == 1:
            self.burning.clear()
        elif isinstance(event, SweepWarning):
            self.warnings.append(event.message)

    def stop(self) -> None:
        self.done.set()
        self.burning.clear()
        self._thread.join(timeout=10)


def test_a_level_the_generator_could_not_time_is_flagged_and_not_picked(tmp_path: Path) -> None:
    sweep = write_sweep(
        tmp_path,
        name="health",
        workloads=[
            {
                "name": "chat",
                "concurrency": [1],
                "requests": 6,
                "max_tokens": 16,
                "ignore_eos": True,
            }
        ],
        args={"ttft-ms": 100},
        extra={
            "objective": {"maximize": "output_throughput", "workload": "chat", "concurrency": 1},
            "include_unreliable": False,
        },
    )
    spec = yaml.safe_load(sweep.read_text())
    del spec["server"]["args"]["step-ms"]
    spec["params"] = {"grid": {"step-ms": [1, 20]}}
    sweep.write_text(yaml.safe_dump(spec, sort_keys=False))

    burner = _Burner()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.02)
    try:
        summary = run_sweep(sweep, RunOptions(), burner)
    finally:
        sys.setswitchinterval(interval)
        burner.stop()
        kill_tagged("health", tmp_path)
    assert summary.exit_code == 0, [t.evidence for t in summary.trials]

    with open_store(tmp_path / "servesweep.db", readonly=True) as store:
        (burned,) = store.results(1, with_samples=False)
        (quiet,) = store.results(2, with_samples=False)
        data = store.load_sweep_data(1, with_samples=False)
    health = burned.info["generator_health"]
    assert burned.unreliable is not None, health
    assert "event loop lagged" in burned.unreliable, burned.unreliable
    assert health["loop_lag_p99_ms"] > 2.0, health
    assert quiet.unreliable is None, quiet.info["generator_health"]
    # the burned level measured more throughput, and does not win
    assert burned.metrics["output_throughput"] > quiet.metrics["output_throughput"]
    best = find_best(data)
    assert best.trial is not None and best.trial.id == 2, best
    assert {e.trial.id: e.kind for e in best.excluded} == {1: "unreliable"}
    taken = find_best(data, include_unreliable=True)
    assert taken.trial is not None and taken.trial.id == 1
    # said once, in one line, naming the key to change
    said = [w for w in burner.warnings if "unreliable" in w]
    assert len(said) == 1, burner.warnings
    assert "workloads[].workers" in said[0] and "\n" not in said[0]
    assert len([w for w in burner.warnings if "remain usable" in w]) <= 1, burner.warnings
