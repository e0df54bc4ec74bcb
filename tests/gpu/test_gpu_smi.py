"""The NVML backend agrees with nvidia-smi on used memory and holder PIDs (issue 6)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from tests.gpu.gpu_helpers import (
    MiB,
    ProcessKeeper,
    record_summary,
    require_gpus,
    results_dir,
    start_holder,
)

from servesweep.servers.gpu.nvml import NvmlProbe


def _smi(*query: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def _reserved_mib(count: int) -> list[int]:
    """Memory the driver reserves on each GPU (NVML v2 memory info), in MiB."""
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            out.append(int(info.reserved) // MiB)
        return out
    finally:
        pynvml.nvmlShutdown()


def test_nvml_agrees_with_nvidia_smi(keeper: ProcessKeeper, tmp_path: Path) -> None:
    gpus = require_gpus(1)
    if shutil.which("nvidia-smi") is None:
        raise AssertionError("NVML sees GPUs but nvidia-smi is not on PATH")
    out = results_dir("smi", tmp_path)
    # a known holder on every GPU, with a different amount on each
    amounts = [4.0 + 2 * g for g in gpus]
    holder = start_holder(keeper, out / "holder.log", devices=gpus, gib=amounts)
    time.sleep(0.5)
    probe = NvmlProbe()
    try:
        before = probe.snapshot()
        smi_mem = _smi("--query-gpu=index,uuid,memory.used,memory.total")
        smi_apps = _smi("--query-compute-apps=gpu_uuid,pid,used_memory")
        after = probe.snapshot()
    finally:
        probe.close()
    uuid_index = {row[1]: int(row[0]) for row in smi_mem}
    reserved_mib = _reserved_mib(len(smi_mem))
    rows = []
    for row in smi_mem:
        index, used_mib, total_mib = int(row[0]), int(row[2]), int(row[3])
        lo = min(before[index].used_bytes, after[index].used_bytes) // MiB
        hi = max(before[index].used_bytes, after[index].used_bytes) // MiB
        reserved = reserved_mib[index]
        rows.append(
            {
                "gpu": index,
                "smi_used_mib": used_mib,
                "nvml_used_mib": [lo, hi],
                "driver_reserved_mib": reserved,
            }
        )
        # nvidia-smi's "used" leaves out the driver's reserved memory; the backend reads
        # NVML's v2 memory info, which does too: they must agree (the reserved amount
        # is recorded, as the offset an older v1 reading would show).
        exact = lo - 2 <= used_mib <= hi + 2
        plus_reserved = lo - 2 <= used_mib + reserved <= hi + 2
        rows[-1]["agreement"] = "exact" if exact else "plus_reserved" if plus_reserved else "none"
        assert exact, rows[-1]
        assert abs(before[index].total_bytes // MiB - total_mib) <= 2
    smi_holders: dict[int, dict[int, int]] = {}
    for gpu_uuid, pid_text, used_text in smi_apps:
        smi_holders.setdefault(uuid_index[gpu_uuid], {})[int(pid_text)] = int(used_text)
    for state in after:
        nvml = {h.pid: h.used_bytes // MiB for h in state.holders}
        smi = smi_holders.get(state.index, {})
        assert set(nvml) == set(smi), (state.index, nvml, smi)
        for pid, used in smi.items():
            assert abs(nvml[pid] - used) <= 2, (state.index, pid, nvml[pid], used)
        assert holder.pid in nvml, f"the holder pid {holder.pid} is not listed on GPU {state.index}"
        held = nvml[holder.pid] / 1024
        assert held >= amounts[state.index], (held, amounts[state.index])
    record_summary(
        "smi",
        {
            "gpus": rows,
            "holders_smi": smi_holders,
            "holder_pid": holder.pid,
            "holder_gib": amounts,
        },
    )
