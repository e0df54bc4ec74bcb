"""Fit or skip: whether a configuration predicted not to fit its GPUs is launched.

The prediction itself (weights, KV cache, draft, the engine's reservations, calibrated
by what each launch really used) is :mod:`servesweep.servers.memory`'s: it reads the
model's files and the engines' logs. This module holds the decision made on it, once:

- **certain OOM**: a configuration is certain not to fit when its prediction says
  ``oom`` *and* its bytes per device exceed the capacity by more than the prediction's
  margin (what the engine may allocate beyond the rules, 0 on the fake GPUs, which
  count exactly). A prediction within the margin, or whose verdict is ``unknown``,
  never stops a launch: a wasted launch costs minutes, a configuration wrongly never
  measured may be the winner.
- **when it is skipped**: predictions are made unless the sweep file says
  ``search.predict: off`` or the run ``--no-predict``; a certain OOM is skipped by a
  sampling search (a launch there is one of a budget of trials, and the sampler learns
  the configuration is infeasible) and by a grid only when the sweep file says
  ``search.predict: skip`` (a grid's plan is what the user wrote: by default it is
  launched and its failure classified).
- **what the user is told**: the trial ends ``skipped`` with reason ``predicted_oom``
  and the prediction as evidence, the figures against the capacity and the way to
  launch it anyway.

``sweep/core/memory_gate.py`` carries it out when the driver places the trial on a
slot, and stores it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from servesweep.models import Evidence

__all__ = [
    "OOM_CRASH",
    "PREDICTED_OOM",
    "Gate",
    "Predicted",
    "certain_oom",
    "gate_of",
    "skip_evidence",
]

PREDICTED_OOM = "predicted_oom"
"""The reason of a trial skipped because it was predicted not to fit."""
OOM_CRASH = "oom"
"""The reason of a trial whose engine ran out of memory (the engines' fatal log
patterns, ``servers.engine_patterns``)."""
GiB = 2**30


class Predicted(Protocol):
    """What the decision reads of a memory prediction
    (:class:`servesweep.servers.memory.MemoryPrediction`)."""

    @property
    def verdict(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def margin(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def per_gpu_bytes(self) -> int: ...
    def to_json(self) -> dict[str, Any]: ...


def certain_oom(verdict: str, per_gpu_bytes: int, capacity: int, margin: int) -> bool:
    """Predicted not to fit by more than the margin: not worth a launch."""
    return verdict == "oom" and per_gpu_bytes - capacity > margin


@dataclass(frozen=True)
class Gate:
    """The memory gate's settings for a run."""

    active: bool
    """Predictions are made and stored."""
    skips: bool
    """A certain OOM is skipped (not only predicted)."""


def gate_of(predict: str, sampling: bool, enabled: bool = True) -> Gate:
    """The gate for a sweep file's ``search.predict`` (``auto``, ``skip``, ``off``),
    whether its search samples, and ``run --no-predict`` (``enabled`` False)."""
    active = enabled and predict != "off"
    return Gate(active=active, skips=active and (sampling or predict == "skip"))


def skip_evidence(gate: Gate, label: str, predicted: Predicted) -> Evidence | None:
    """The evidence of a skipped trial when it must not be launched (None: launch it);
    ``label`` names its configuration."""
    if not (
        gate.skips
        and certain_oom(
            predicted.verdict, predicted.per_gpu_bytes, predicted.capacity, predicted.margin
        )
    ):
        return None
    message = (
        f"{label} is predicted not to fit: {predicted.reason}; "
        f"{predicted.per_gpu_bytes / GiB:.1f} GiB per device against "
        f"{predicted.capacity / GiB:.1f} GiB (margin {predicted.margin / GiB:.2f} GiB); "
        "not launched (run --no-predict to launch it anyway)"
    )
    details: Mapping[str, Any] = {"predicted_memory": predicted.to_json()}
    return Evidence(message=message, reason=PREDICTED_OOM, details=dict(details))
