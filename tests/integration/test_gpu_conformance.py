"""The GPU probe conformance suite against both backends.

The fake GPUs always run; NVML's part skips without an NVIDIA driver (the same
suite runs on GPU machines from tests/gpu/test_gpu_nvml_conformance.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servesweep.errors import NoGpuDriverError
from servesweep.fakegpu import FakeGpuDir
from servesweep.servers.gpu import conformance as suite
from servesweep.servers.gpu import open_probe
from servesweep.servers.gpu.base import GpuProbe
from servesweep.servers.gpu.nvml import NvmlProbe

HoldFactory = Callable[[int, int], contextlib.AbstractContextManager[suite.MemoryHolder]]
MiB = 2**20


def _nvml_or_skip() -> NvmlProbe:
    probe = NvmlProbe()
    try:
        if not probe.snapshot():
            pytest.skip("NVML answers but sees no GPU")
    except NoGpuDriverError as exc:
        pytest.skip(f"no NVIDIA GPU here: {exc}")
    return probe


@pytest.fixture(params=["fake", "nvml"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[GpuProbe, HoldFactory]]:
    if request.param == "fake":
        fake_dir = str(tmp_path / "gpus")
        FakeGpuDir.create(fake_dir, 2, 1024 * MiB, reserved_bytes=16 * MiB)
        probe = open_probe("fake", fake_dir)

        def hold(gpu: int, size: int) -> contextlib.AbstractContextManager[suite.MemoryHolder]:
            return suite.fake_holder(fake_dir, gpu, size, release_delay_s=0.5)

    else:
        probe = _nvml_or_skip()

        def hold(gpu: int, size: int) -> contextlib.AbstractContextManager[suite.MemoryHolder]:
            return suite.cuda_holder(gpu, size)

    try:
        yield probe, hold
    finally:
        probe.close()


def test_snapshot_is_well_formed(backend: tuple[GpuProbe, HoldFactory]) -> None:
    probe, _ = backend
    assert suite.check_snapshot(probe)


def test_subset_and_invalid_index(backend: tuple[GpuProbe, HoldFactory]) -> None:
    probe, _ = backend
    suite.check_subset(probe)
    suite.check_invalid_index(probe)


def test_describe(backend: tuple[GpuProbe, HoldFactory]) -> None:
    probe, _ = backend
    suite.check_describe(probe)


def test_poll_is_cheap(backend: tuple[GpuProbe, HoldFactory]) -> None:
    probe, _ = backend
    suite.check_poll_cost(probe, max_ms=10.0)


def test_holder_listed_then_released(backend: tuple[GpuProbe, HoldFactory]) -> None:
    probe, hold = backend
    last = probe.snapshot()[-1].index
    suite.check_holder_lifecycle(probe, hold(last, 256 * MiB))


def test_auto_prefers_fake_dir(tmp_path: Path) -> None:
    fake_dir = str(tmp_path / "gpus")
    FakeGpuDir.create(fake_dir, 1, 64 * MiB)
    assert open_probe("auto", fake_dir).name == "fake"
