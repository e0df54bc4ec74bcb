"""GPU probes: NVML (real GPUs), the fake GPUs (tests, simulation) or none.

``open_probe("auto")`` picks the fake GPUs when a directory is given or
``SERVESWEEP_FAKE_GPUS`` is set, else NVML when a driver answers, else the
``none`` probe (no GPUs, ``snapshot()`` returns ``[]``). Given the GPUs a caller
means to watch (``gpus=``), it makes sure the probe sees each of them: falling back
to ``none`` is then an error (``NoGpuDriverError``) unless the backend asked for is
``none`` itself — the user's way to say "no GPU checks".
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from servesweep.errors import ConfigError, GpuProbeError, NoGpuDriverError
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


def open_probe(
    backend: str = "auto", fake_dir: str | None = None, *, gpus: Sequence[int] | None = None
) -> GpuProbe:
    """The GPU probe for ``backend`` (``auto``, ``nvml``, ``fake``, ``none``).

    Raises :class:`ConfigError` for an unknown backend or a fake backend without a
    directory, :class:`GpuProbeError` when the fake directory is invalid or a GPU of
    ``gpus`` does not exist, and :class:`NoGpuDriverError` for ``nvml`` without a
    driver, or when ``gpus`` are named and no backend can see them.
    """
    if backend not in BACKENDS:
        raise ConfigError(
            f"unknown GPU backend {backend!r}: use one of {', '.join(BACKENDS)}",
            key="gpu_backend",
        )
    fake = fake_dir or os.environ.get(FAKE_GPUS_ENV) or None
    probe, why_none = _open(backend, fake)
    if gpus:
        try:
            _require_visible(probe, list(gpus), why_none)
        except GpuProbeError:
            probe.close()
            raise
    return probe


def _open(backend: str, fake: str | None) -> tuple[GpuProbe, str]:
    """The probe, and why it is ``none`` when it is."""
    if backend == "none":
        return NoGpuProbe(), ""
    if backend == "fake" or (backend == "auto" and fake):
        if not fake:
            raise ConfigError(
                f"the fake GPU backend needs a directory: set {FAKE_GPUS_ENV} or "
                "fake_gpu_dir (create one with `servesweep sim`'s "
                "`python -m servesweep.fakegpu init DIR --count N --memory SIZE`)",
                key="fake_gpu_dir",
            )
        from servesweep.fakegpu.probe import FakeGpuProbe

        return FakeGpuProbe(fake), ""
    from servesweep.servers.gpu.nvml import NvmlProbe

    probe = NvmlProbe()
    if backend == "nvml":
        return probe, ""
    try:
        probe.snapshot([])  # initialises NVML: does a driver answer?
    except NoGpuDriverError as exc:
        probe.close()
        return NoGpuProbe(), str(exc)
    return probe, ""


def _require_visible(probe: GpuProbe, gpus: list[int], why_none: str) -> None:
    named = _gpu_list(gpus)
    if probe.name == "none":
        if not why_none:
            return  # gpu_backend none: the user wants no GPU checks
        why = why_none.split(";")[0].rstrip(". ")
        raise NoGpuDriverError(
            f"GPUs {named} are named, but no GPU backend can see them: {why}, and no fake "
            f"GPUs are set ({FAKE_GPUS_ENV} / fake_gpu_dir); set gpu_backend: none to run "
            "without GPU checks"
        )
    try:
        probe.snapshot(gpus)
    except GpuProbeError as exc:
        raise type(exc)(f"GPUs {named} are named, but the {probe.name} backend: {exc}") from exc


def _gpu_list(gpus: Sequence[int]) -> str:
    """``0-3,6`` for ``[0, 1, 2, 3, 6]``."""
    runs: list[list[int]] = []
    for gpu in sorted(set(gpus)):
        if runs and gpu == runs[-1][-1] + 1:
            runs[-1].append(gpu)
        else:
            runs.append([gpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs)
