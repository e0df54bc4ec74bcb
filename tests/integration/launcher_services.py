"""Real service managers for the launcher tests: the systemd sandbox and a private dockerd.

Both are session-wide and torn down by PID in the finalizer, however the tests end.
Paths come from this checkout (never a fixed /work/...): the repository root is two
folders above this file; the sandbox lives in ``$SYSTEMD_SANDBOX_HOME`` or
``<repo>/../shared/systemd-sandbox``.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from servesweep.servers.engines import get_preset
from servesweep.spec.schema import ServerSpec

REPO = Path(__file__).resolve().parents[2]
SANDBOX_HOME = Path(
    os.environ.get("SYSTEMD_SANDBOX_HOME", REPO.parent / "shared" / "systemd-sandbox")
)
IMAGE = "servesweep-host:local"
SANDBOX_LOCK = Path(tempfile.gettempdir()) / "servesweep-systemd-sandbox.lock"
"""Only one systemd sandbox can run on a machine, and `up` clears any other: test
sessions of several checkouts on one machine take turns through this lock."""
SANDBOX_LOCK_WAIT_S = 240.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def sim_argv(spec: ServerSpec, **params: Any) -> list[str]:
    """The simulated engine's command line, built by its engine preset."""
    return get_preset("sim").build_argv(spec, params)


def _exports(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    return env


# ---- systemd sandbox ------------------------------------------------------------------


@dataclass(frozen=True)
class Sandbox:
    systemctl: str
    journalctl: str
    unit_dir: Path
    scratch: Path

    def sdctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.systemctl, *args], check=check, capture_output=True, text=True, timeout=60
        )

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.sdctl("show", "-p", ",".join(props), unit).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def write_unit(self, name: str, text: str) -> None:
        (self.unit_dir / name).write_text(text)
        self.sdctl("daemon-reload")

    def remove_unit(self, name: str) -> None:
        self.sdctl("stop", name, check=False)
        (self.unit_dir / name).unlink(missing_ok=True)
        shutil.rmtree(self.unit_dir / f"{name}.d", ignore_errors=True)
        self.sdctl("daemon-reload", check=False)
        self.sdctl("reset-failed", name, check=False)


@pytest.fixture(scope="session")
def systemd_sandbox() -> Iterator[Sandbox]:
    """A real systemd (PID 1 of an nspawn container) with this checkout and venv bound."""
    if os.geteuid() != 0:
        pytest.skip("the systemd sandbox needs root")
    up, down = SANDBOX_HOME / "up", SANDBOX_HOME / "down"
    if not up.exists():
        pytest.skip(f"no systemd sandbox at {SANDBOX_HOME} (set SYSTEMD_SANDBOX_HOME)")
    lock = open(SANDBOX_LOCK, "a")  # noqa: SIM115  (held for the whole session)
    deadline = time.monotonic() + SANDBOX_LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                lock.close()
                pytest.skip(
                    f"another test session on this machine holds the systemd sandbox "
                    f"({SANDBOX_LOCK}) for more than {SANDBOX_LOCK_WAIT_S:g}s"
                )
            time.sleep(0.5)
    args = [str(up), "--bind-ro", str(REPO)]
    if sys.prefix != sys.base_prefix:
        args += ["--venv", sys.prefix]
    elif not sys.prefix.startswith("/usr"):
        args += ["--bind-ro", sys.prefix]
    subprocess.run([str(down)], check=False, capture_output=True, timeout=120)
    done = subprocess.run(args, capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        subprocess.run([str(down)], check=False, capture_output=True, timeout=120)
        lock.close()
        pytest.fail(f"systemd sandbox `up` failed ({done.returncode}): {done.stderr[-2000:]}")
    env = _exports(done.stdout)
    try:
        yield Sandbox(
            systemctl=env["SYSTEMD_SANDBOX_SYSTEMCTL"],
            journalctl=env["SYSTEMD_SANDBOX_JOURNALCTL"],
            unit_dir=Path(env["SYSTEMD_SANDBOX_UNIT_DIR"]),
            scratch=Path(env["SYSTEMD_SANDBOX_SCRATCH"]),
        )
    finally:
        subprocess.run([str(down)], check=False, capture_output=True, timeout=120)
        lock.close()


# ---- private Docker engine --------------------------------------------------------------


@dataclass(frozen=True)
class Dockerd:
    host: str
    """``unix:///.../docker.sock``"""
    image: str

    @property
    def docker(self) -> list[str]:
        return ["docker", "-H", self.host]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.docker, *args], check=check, capture_output=True, text=True, timeout=120
        )

    def binds(self) -> list[str]:
        """``-v`` flags that make this interpreter, its venv and the checkout visible
        read-only at the same paths inside a container of the skeleton image."""
        paths = ["/usr", sys.base_prefix, sys.prefix, str(REPO)]
        keep: list[str] = []
        for path in sorted(set(paths), key=len):
            if not any(path == k or path.startswith(k + "/") for k in keep):
                keep.append(path)
        out: list[str] = []
        for path in keep:
            out += ["-v", f"{path}:{path}:ro"]
        return out


@pytest.fixture(scope="session")
def dockerd() -> Iterator[Dockerd]:
    """A private dockerd (dev/dockerd.sh) with the import-only test image."""
    if os.geteuid() != 0:
        pytest.skip("a private dockerd needs root")
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        pytest.skip("dockerd/docker not installed (apt-get install docker.io)")
    script = REPO / "dev" / "dockerd.sh"
    state = Path(tempfile.mkdtemp(prefix="ssdk-", dir="/tmp"))
    done = subprocess.run(
        [str(script), "start", str(state)], capture_output=True, text=True, timeout=120
    )
    try:
        if done.returncode != 0:
            pytest.fail(f"dev/dockerd.sh start failed: {done.stderr[-2000:]}")
        host = _exports(done.stdout)["DOCKER_HOST"]
        env = {**os.environ, "DOCKER_HOST": host}
        built = subprocess.run(
            [str(REPO / "dev" / "docker-image.sh"), IMAGE],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        if built.returncode != 0:
            pytest.fail(f"dev/docker-image.sh failed: {built.stderr[-2000:]}")
        yield Dockerd(host=host, image=IMAGE)
    finally:
        subprocess.run([str(script), "stop", str(state)], capture_output=True, timeout=180)
        mounts = Path("/proc/self/mounts").read_text()
        if f" {state}/" not in mounts:  # never delete through a mount that stayed
            shutil.rmtree(state, ignore_errors=True)
