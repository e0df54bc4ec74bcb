"""The docker launcher's pure parts: names, GPU flag, the run command line, exit status."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from servesweep.servers import procs
from servesweep.servers.launchers.base import ExitStatus, LaunchRequest
from servesweep.servers.launchers.docker import (
    DockerLauncher,
    _exit_status,
    container_name,
    gpus_flag,
)
from servesweep.spec.schema import ServerSpec


def test_container_name_is_docker_safe() -> None:
    assert container_name("servesweep", "sweep-7") == "servesweep-sweep-7"
    assert container_name("x", "a b/c:d") == "x-a_b_c_d"
    assert container_name("_p", "t")[0].isalnum()


def test_gpus_flag_quotes_the_device_list() -> None:
    assert gpus_flag(()) == []
    assert gpus_flag((3,)) == ["--gpus", '"device=3"']
    assert gpus_flag((0, 1)) == ["--gpus", '"device=0,1"']


def _launcher(**docker: object) -> DockerLauncher:
    spec = ServerSpec(
        engine="sim",
        launcher="docker",
        docker={"image": "img:1", "docker": ["docker", "-H", "unix:///x.sock"], **docker},
    )
    return DockerLauncher(spec)


def _request(gpus: tuple[int, ...]) -> LaunchRequest:
    return LaunchRequest(
        argv=["/srv", "--port", "9000"],
        env={"CUDA_VISIBLE_DEVICES": "2,3", "A": "b c"},
        host="127.0.0.1",
        port=9000,
        gpus=gpus,
        log_path=Path("/dev/null"),
        trial_key="sw-4",
        fingerprint="f00",
    )


def test_run_argv_with_gpus_drops_host_gpu_indexes() -> None:
    argv = _launcher(run_args=["--ipc", "host"]).run_argv(_request((2, 3)), "n", "tag-1")
    assert argv[:7] == ["docker", "-H", "unix:///x.sock", "run", "-d", "--name", "n"]
    assert argv[argv.index("--network") + 1] == "host"
    assert argv[argv.index("--gpus") + 1] == '"device=2,3"'
    envs = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    assert envs == ["A=b c", f"{procs.TAG_ENV}=tag-1"]
    assert "servesweep.fingerprint=f00" in argv and "servesweep.trial=sw-4" in argv
    assert argv[-6:] == ["--ipc", "host", "img:1", "/srv", "--port", "9000"]


def test_run_argv_without_gpu_flag_keeps_cuda_visible_devices() -> None:
    argv = _launcher(gpus_flag=False, network="").run_argv(_request((2, 3)), "n", "t")
    assert "--gpus" not in argv and "--network" not in argv
    assert "CUDA_VISIBLE_DEVICES=2,3" in argv


def test_launch_command_is_the_docker_run_a_user_can_copy() -> None:
    text = _launcher(run_args=["--ipc", "host"]).launch_command(_request((2, 3)))
    assert shlex.split(text) == [
        "docker", "-H", "unix:///x.sock", "run", "--rm", "--network", "host",
        "--gpus", '"device=2,3"', "-e", "A=b c", "--ipc", "host", "img:1",
        "/srv", "--port", "9000",
    ]  # fmt: skip
    assert procs.TAG_ENV not in text and "--label" not in text and "--name" not in text


def test_exit_status_from_state() -> None:
    assert _exit_status({"ExitCode": 0}) == ExitStatus(exit_code=0)
    assert _exit_status({"ExitCode": 2}) == ExitStatus(exit_code=2)
    assert _exit_status({"ExitCode": 137}) == ExitStatus(exit_code=137, signal=9)
    assert _exit_status({"ExitCode": 143}) == ExitStatus(exit_code=143, signal=15)
    assert _exit_status({"ExitCode": 1, "OOMKilled": True}) == ExitStatus(exit_code=1, signal=9)
    assert _exit_status({}) == ExitStatus()


def test_env_passthrough_goes_by_name_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.delenv("HF_HOME", raising=False)
    spec = ServerSpec(
        engine="sim",
        launcher="docker",
        docker={"image": "img:1"},
        env_passthrough=["HF_TOKEN", "HF_HOME"],
    )
    argv = DockerLauncher(spec).run_argv(_request(()), "n", "t")
    envs = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    assert "HF_TOKEN" in envs, "docker takes the value from its own environment"
    assert "HF_HOME" not in envs, "an unset name is not passed"
    assert not any("hf_secret_value" in a for a in argv)
