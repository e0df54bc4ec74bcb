"""The docker launcher against a real Docker engine (a private dockerd started for the
session by dev/dockerd.sh), running the simulated engine in a container of the
import-only skeleton image, on the host network at 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from launcher_services import Dockerd, free_port, port_open, sim_argv
from sweep_helpers import run_cli, write_sweep

from servesweep.errors import LaunchError, TrialFailed
from servesweep.models import FailureClass, InstanceRecord
from servesweep.servers import ports, procs
from servesweep.servers.engines import get_preset
from servesweep.servers.gpu import open_probe
from servesweep.servers.launchers import make_launcher
from servesweep.servers.launchers.base import LaunchRequest
from servesweep.servers.launchers.docker import DockerLauncher
from servesweep.servers.lifecycle import ServerLifecycle
from servesweep.servers.readiness import wait_ready
from servesweep.spec.schema import ServerSpec


class Box:
    """One docker launcher on a free port, plus what it started."""

    def __init__(self, engine: Dockerd, tmp: Path) -> None:
        self.engine = engine
        self.tmp = tmp
        self.port = free_port()
        self.spec = ServerSpec(
            engine="sim",
            launcher="docker",
            port=self.port,
            docker={
                "image": engine.image,
                "docker": engine.docker,
                "run_args": engine.binds(),
                "gpus_flag": False,
                "name_prefix": "sstest",
            },
        )
        launcher = make_launcher(self.spec)
        assert isinstance(launcher, DockerLauncher)
        self.launcher = launcher
        self.instances: list[InstanceRecord] = []

    def start(self, model: str, key: str = "t1", **params: Any) -> InstanceRecord:
        spec = self.spec.model_copy(update={"model": model})
        request = LaunchRequest(
            argv=sim_argv(spec, **params),
            env={"PYTHONUNBUFFERED": "1"},
            host="127.0.0.1",
            port=self.port,
            gpus=(),
            log_path=self.tmp / "server.log",
            trial_key=f"dk-{key}",
            fingerprint=key,
        )
        rec = self.launcher.start(request)
        self.instances.append(rec)
        return rec

    def wait_ready(self, rec: InstanceRecord) -> Any:
        return wait_ready(
            self.launcher,
            rec,
            get_preset("sim"),
            host="127.0.0.1",
            port=self.port,
            model=None,
            deadline_s=60,
        )


@pytest.fixture
def box(dockerd: Dockerd, tmp_path: Path) -> Iterator[Box]:
    made = Box(dockerd, tmp_path)
    yield made
    for rec in made.instances:
        with contextlib.suppress(LaunchError):
            made.launcher.stop(rec, grace=1.0, kill_timeout=5.0)


def _models(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as resp:
        return [m["id"] for m in json.load(resp)["data"]]


def test_sim_in_a_container_ready_stop_restart(box: Box, dockerd: Dockerd) -> None:
    first = box.start("m-a", key="a", load_time=1.0)
    cid = first.container_id or ""
    assert len(cid) == 64 and first.invocation_id
    main = first.main_pid
    assert main is not None and main in box.launcher.pids(first)
    # The container's processes carry the instance tag, as the host sees them.
    assert procs.tag_of(main) == first.invocation_id
    name = dockerd.run("inspect", "-f", "{{.Name}}", cid).stdout.strip()
    assert name == "/sstest-dk-a"

    info = box.wait_ready(first)
    assert info.model == "m-a" and info.load_s >= 0.8
    assert ports.owned_by("127.0.0.1", box.port, box.launcher.pids(first))
    assert box.launcher.poll(first) is None and box.launcher.alive(first)

    result = box.launcher.stop(first, grace=10.0, kill_timeout=5.0)
    assert result.survivors == () and main in result.signalled
    assert not port_open(box.port)
    assert box.launcher.pids(first) == set() and not box.launcher.alive(first)
    # Removed after the stop; its exit status is still known.
    assert dockerd.run("inspect", cid, check=False).returncode != 0
    status = box.launcher.poll(first)
    assert status is not None and status.signal is None and status.exit_code == 0

    second = box.start("m-b", key="b", load_time=0.5, seed=3)
    assert second.container_id != cid and second.main_pid != main
    box.wait_ready(second)
    assert _models(box.port) == ["m-b"]
    tail = box.launcher.log_tail(second, 100)
    assert any("model='m-b'" in line for line in tail)
    assert not any("model='m-a'" in line for line in tail)
    box.launcher.stop(second, grace=10.0, kill_timeout=5.0)

    log = Path(second.log_path or "").read_text()
    a_at = log.index(f"instance {first.invocation_id} starting")
    b_at = log.index(f"instance {second.invocation_id} starting")
    assert a_at < log.index("model='m-a'") < b_at < log.index("model='m-b'")
    assert "Loading weights took" in log[b_at:]


def test_crash_at_load_gives_exit_code_and_start_crash(box: Box) -> None:
    rec = box.start("m-c", load_time=0.2, crash_at_load=True)
    with pytest.raises(TrialFailed) as err:
        box.wait_ready(rec)
    assert err.value.failure_class is FailureClass.START_CRASH
    deadline = time.monotonic() + 10
    while box.launcher.poll(rec) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    status = box.launcher.poll(rec)
    assert status is not None and status.exit_code == 1 and status.signal is None
    assert box.launcher.exit_details(rec) == {"oom_killed": False, "exit_code": 1, "error": ""}
    assert any("Traceback" in line for line in box.launcher.log_tail(rec, 100))
    assert box.launcher.stop(rec, grace=1.0, kill_timeout=2.0).survivors == ()
    # The log stays after the container is gone.
    assert any("Traceback" in line for line in Path(rec.log_path or "").read_text().splitlines())


def test_sigterm_ignored_is_killed_after_the_grace(box: Box) -> None:
    rec = box.start("m-i", load_time=0.2, ignore_sigterm=True)
    box.wait_ready(rec)
    t0 = time.monotonic()
    result = box.launcher.stop(rec, grace=1.0, kill_timeout=5.0)
    took = time.monotonic() - t0
    assert result.survivors == ()
    assert result.killed and any("SIGKILL" in note for note in result.notes), result
    assert 0.9 <= took < 15, took
    status = box.launcher.poll(rec)
    assert status is not None and status.signal == 9, status
    assert not port_open(box.port)


def test_same_trial_name_twice_is_refused_while_running(box: Box) -> None:
    rec = box.start("m-x", key="same", load_time=0.2)
    with pytest.raises(LaunchError, match="still running"):
        box.start("m-y", key="same", load_time=0.2)
    assert box.launcher.stop(rec, grace=1.0, kill_timeout=5.0).survivors == ()
    # Stopping it again is harmless: the container is gone.
    again = box.launcher.stop(rec, grace=1.0, kill_timeout=5.0)
    assert again.survivors == () and again.signalled == () and again.seconds < 5


def test_lifecycle_with_the_release_gate_on_fake_gpus(box: Box, tmp_path: Path) -> None:
    """Two configs through the trial lifecycle; the release gate waits for the fake GPU
    memory that the stopped container's engine gives back only ``release_delay`` later.
    ``--pid host`` lets the engine record host PIDs in the fake GPU directory."""
    gpus = tmp_path / "gpus"
    subprocess.run(
        [sys.executable, "-m", "servesweep.fakegpu", "init", str(gpus), "--memory", "8GiB"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert box.spec.docker is not None
    docker = box.spec.docker.model_copy(
        update={"run_args": [*box.spec.docker.run_args, "--pid", "host", "-v", f"{gpus}:{gpus}"]}
    )
    spec = box.spec.model_copy(
        update={"docker": docker, "gpus": [0], "gpu_backend": "fake", "fake_gpu_dir": str(gpus)}
    )
    launcher = make_launcher(spec)
    life = ServerLifecycle(spec, get_preset("sim"), launcher, open_probe("fake", str(gpus)))
    assert life.prepare([0]) == {0: 0}
    delay = 1.0
    for n, model in enumerate(["m-1", "m-2"]):
        argv = sim_argv(
            spec.model_copy(update={"model": model}),
            load_time=0.3,
            fake_gpus=str(gpus),
            mem_per_gpu="2GiB",
            release_delay=delay,
        )
        env = {"CUDA_VISIBLE_DEVICES": "0", "PYTHONUNBUFFERED": "1"}
        rec = life.start(argv, env, tmp_path / f"t{n}.log", f"dklife-{n}", f"f{n}")
        box.instances.append(rec)
        assert life.wait_ready(rec).model == model
        used = life.probe.snapshot([0])[0]
        assert used.used_bytes == 2 * 2**30
        assert {h.pid for h in used.holders} <= launcher.pids(rec)
        old = launcher.pids(rec)
        stopped = life.stop(rec)
        assert stopped.survivors == ()
        released = life.release([0], old)
        # The memory comes back `delay` after the engine's exit, which happens during
        # the stop (docker stop alone can take longer than `delay` on a loaded machine).
        assert stopped.seconds + released.seconds >= delay * 0.8, (stopped, released)
        assert life.probe.snapshot([0])[0].used_bytes == 0


def test_a_docker_sweep_reports_the_docker_run_command_to_copy(
    dockerd: Dockerd, tmp_path: Path
) -> None:
    """The launch line of the best configuration is the `docker run` command that
    starts it (not the command inside the container), and copying it works."""
    sweep = write_sweep(
        tmp_path,
        name="dkcopy",
        grid={"budget": [2]},
        args={"mem-per-gpu": None, "release-delay": None},
        workloads=[{"name": "chat", "concurrency": [1], "requests": 4, "max_tokens": 8}],
        server_extra={
            "launcher": "docker",
            "gpus": [],
            "gpu_backend": "none",
            "fake_gpu_dir": None,
            "fake_gpus": None,
            "docker": {
                "image": dockerd.image,
                "docker": dockerd.docker,
                "run_args": dockerd.binds(),
                "gpus_flag": False,
                "name_prefix": "sstest",
            },
        },
    )
    done = run_cli("run", str(sweep), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    best = run_cli("best", str(sweep))
    assert best.returncode == 0, best.stderr
    [line] = [x.strip() for x in best.stdout.splitlines() if x.strip().startswith("launch: ")]
    command = line[len("launch: ") :]
    assert command.startswith(shlex.join([*dockerd.docker, "run", "--rm"])), command
    assert dockerd.image in command and "servesweep.sim" in command and "--budget 2" in command
    assert "SERVESWEEP_INSTANCE" not in command and "--label" not in command
    # copied as printed, it runs the server
    port = int(yaml.safe_load(sweep.read_text())["server"]["port"])
    assert not port_open(port)
    copy = subprocess.Popen(
        shlex.split(command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        models: list[str] = []
        while time.monotonic() < deadline and not models:
            with contextlib.suppress(OSError):
                models = _models(port)
            time.sleep(0.2)
        assert models, "the copied docker run command did not start a server"
    finally:
        copy.terminate()  # docker run proxies the signal; --rm removes the container
        try:
            copy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            copy.kill()
            copy.wait(timeout=10)
    assert not port_open(port) or _wait_closed(port)


def _wait_closed(port: int) -> bool:
    deadline = time.monotonic() + 30
    while port_open(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not port_open(port)
