"""What each trial held and cost: its GPUs and GPU-seconds, from the stored records,
and the price of a GPU-hour the sweep file gives (``cost``)."""

from __future__ import annotations

import functools

from servesweep.errors import ServesweepError
from servesweep.records import SweepData, TrialRecord
from servesweep.spec.load import load_sweep_text
from servesweep.spec.schema import CostSpec

__all__ = ["sweep_cost", "sweep_gpus", "trial_gpu_seconds", "trial_gpus"]


@functools.lru_cache(maxsize=16)
def _spec_gpus(spec_text: str, spec_path: str) -> tuple[int, ...]:
    if not spec_text.strip():
        return ()
    try:
        return tuple(load_sweep_text(spec_text, spec_path).spec.server.gpus)
    except ServesweepError:
        return ()  # an old or hand-edited sweep file: the count stays unknown


@functools.lru_cache(maxsize=16)
def _spec_cost(spec_text: str, spec_path: str) -> CostSpec | None:
    if not spec_text.strip():
        return None
    try:
        return load_sweep_text(spec_text, spec_path).spec.cost
    except ServesweepError:
        return None  # an old or hand-edited sweep file: no price


def sweep_cost(data: SweepData) -> CostSpec | None:
    """``cost`` of the sweep file the sweep ran (None: it gives no price)."""
    return _spec_cost(data.sweep.spec_text, data.sweep.spec_path)


def sweep_gpus(data: SweepData) -> tuple[int, ...]:
    """``server.gpus`` of the sweep file the sweep ran (empty when unknown)."""
    return _spec_gpus(data.sweep.spec_text, data.sweep.spec_path)


def trial_gpus(data: SweepData, trial: TrialRecord) -> int | None:
    """How many GPUs the trial held: the GPUs its attempt was given, else its
    instance's, else the sweep's ``server.gpus``, else the GPUs its telemetry saw;
    None when unknown."""
    if trial.gpus:
        return len(trial.gpus)
    if trial.instance is not None and trial.instance.gpus:
        return len(trial.instance.gpus)
    if gpus := sweep_gpus(data):
        return len(gpus)
    seen = {(p.node, p.gpu) for p in data.telemetry if p.trial_id == trial.id}
    return len(seen) or None


def trial_gpu_seconds(data: SweepData, trial: TrialRecord) -> float:
    """Wall time of the trial's latest attempt × its GPUs (one when unknown)."""
    if trial.started_at is None or trial.finished_at is None:
        return 0.0
    return max(0.0, trial.finished_at - trial.started_at) * (trial_gpus(data, trial) or 1)
