"""GPU probes: NVML (real GPUs), the fake GPUs (tests, simulation) or none.

``open_probe("auto")`` picks the fake GPUs when a directory is given or
``SERVESWEEP_FAKE_GPUS`` is set, else NVML when a driver answers, else the
``none`` probe (no GPUs, ``snapshot()`` returns ``[]``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from servesweep.errors import ConfigError, NoGpuDriverError
from servesweep.models import GpuState
from servesweep.servers.gpu.base import GpuProbe

__all__ = ["BACKENDS", "FAKE_GPUS_ENV", "GpuProbe", "NoGpuProbe", "open_probe"]

FAKE_GPUS_ENV = "SERVESWEEP_FAKE_GPUS"
BACKENDS = ("auto", "nvml", "fake", "none")


class NoGpuProbe:
    """No GPUs to watch (CPU-only servers, llama.cpp on CPU)."""

    name = "none"

    def snapshot(self, gpus: Sequence[int] | None = None) -> list[GpuState]:
        return []

    def describe(self) -> dict[str, str]:
        return {"backend": self.name}

    def close(self) -> None:
        return None


def open_probe(backend: str = "auto", fake_dir: str | None = None) -> GpuProbe:
    """The GPU probe for ``backend`` (``auto``, ``nvml``, ``fake``, ``none``).

    Raises :class:`ConfigError` for an unknown backend or a fake backend without a
    directory, :class:`GpuProbeError` when the fake directory is invalid, and
    :class:`NoGpuDriverError` for ``nvml`` without a driver.
    """
    if backend not in BACKENDS:
        raise ConfigError(
            f"unknown GPU backend {backend!r}: use one of {', '.join(BACKENDS)}",
            key="gpu_backend",
        )
    fake = fake_dir or os.environ.get(FAKE_GPUS_ENV) or None
    if backend == "none":
        return NoGpuProbe()
    if backend == "fake" or (backend == "auto" and fake):
        if not fake:
            raise ConfigError(
                f"the fake GPU backend needs a directory: set {FAKE_GPUS_ENV} or "
                "fake_gpu_dir (create one with "
                "`servesweep fake-gpus init DIR --count N --memory SIZE`)",
                key="fake_gpu_dir",
            )
        from servesweep.servers.gpu.fake import FakeGpuProbe

        return FakeGpuProbe(fake)
    from servesweep.servers.gpu.nvml import NvmlProbe

    probe = NvmlProbe()
    if backend == "nvml":
        return probe
    try:
        probe.snapshot([])  # initialises NVML: does a driver answer?
    except NoGpuDriverError:
        return NoGpuProbe()
    return probe
