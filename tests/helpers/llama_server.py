"""llama.cpp's own ``llama-server`` for the tests: the cached build, a sweep file for
the ``llama-server`` preset, and a poller that records what ``/health`` answered.

The binary comes from ``dev/install-llama-server.sh`` (``dev/setup.sh --test`` builds
it once per machine), or from ``$LLAMA_SERVER_BIN``; without either the tests that
need it are skipped with the command that builds it.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "dev" / "install-llama-server.sh"


def cached_llama_server() -> str:
    """``$LLAMA_SERVER_BIN`` when set, else the cached build, else skip (never builds
    inside a test)."""
    given = os.environ.get("LLAMA_SERVER_BIN")
    if given:
        if not Path(given).is_file():
            pytest.fail(f"LLAMA_SERVER_BIN={given} is not a file")
        return given
    done = subprocess.run(
        [str(INSTALL), "--cached"], capture_output=True, text=True, timeout=60, check=False
    )
    path = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not Path(path).is_file():
        pytest.skip(f"llama-server is not built here (run {INSTALL.relative_to(REPO)})")
    return path


def llama_server_sweep(
    path: Path,
    *,
    name: str,
    binary: str,
    model: Path | str,
    port: int,
    points: Sequence[Mapping[str, Any]],
    server_extra: Mapping[str, Any] | None = None,
    workloads: Sequence[Mapping[str, Any]] | None = None,
) -> Path:
    """A sweep file of the ``llama-server`` preset on the CPU over explicit points."""
    spec: dict[str, Any] = {
        "name": name,
        "store": str(path.parent / f"{name}.db"),
        "server": {
            "engine": "llama-server",
            "executable": [binary],
            "model": str(model),
            "port": port,
            "gpu_backend": "none",
            "args": {"threads": 2, "n-gpu-layers": 0, "alias": "tiny"},
            "timeouts": {"stop": "10s", "ready": "120s", "request": "60s"},
            "log_dir": str(path.parent / f"{name}-runs"),
            **(server_extra or {}),
        },
        "params": {"points": [dict(p) for p in points]},
        "workloads": list(
            workloads
            or [
                {
                    "name": "chat",
                    "endpoint": "chat",
                    "dataset": "builtin:chat",
                    "concurrency": [1, 2],
                    "requests": 4,
                    "max_tokens": 16,
                },
                {
                    "name": "completions",
                    "endpoint": "completions",
                    "dataset": "synthetic",
                    "input_tokens": 32,
                    "concurrency": [1],
                    "requests": 4,
                    "max_tokens": 16,
                    "ignore_eos": True,
                },
            ]
        ),
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


class HealthPoller:
    """A thread that asks ``GET /health`` every ``every`` seconds and records each
    ``(time, status)`` it gets (connection failures are not recorded)."""

    def __init__(self, port: int, every: float = 0.02, limit_s: float = 600.0) -> None:
        self.port = port
        self.every = every
        self.limit_s = limit_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            try:
                conn.request("GET", "/health")
                status = conn.getresponse().status
                self.samples.append((time.time(), status))
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()
            self._stop.wait(self.every)

    def between(self, t0: float, t1: float) -> list[int]:
        return [status for t, status in self.samples if t0 <= t <= t1]
