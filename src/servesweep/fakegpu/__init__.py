"""The fake GPUs' on-disk protocol (docs/fake-gpus.md): N GPUs with a capacity,
holders by PID, memory that comes back a release delay after a holder's exit.

Two sides share it: the simulated engine allocates and holds memory
(:mod:`servesweep.sim`), the fake GPU probe reads it like NVML
(:mod:`servesweep.servers.gpu.fake`). It sits at the bottom of the layers, beside
``models``: it imports nothing else from servesweep, so neither side depends on the
other. The command line (``servesweep fake-gpus``) lives with the simulator.
"""

from __future__ import annotations

from servesweep.fakegpu.store import (
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
