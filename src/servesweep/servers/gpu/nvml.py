"""GPU probe backend over NVML (nvidia-ml-py): the real GPUs.

NVML is initialised lazily on first use; a missing driver or library raises
:class:`NoGpuDriverError`, any other NVML failure :class:`GpuProbeError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psutil

from servesweep.errors import GpuProbeError, NoGpuDriverError
from servesweep.models import GpuHolder, GpuState

__all__ = ["NvmlProbe"]

T = TypeVar("T")


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise NoGpuDriverError(
            "the nvidia-ml-py package is not installed: pip install nvidia-ml-py"
        ) from exc
    return pynvml


class NvmlProbe:
    """Per-GPU memory, holders (compute and graphics processes), utilisation, power."""

    name = "nvml"

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._count = 0
        self._memory_v2: bool | None = None

    # -- NVML calls, translated -------------------------------------------------

    def _init(self) -> Any:
        if self._nvml is not None:
            return self._nvml
        nvml = _pynvml()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            no_driver = (
                nvml.NVML_ERROR_LIBRARY_NOT_FOUND,
                nvml.NVML_ERROR_DRIVER_NOT_LOADED,
                nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            )
            if getattr(exc, "value", None) in no_driver:
                raise NoGpuDriverError(
                    f"no NVIDIA driver on this machine (NVML: {exc}); on a machine without "
                    "GPUs use the fake GPUs (SERVESWEEP_FAKE_GPUS / gpu_backend: fake) "
                    "or gpu_backend: none"
                ) from exc
            raise GpuProbeError(f"NVML failed to initialise: {exc}") from exc
        self._nvml = nvml
        try:
            self._count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise GpuProbeError(f"NVML cannot count the GPUs: {exc}") from exc
        return nvml

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise GpuProbeError(f"NVML {what} failed: {exc}") from exc

    def _optional(self, fn: Callable[..., T], *args: Any) -> T | None:
        """A value some GPUs do not report (utilisation, power): None then."""
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            if not 0 <= index < self._count:
                raise GpuProbeError(
                    f"no GPU {index}: NVML sees {self._count} GPU(s) (0..{self._count - 1})"
                )
            handle = self._call(
                f"get handle of GPU {index}", self._nvml.nvmlDeviceGetHandleByIndex, index
            )
            self._handles[index] = handle
        return handle

    # -- GpuProbe -------------------------------------------------------------

    def snapshot(self, gpus: Sequence[int] | None = None) -> list[GpuState]:
        nvml = self._init()
        wanted = range(self._count) if gpus is None else gpus
        return [self._state(nvml, index) for index in wanted]

    def _memory(self, nvml: Any, handle: Any, index: int) -> Any:
        """Memory info as nvidia-smi reports it: the v2 query leaves the driver's
        reserved memory out of ``used`` (v1 counts it, ~600 MiB high on an H200).
        Drivers without v2 get v1, decided once."""
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None and self._memory_v2 is not False:
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except (nvml.NVMLError, TypeError):
                self._memory_v2 = False
            else:
                self._memory_v2 = True
                return mem
        return self._call(f"memory info of GPU {index}", nvml.nvmlDeviceGetMemoryInfo, handle)

    def _state(self, nvml: Any, index: int) -> GpuState:
        h = self._handle(index)
        mem = self._memory(nvml, h, index)
        used: dict[int, int] = {}
        for getter in (
            nvml.nvmlDeviceGetComputeRunningProcesses,
            nvml.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            for proc in self._optional(getter, h) or []:
                amount = proc.usedGpuMemory
                amount = int(amount) if isinstance(amount, int) and amount >= 0 else 0
                used[int(proc.pid)] = max(used.get(int(proc.pid), 0), amount)
        util = self._optional(nvml.nvmlDeviceGetUtilizationRates, h)
        power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, h)
        return GpuState(
            index=index,
            name=_text(self._call(f"name of GPU {index}", nvml.nvmlDeviceGetName, h)),
            total_bytes=int(mem.total),
            used_bytes=int(mem.used),
            holders=tuple(_holder(pid, amount) for pid, amount in sorted(used.items())),
            utilization_pct=None if util is None else float(util.gpu),
            power_w=None if power_mw is None else power_mw / 1000.0,
        )

    def describe(self) -> dict[str, str]:
        nvml = self._init()
        names = [
            _text(self._call("GPU name", nvml.nvmlDeviceGetName, self._handle(i)))
            for i in range(self._count)
        ]
        facts = {
            "backend": self.name,
            "driver_version": _text(self._call("driver version", nvml.nvmlSystemGetDriverVersion)),
            "gpu_count": str(self._count),
            "gpu_names": ", ".join(sorted(set(names))),
        }
        cuda = self._optional(nvml.nvmlSystemGetCudaDriverVersion)
        if isinstance(cuda, int):
            facts["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        return facts

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()
            self._nvml = None
            self._handles.clear()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _holder(pid: int, used_bytes: int) -> GpuHolder:
    name = cmdline = ""
    try:
        proc = psutil.Process(pid)
        name = proc.name()
        cmdline = " ".join(proc.cmdline())
    except (psutil.Error, OSError):
        pass  # another PID namespace (containers), or it just exited
    return GpuHolder(pid=pid, used_bytes=used_bytes, name=name, cmdline=cmdline)
