"""open_probe's choice of backend, the fake probe, and NVML error translation."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from servesweep.errors import ConfigError, GpuProbeError, NoGpuDriverError
from servesweep.fakegpu import FakeGpuDir
from servesweep.fakegpu.probe import FakeGpuProbe
from servesweep.servers.gpu import NoGpuProbe, open_probe
from servesweep.servers.gpu.base import GpuProbe
from servesweep.servers.gpu.nvml import NvmlProbe

MiB = 2**20


def test_backend_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakeGpuDir.create(tmp_path, 1, 100 * MiB)
    monkeypatch.delenv("SERVESWEEP_FAKE_GPUS", raising=False)
    assert open_probe("none").snapshot() == []
    assert open_probe("fake", str(tmp_path)).name == "fake"
    monkeypatch.setenv("SERVESWEEP_FAKE_GPUS", str(tmp_path))
    assert open_probe().name == "fake"
    with pytest.raises(ConfigError, match="unknown GPU backend 'cuda'"):
        open_probe("cuda")
    monkeypatch.delenv("SERVESWEEP_FAKE_GPUS")
    with pytest.raises(ConfigError, match="SERVESWEEP_FAKE_GPUS"):
        open_probe("fake")
    with pytest.raises(GpuProbeError, match="servesweep fake-gpus init"):
        open_probe("fake", str(tmp_path / "missing"))
    assert isinstance(NoGpuProbe(), GpuProbe)


def test_fake_probe_lists_this_process(tmp_path: Path) -> None:
    gpus = FakeGpuDir.create(tmp_path, 2, 100 * MiB)
    holder = gpus.allocate({1: 40 * MiB})
    probe = FakeGpuProbe(tmp_path)
    s0, s1 = probe.snapshot()
    assert s0.holders == () and s0.used_bytes == 0
    (h,) = s1.holders
    assert h.pid == os.getpid() and h.used_bytes == 40 * MiB and h.name
    assert probe.snapshot([1])[0].used_bytes == 40 * MiB
    with pytest.raises(GpuProbeError, match="no GPU 5"):
        probe.snapshot([5])
    assert probe.describe()["gpu_count"] == "2"
    holder.release(log_truth=False)
    assert probe.snapshot([1])[0].used_bytes == 0


class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(f"NVML error {value}")


def _fake_pynvml(init_error: int | None = None) -> Any:
    m: Any = types.ModuleType("pynvml")
    m.NVMLError = _NVMLError
    m.NVML_ERROR_LIBRARY_NOT_FOUND = 12
    m.NVML_ERROR_DRIVER_NOT_LOADED = 9
    m.NVML_ERROR_FUNCTION_NOT_FOUND = 13

    def init() -> None:
        if init_error is not None:
            raise _NVMLError(init_error)

    def processes(handle: int) -> list[Any]:
        return [
            types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=5 * MiB),
            types.SimpleNamespace(pid=1, usedGpuMemory=None),
        ]

    def graphics(handle: int) -> list[Any]:
        raise _NVMLError(3)  # not supported

    def power(handle: int) -> int:
        raise _NVMLError(3)

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * MiB, used=6 * MiB)
    m.nvmlDeviceGetComputeRunningProcesses = processes
    m.nvmlDeviceGetGraphicsRunningProcesses = graphics
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=42, memory=1)
    m.nvmlDeviceGetPowerUsage = power
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    m.nvmlSystemGetDriverVersion = lambda: "570.1"
    m.nvmlSystemGetCudaDriverVersion = lambda: 12080
    return m


def test_nvml_snapshot_translates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    probe = NvmlProbe()
    s0, s1 = probe.snapshot()
    assert s1.index == 1 and s1.name == "NVIDIA H200" and s1.utilization_pct == 42.0
    assert s1.power_w is None  # not supported: None, not an error
    assert [(h.pid, h.used_bytes) for h in s0.holders] == [(1, 0), (os.getpid(), 5 * MiB)]
    with pytest.raises(GpuProbeError, match="no GPU 2"):
        probe.snapshot([2])
    facts = probe.describe()
    assert facts["driver_version"] == "570.1" and facts["cuda_driver_version"] == "12.8"
    probe.close()


@pytest.mark.parametrize(("code", "error"), [(12, NoGpuDriverError), (9, NoGpuDriverError)])
def test_nvml_no_driver(monkeypatch: pytest.MonkeyPatch, code: int, error: type) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_error=code))
    with pytest.raises(error, match="no NVIDIA driver"):
        NvmlProbe().snapshot()
    monkeypatch.delenv("SERVESWEEP_FAKE_GPUS", raising=False)
    assert open_probe("auto").name == "none"


def test_named_gpus_must_be_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Naming GPUs that no backend sees is an error, never a silent "no GPUs"."""
    monkeypatch.delenv("SERVESWEEP_FAKE_GPUS", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_error=12))
    with pytest.raises(NoGpuDriverError) as caught:
        open_probe("auto", gpus=[0, 1, 2, 3, 6])
    text = str(caught.value)
    assert text.startswith("GPUs 0-3,6 are named, but no GPU backend can see them: ")
    assert "no NVIDIA driver" in text and "gpu_backend: none" in text and "\n" not in text
    with pytest.raises(NoGpuDriverError, match="GPUs 0 are named, but the nvml backend"):
        open_probe("nvml", gpus=[0])
    assert open_probe("auto").name == "none"  # no GPUs named: no GPU checks wanted
    assert open_probe("none", gpus=[0, 1]).name == "none"  # said explicitly
    FakeGpuDir.create(tmp_path, 2, 100 * MiB)
    assert open_probe("auto", str(tmp_path), gpus=[0, 1]).name == "fake"
    with pytest.raises(
        GpuProbeError, match=r"GPUs 1,2 are named, but the fake backend: .*no GPU 2"
    ):
        open_probe("fake", str(tmp_path), gpus=[1, 2])


def test_nvml_other_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_error=999))
    with pytest.raises(GpuProbeError, match="NVML failed to initialise") as exc:
        NvmlProbe().snapshot()
    assert not isinstance(exc.value, NoGpuDriverError)


@pytest.mark.parametrize("v2_works", [True, False])
def test_nvml_reads_memory_like_nvidia_smi(monkeypatch: pytest.MonkeyPatch, v2_works: bool) -> None:
    """The v2 memory query leaves the driver's reserved memory out of ``used``, as
    nvidia-smi does; a driver without it gets the v1 answer, asked once."""
    m = _fake_pynvml()
    m.nvmlMemory_v2 = 0x02000028
    calls: list[str] = []

    def memory(handle: int, version: int | None = None) -> Any:
        if version is None:
            calls.append("v1")
            return types.SimpleNamespace(total=80 * MiB, used=6 * MiB)
        calls.append("v2")
        if not v2_works:
            raise _NVMLError(13)  # function not found
        return types.SimpleNamespace(total=80 * MiB, used=4 * MiB, reserved=2 * MiB)

    m.nvmlDeviceGetMemoryInfo = memory
    monkeypatch.setitem(sys.modules, "pynvml", m)
    probe = NvmlProbe()
    (state,) = probe.snapshot([0])
    probe.snapshot([0])
    assert state.used_bytes == (4 if v2_works else 6) * MiB
    assert calls == (["v2", "v2"] if v2_works else ["v2", "v1", "v1"])
    probe.close()
