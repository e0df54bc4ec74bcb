"""How the GPUs of a machine are linked, for placing multi-GPU trials.

``link_distances(probe, gpus)`` gives a distance for each pair of GPUs: 0 when they
are connected by NVLink, else 1 + NVML's common-ancestor level of their PCIe path
(``NVML_TOPOLOGY_INTERNAL`` 0 … ``SYSTEM`` 50): the same PCIe switch is closer than
the host bridge, which is closer than another CPU socket. None when the backend
cannot tell (no NVML topology, the ``none`` backend).

The fake GPUs declare a topology in ``<dir>/topology.json`` (docs/fake-gpus.md):
``{"nvlink": [[0, 1, 2, 3], [4, 5, 6, 7]]}`` — GPUs of one group are NVLink-connected,
the others are as far apart as two CPU sockets.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from servesweep.servers.gpu.base import GpuProbe

__all__ = ["link_distances"]

_SYSTEM = 51
"""The distance of two GPUs behind different CPU sockets (1 + NVML_TOPOLOGY_SYSTEM)."""


def link_distances(probe: GpuProbe, gpus: Sequence[int]) -> dict[tuple[int, int], int] | None:
    """Pairwise link distances of ``gpus`` (see the module doc), or None."""
    if len(gpus) < 2:
        return None
    if probe.name == "nvml":
        return _nvml(probe, gpus)
    if probe.name == "fake":
        return _fake(probe, gpus)
    return None


def _nvml(probe: Any, gpus: Sequence[int]) -> dict[tuple[int, int], int] | None:
    try:
        nvml = probe._init()
        handles = {g: probe._handle(g) for g in gpus}
    except Exception:
        return None
    nvlink_index = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", None)
    status_ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
    out: dict[tuple[int, int], int] = {}
    for a, b in itertools.combinations(gpus, 2):
        try:
            if nvlink_index is not None and (
                nvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], nvlink_index) == status_ok
            ):
                out[(a, b)] = 0
                continue
            level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
            out[(a, b)] = 1 + int(level)
        except Exception:
            return None
    return out


def _fake(probe: Any, gpus: Sequence[int]) -> dict[tuple[int, int], int] | None:
    folder = getattr(getattr(probe, "dir", None), "path", None)
    if folder is None:
        return None
    try:
        data = json.loads((Path(folder) / "topology.json").read_text())
        groups = [set(int(g) for g in group) for group in data.get("nvlink", [])]
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    out = {}
    for a, b in itertools.combinations(gpus, 2):
        linked = any(a in group and b in group for group in groups)
        out[(a, b)] = 0 if linked else _SYSTEM
    return out
