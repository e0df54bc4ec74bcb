"""The GPU probe conformance suite on real NVIDIA GPUs (skipped without one)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from servesweep.errors import GpuProbeError, NoGpuDriverError
from servesweep.servers.gpu import conformance as suite
from servesweep.servers.gpu import open_probe
from servesweep.servers.gpu.nvml import NvmlProbe

MiB = 2**20


@pytest.fixture
def probe() -> Iterator[NvmlProbe]:
    p = NvmlProbe()
    try:
        if not p.snapshot():
            pytest.skip("NVML answers but sees no GPU")
    except NoGpuDriverError as exc:
        pytest.skip(f"no NVIDIA GPU here: {exc}")
    try:
        yield p
    finally:
        p.close()


def test_nvml_snapshot(probe: NvmlProbe) -> None:
    states = suite.check_snapshot(probe)
    assert all(s.utilization_pct is not None for s in states)


def test_nvml_subset_invalid_describe(probe: NvmlProbe) -> None:
    suite.check_subset(probe)
    suite.check_invalid_index(probe)
    suite.check_describe(probe)


def test_nvml_poll_cost(probe: NvmlProbe) -> None:
    mean_ms = suite.check_poll_cost(probe, max_ms=10.0)
    print(f"NVML snapshot of all GPUs: {mean_ms:.3f} ms")


def test_nvml_holder_listed_then_released(probe: NvmlProbe) -> None:
    suite.check_holder_lifecycle(probe, suite.cuda_holder(0, 512 * MiB), settle_s=20.0)


def test_nvml_auto_picks_nvml(monkeypatch: pytest.MonkeyPatch, probe: NvmlProbe) -> None:
    monkeypatch.delenv("SERVESWEEP_FAKE_GPUS", raising=False)
    auto = open_probe("auto")
    try:
        assert auto.name == "nvml"
    finally:
        auto.close()


def test_nvml_error_is_translated(probe: NvmlProbe) -> None:
    with pytest.raises(GpuProbeError):
        probe.snapshot([10_000])
