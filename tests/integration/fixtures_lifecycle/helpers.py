"""Shared helpers of the lifecycle integration tests: free ports, fake GPUs, and a
tracker that kills every process a test started (by PID and instance tag) and thaws
any freezer cgroup, even when the test failed."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from servesweep.models import InstanceRecord
from servesweep.servers import procs
from servesweep.servers.gpu.base import GpuProbe
from servesweep.servers.launchers.base import Launcher, LaunchRequest

HERE = Path(__file__).parent
FAKE_SERVER = str(HERE / "fake_server.py")
PORT_HOLDER = str(HERE / "port_holder.py")
FREEZER = Path("/sys/fs/cgroup/freezer")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_argv(port: int, *flags: str) -> list[str]:
    return [sys.executable, FAKE_SERVER, "--port", str(port), *flags]


def request(argv: Sequence[str], port: int, log: Path, key: str = "lt-1") -> LaunchRequest:
    return LaunchRequest(
        argv=list(argv),
        env={},
        host="127.0.0.1",
        port=port,
        gpus=(0,),
        log_path=log,
        trial_key=key,
        fingerprint="fp",
    )


def open_fake_probe(fake_dir: Path) -> GpuProbe:
    from servesweep.servers.gpu import open_probe

    return open_probe("fake", str(fake_dir))


def init_fake_gpus(path: Path, count: int = 1, memory: str = "8GiB") -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "servesweep.fakegpu",
            "init",
            str(path),
            "--count",
            str(count),
            "--memory",
            memory,
        ],
        check=True,
        capture_output=True,
    )


class Tracker:
    """Everything a test started; ``cleanup`` kills it all."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[bytes]] = []
        self.instances: list[tuple[Launcher, InstanceRecord]] = []
        self.cgroups: list[Path] = []

    def spawn(self, argv: Sequence[str], log: Path | None = None) -> subprocess.Popen[bytes]:
        if log is None:
            proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL)
        else:
            with open(log, "ab") as out:
                proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT)
        self.popens.append(proc)
        return proc

    def track(self, launcher: Launcher, instance: InstanceRecord) -> InstanceRecord:
        self.instances.append((launcher, instance))
        return instance

    def freezer(self, name: str) -> Path:
        path = FREEZER / f"servesweep-test-{name}-{os.getpid()}"
        path.mkdir()
        self.cgroups.append(path)
        return path

    def cleanup(self) -> None:
        for cg in self.cgroups:
            with contextlib.suppress(OSError):
                (cg / "freezer.state").write_text("THAWED")
        pids: set[int] = set()
        for launcher, inst in self.instances:
            pids |= launcher.pids(inst)
            if inst.invocation_id:
                pids |= set(procs.tagged(inst.invocation_id))
            pids.update(inst.pids)
        for p in self.popens:
            pids.add(p.pid)
        procs.signal_all(pids, signal.SIGKILL)
        for p in self.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        procs.wait_gone(pids, 5.0)
        for launcher, inst in self.instances:
            launcher.stop(inst, 0.0, 5.0)  # reaps our children
            children = getattr(launcher, "_children", {})
            for child in children.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=5)
        for cg in self.cgroups:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    cg.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


@pytest.fixture
def tracker() -> Iterator[Tracker]:
    t = Tracker()
    try:
        yield t
    finally:
        t.cleanup()


def wait_for(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False
