"""Fake GPUs, all in this package (docs/fake-gpus.md): the on-disk protocol (N GPUs
with a capacity, holders by PID, memory that comes back a release delay after a
holder's exit), the probe that reads it like NVML, and the command line.

Two sides share the protocol: the simulated engine allocates and holds memory
(:mod:`servesweep.sim`), the fake GPU probe reads it (:mod:`servesweep.fakegpu.probe`,
what ``servers.gpu`` opens for the ``fake`` backend). The package sits at the bottom
of the layers, beside ``models``: the protocol (these names, ``store``, ``procinfo``,
``units``) imports nothing else from servesweep, so the simulator depends on nothing
above; ``probe`` uses ``models`` and ``errors`` only, and the command line
(``servesweep fake-gpus``, ``python -m servesweep.fakegpu``) ``helpstyle``.
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
