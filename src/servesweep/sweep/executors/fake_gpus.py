"""The fake GPUs the sweep file names for the machine that runs it (a cluster's nodes
may name their own): shared by the sites (``site``, ``local``, ``ray/``), so it imports
none of them."""

from __future__ import annotations

import os
from pathlib import Path

from servesweep.servers.gpu import FAKE_GPUS_ENV
from servesweep.spec.load import LoadedSweep

__all__ = ["fake_gpu_dir"]


def fake_gpu_dir(loaded: LoadedSweep) -> str | None:
    """The fake GPU directory (absolute), created from ``server.fake_gpus`` if missing:
    the sweep file's ``fake_gpu_dir`` (relative to the sweep file), else
    ``SERVESWEEP_FAKE_GPUS`` (relative to the current directory)."""
    server = loaded.spec.server
    if server.fake_gpu_dir:
        path = loaded.resolve(server.fake_gpu_dir)
    elif os.environ.get(FAKE_GPUS_ENV):
        path = Path(os.environ[FAKE_GPUS_ENV]).expanduser().absolute()
    else:
        return None
    if server.fake_gpus is not None and not path.exists():
        from servesweep.fakegpu import FakeGpuDir, FakeGpuError

        try:
            FakeGpuDir.create(
                path, server.fake_gpus.count, server.fake_gpus.memory, name=server.fake_gpus.name
            )
        except (OSError, FakeGpuError) as exc:
            raise loaded.error(
                f"cannot create fake GPUs in {path}: {exc}", "server.fake_gpus"
            ) from exc
    return str(path.resolve())
