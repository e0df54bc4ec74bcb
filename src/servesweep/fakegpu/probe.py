"""GPU probe backend over the simulated engine's fake GPUs (docs/fake-gpus.md).

Like NVML, a process that exited is no longer listed as a holder, but its memory
stays in ``used_bytes`` until the fake driver's release delay has passed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from servesweep.errors import GpuProbeError
from servesweep.fakegpu import FakeGpuDir, FakeGpuError
from servesweep.fakegpu.procinfo import proc_cmdline, proc_name
from servesweep.models import GpuHolder, GpuState

__all__ = ["FakeGpuProbe"]


class FakeGpuProbe:
    """Reads a fake GPU directory; a snapshot costs a few small file reads."""

    name = "fake"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.dir = FakeGpuDir(path)
        self._names: dict[tuple[int, int | None], tuple[str, str]] = {}
        try:
            self.dir.gpus()
        except FakeGpuError as exc:
            raise GpuProbeError(f"fake GPUs: {exc}") from exc

    def _identity(self, pid: int, start_time: int | None) -> tuple[str, str]:
        key = (pid, start_time)
        found = self._names.get(key)
        if found is None:
            found = (proc_name(pid), proc_cmdline(pid))
            if len(self._names) > 4096:
                self._names.clear()
            self._names[key] = found
        return found

    def snapshot(self, gpus: Sequence[int] | None = None) -> list[GpuState]:
        now = time.time()
        try:
            holdings = self.dir.holdings()
            usage = self.dir.usage(now, holdings)
            if any(not h.holds_at(now) for h in holdings):
                # Released holdings: remove their files (and write their truth lines).
                self.dir.collect()
        except (FakeGpuError, OSError) as exc:
            raise GpuProbeError(f"fake GPUs in {self.dir.path}: {exc}") from exc
        by_index = {u.gpu.index: u for u in usage}
        wanted = sorted(by_index) if gpus is None else list(gpus)
        missing = [i for i in wanted if i not in by_index]
        if missing:
            raise GpuProbeError(
                f"fake GPUs in {self.dir.path} have no GPU {missing[0]} "
                f"(GPUs: {sorted(by_index)}); check the trial's GPU list"
            )
        states = []
        for index in wanted:
            u = by_index[index]
            holders = []
            for h in u.holders:
                name, cmdline = self._identity(h.pid, h.start_time)
                holders.append(
                    GpuHolder(
                        pid=h.pid,
                        used_bytes=h.memory.get(index, 0),
                        name=name or h.name,
                        cmdline=cmdline,
                    )
                )
            states.append(
                GpuState(
                    index=index,
                    name=u.gpu.name,
                    total_bytes=u.gpu.total_bytes,
                    used_bytes=u.used_bytes,
                    holders=tuple(holders),
                    utilization_pct=u.utilization_pct,
                    power_w=round(u.power_w, 1),
                )
            )
        return states

    def describe(self) -> dict[str, str]:
        try:
            gpus = self.dir.gpus()
        except FakeGpuError as exc:
            raise GpuProbeError(f"fake GPUs: {exc}") from exc
        return {
            "backend": self.name,
            "fake_dir": os.path.abspath(self.dir.path),
            "driver_version": "fake",
            "gpu_count": str(len(gpus)),
            "gpu_names": ", ".join(sorted({g.name for g in gpus})),
        }

    def close(self) -> None:
        self._names.clear()
