"""What the makespan benchmarks share: a sweep file of the simulated engine on fake
80 GiB GPUs (60 GiB of each GPU an instance gets, so two instances never share a GPU;
loads and releases take real time), and the makespan and busy GPU-seconds of a run,
read from its results database.

Not a benchmark itself: ``parallel_makespan.py`` and ``ray_makespan.py`` import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from servesweep.sim.testing import free_port
from servesweep.store import TrialRecord, open_store

CHAT = {"name": "chat", "concurrency": [1], "requests": 4, "max_tokens": 32, "ignore_eos": True}
"""One short level: the benchmark is about restarts and placement, not the load."""


def write_sim_sweep(
    folder: Path,
    name: str,
    params: dict[str, Any],
    *,
    load_time: float,
    gpus_per_trial: int | str,
    fake_gpus: int | None,
) -> Path:
    """``folder/sweep.yaml``; ``fake_gpus``: that many on this machine (``None``: the
    machines bring their own, as the nodes of a Ray cluster do)."""
    server: dict[str, Any] = {
        "engine": "sim",
        "port": free_port(),
        "gpus_per_trial": gpus_per_trial,
        "gpu_backend": "fake",
        "args": {
            "mem-per-gpu": "60GiB",
            "load-time": load_time,
            "release-delay": 1.0,
            "ttft-ms": 20,
            "step-ms": 20,
        },
        "timeouts": {"stop": "10s", "release": "60s", "ready": "120s"},
    }
    if fake_gpus is not None:
        server.update(
            gpus=list(range(fake_gpus)),
            fake_gpu_dir="gpus",
            fake_gpus={"count": fake_gpus, "memory": "80GiB"},
        )
    spec = {
        "name": name,
        "store": "servesweep.db",
        "server": server,
        "params": params,
        "workloads": [CHAT],
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@dataclass
class Stored:
    """One run's trials as its results database has them."""

    trials: list[TrialRecord]
    began: float
    """The first trial's start (epoch seconds)."""
    makespan_s: float
    """The first trial's start to the last trial's end."""
    busy_gpu_s: float
    """Each trial's GPUs times its start-to-end time, summed."""

    @property
    def ok(self) -> int:
        return sum(1 for t in self.trials if t.outcome.value == "ok")

    def utilisation(self, gpus: int) -> float:
        """Busy GPU-seconds over the GPU-seconds ``gpus`` offered during the makespan."""
        return self.busy_gpu_s / (self.makespan_s * gpus)


def stored_run(folder: Path) -> Stored:
    """The run whose results database is ``folder/servesweep.db``."""
    with open_store(folder / "servesweep.db", readonly=True) as store:
        trials = store.trials(1)
    began = min(t.started_at for t in trials if t.started_at is not None)
    ended = max(t.finished_at for t in trials if t.finished_at is not None)
    return Stored(
        trials=trials,
        began=began,
        makespan_s=ended - began,
        busy_gpu_s=sum(t.gpu_seconds for t in trials),
    )
