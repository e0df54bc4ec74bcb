"""The memory limit is the kernel's: memory that no process maps (memfd files, a
tmpfs in a namespace of the program's own) counts against the run's memory
cgroup, the run ends as ``resource_limit`` within its timeout, and the host's
available memory never drops by much more than the limit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servesweep.bench.evals import Sandbox, SandboxLimits, leftovers
from servesweep.bench.evals.cgroups import find_hierarchies
from servesweep.errors import SandboxError

HOSTILE = Path(__file__).parent / "hostile"
CHECK = "def check(candidate):\n    assert candidate() == 'escaped'\n"
LIMIT = 1 << 30
"""The run's limit; each program tries to hold about 4 GiB."""
MARGIN = 1 << 30
"""The run's sandboxes and interpreters, and what other tests on the machine do."""
TIMEOUT_S = 60.0


def _available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


class LowestAvailable:
    """Samples MemAvailable every 20 ms while it is entered."""

    def __init__(self) -> None:
        self.before = _available()
        self.lowest = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.lowest = min(self.lowest, _available())

    def __enter__(self) -> LowestAvailable:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.lowest = min(self.lowest, _available())

    @property
    def drop(self) -> int:
        return self.before - self.lowest


def _sandbox(backend: str) -> Iterator[Sandbox]:
    if backend != "bwrap" and os.geteuid() != 0:
        pytest.skip(f"the {backend} backend needs root")
    if backend != "none" and shutil.which(backend) is None:
        pytest.skip(f"{backend} is not installed")
    limits = SandboxLimits(timeout_s=TIMEOUT_S, total_memory_bytes=LIMIT)
    box = Sandbox(limits, backend=backend, host_filesystem=backend == "none")  # type: ignore[arg-type]
    try:
        asyncio.run(box.start())
    except SandboxError as exc:
        box.close()
        pytest.skip(f"{backend} cannot make namespaces here: {exc}")
    if box.memory_limit == "watch":
        box.close()
        pytest.skip(f"no memory cgroup here: {box.warnings}")
    yield box
    box.close()


@pytest.fixture(scope="module", params=["bwrap", "unshare", "none"])
def box(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    yield from _sandbox(request.param)


@pytest.mark.parametrize("name", ["memfd_hoard", "tmpfs_namespace"])
def test_memory_outside_processes_ends_the_run_at_the_limit(name: str, box: Sandbox) -> None:
    if name == "tmpfs_namespace" and not box.nested_userns:
        pytest.skip(f"{box.backend} refuses the namespace: test_nested_user_namespaces_are_refused")
    program = (HOSTILE / f"{name}.py").read_text()
    started = time.monotonic()
    with LowestAvailable() as memory:
        result = asyncio.run(box.run(program, CHECK, "attack"))
    elapsed = time.monotonic() - started
    assert result.status == "resource_limit", (result.status, result.message)
    assert elapsed < TIMEOUT_S, f"the run took {elapsed:.1f} s"
    assert memory.drop < LIMIT + MARGIN, f"MemAvailable dropped by {memory.drop >> 20} MiB"


@pytest.mark.parametrize(
    ("backend", "errno", "words"),
    [("bwrap", 28, "No space left"), ("unshare", 1, "Operation not permitted")],
)
def test_nested_user_namespaces_are_refused(backend: str, errno: int, words: str) -> None:
    """The program cannot even make the namespace (so no private tmpfs of any
    size): bwrap's --disable-userns (ENOSPC), the unshare backend's chroot (EPERM).
    The none backend relies on the cgroup alone (above)."""
    program = (
        "import ctypes\n"
        "def attack():\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    return [libc.unshare(0x10000000), ctypes.get_errno()]\n"  # CLONE_NEWUSER
    )
    check = f"def check(candidate):\n    assert candidate() == [-1, {errno}]\n"
    for box in _sandbox(backend):
        if box.nested_userns:
            pytest.skip("bubblewrap here has no --disable-userns (needs >= 0.8)")
        result = asyncio.run(box.run(program, check, "attack"))
        assert result.status == "pass", result.message
        result = asyncio.run(box.run((HOSTILE / "tmpfs_namespace.py").read_text(), CHECK, "attack"))
        assert result.status != "pass" and words in result.message, result.message


def test_the_runs_cgroups_hold_the_limit_and_are_removed(box: Sandbox) -> None:
    """While a run holds memory its cgroup counts it (read from the kernel's own
    files); after the run no cgroup of it is left."""
    hierarchies, _ = find_hierarchies()
    memory_base = next(h.base for h in hierarchies if "memory" in h.controllers)
    mine = leftovers.owner_prefix()
    seen: dict[str, int] = {}

    def watch(stop: threading.Event) -> None:
        while not stop.wait(0.02):
            for path in memory_base.glob(f"{mine}*-candidate"):
                for name in ("memory.limit_in_bytes", "memory.max"):
                    with contextlib.suppress(OSError):
                        seen[name] = int((path / name).read_text())

    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(stop,), daemon=True)
    watcher.start()
    try:
        program = "import time\ntime.sleep(1)\ndef attack():\n    return 'escaped'\n"
        result = asyncio.run(box.run(program, CHECK, "attack"))
    finally:
        stop.set()
        watcher.join()
    assert result.status == "pass", result.message
    assert LIMIT in seen.values(), seen
    assert list(memory_base.glob(f"{mine}*")) == []
