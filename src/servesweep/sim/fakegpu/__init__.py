"""Fake GPUs on disk: N GPUs with a capacity, holders by PID, a release delay.

The protocol itself is :mod:`servesweep.fakegpu` (documented in docs/fake-gpus.md so
an external test server can take part); the simulator uses it through these names.
Command line: ``python -m servesweep.sim.fakegpu init|show|hold``.
"""

from __future__ import annotations

from servesweep.fakegpu import (
    HEARTBEAT_S,
    FakeGpu,
    FakeGpuDir,
    FakeGpuError,
    FakeOutOfMemory,
    GpuUsage,
    Holder,
    Holding,
    append_truth,
)

__all__ = [
    "HEARTBEAT_S",
    "FakeGpu",
    "FakeGpuDir",
    "FakeGpuError",
    "FakeOutOfMemory",
    "GpuUsage",
    "Holder",
    "Holding",
    "append_truth",
]
