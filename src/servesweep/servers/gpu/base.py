"""The GPU probe interface: one question, two backends (NVML and the fake GPUs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from servesweep.models import GpuState

__all__ = ["GpuProbe"]


@runtime_checkable
class GpuProbe(Protocol):
    """What servesweep asks of GPUs. Implementations translate their library's
    errors into :class:`servesweep.errors.GpuProbeError`."""

    name: str
    """``nvml``, ``fake`` or ``none``."""

    def snapshot(self, gpus: Sequence[int] | None = None) -> list[GpuState]:
        """Per-GPU total/used memory, holder PIDs with their memory, utilisation,
        power; all GPUs when ``gpus`` is None. Cheap enough to poll every 10 ms."""
        ...

    def describe(self) -> dict[str, str]:
        """Environment facts for the store: driver version, GPU names, backend."""
        ...

    def close(self) -> None: ...
