"""doctor's report and the command launcher, against the simulated engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.integration.fixtures_lifecycle.helpers import (
    Tracker,
    free_port,
    init_fake_gpus,
    open_fake_probe,
    tracker,
)

from servesweep.errors import LaunchError, TrialFailed
from servesweep.models import FailureClass
from servesweep.servers import procs
from servesweep.servers.doctor import diagnose
from servesweep.servers.engines import get_preset
from servesweep.servers.launchers import make_launcher
from servesweep.servers.launchers.base import LaunchRequest
from servesweep.servers.launchers.command import CommandLauncher
from servesweep.servers.launchers.subprocess import SubprocessLauncher
from servesweep.servers.lifecycle import ServerLifecycle
from servesweep.spec.schema import ServerSpec

__all__ = ["tracker"]

SIM = get_preset("sim")


def test_doctor_names_holders_port_owner_and_a_real_generation(
    tmp_path: Path, tracker: Tracker
) -> None:
    fake = tmp_path / "gpus"
    init_fake_gpus(fake, count=2, memory="8GiB")
    probe = open_fake_probe(fake)
    port = free_port()
    spec = ServerSpec(engine="sim", port=port, gpus=[0], gpu_backend="fake", fake_gpu_dir=str(fake))
    lc = ServerLifecycle(spec, SIM, SubprocessLauncher(), probe)
    argv = SIM.build_argv(
        spec, {"fake-gpus": str(fake), "gpus": "0", "mem-per-gpu": "1GiB", "load-time": 0.2}
    )
    inst = lc.start(argv, {}, tmp_path / "s.log", "doc-1", "fp")
    tracker.track(lc.launcher, inst)
    lc.wait_ready(inst)
    report = diagnose(spec, probe)
    device = report["gpus"]["devices"][0]
    assert device["used_bytes"] == 2**30
    assert [h["pid"] for h in device["holders"]] == [inst.main_pid]
    assert "servesweep.sim" in device["holders"][0]["cmdline"]
    assert device["holders"][0]["servesweep_instance"] == inst.invocation_id
    assert [p["pid"] for p in report["port"]["listeners"]] == [inst.main_pid]
    assert report["engine"]["endpoints"]["health"]["status"] == 200
    assert report["engine"]["endpoints"]["models"]["models"] == ["sim-model"]
    assert report["engine"]["generation"]["ok"] is True
    assert inst.main_pid in {p["pid"] for p in report["servesweep_processes"]}
    lc.stop(inst)
    report = diagnose(spec, probe)
    assert report["port"]["listeners"] == []
    # nothing listening is normal before a sweep: a note, not an error
    assert report["engine"]["running"] is False and "error" not in report["engine"]
    assert "nothing listens on the port yet" in report["engine"]["note"]
    probe.close()


def test_command_launcher_with_a_pid_file_and_a_stop_command(
    tmp_path: Path, tracker: Tracker
) -> None:
    port = free_port()
    spec = ServerSpec.model_validate(
        {
            "engine": "sim",
            "launcher": "command",
            "port": port,
            "commands": {
                "start": "{argv} >> {log} 2>&1 & echo $! > {pid_file}",
                "stop": "kill $(cat {pid_file})",
                "status": "kill -0 $(cat {pid_file})",
                "pid_file": str(tmp_path / "server-{port}.pid"),
            },
            "timeouts": {"stop": 5, "kill": 3, "ready": 20},
        }
    )
    launcher = make_launcher(spec)
    assert isinstance(launcher, CommandLauncher)
    from servesweep.servers.gpu import NoGpuProbe

    lc = ServerLifecycle(spec, SIM, launcher, NoGpuProbe())
    argv = SIM.build_argv(spec, {"load-time": 0.2, "budget": 4})
    inst = lc.start(argv, {}, tmp_path / "s.log", "cmd-1", "fp")
    tracker.track(launcher, inst)
    assert inst.pid_file == str(tmp_path / f"server-{port}.pid")
    server_pid = int(Path(inst.pid_file).read_text())
    assert inst.main_pid == server_pid
    assert procs.tag_of(server_pid) == inst.invocation_id
    info = lc.wait_ready(inst)
    assert info.model == "sim-model"
    assert launcher.alive(inst) and launcher.poll(inst) is None
    result = lc.stop(inst)
    assert not result.survivors
    assert procs.is_gone(server_pid)
    assert launcher.poll(inst) is not None


def test_make_launcher_reports_a_missing_launcher_module_clearly(tmp_path: Path) -> None:
    spec = ServerSpec.model_validate(
        {"engine": "sim", "launcher": "docker", "docker": {"image": "x"}}
    )
    try:
        launcher = make_launcher(spec)
    except LaunchError as exc:
        assert "docker launcher" in str(exc)
    else:
        assert launcher.name == "docker"
    assert isinstance(make_launcher(ServerSpec(engine="sim")), SubprocessLauncher)
    empty = LaunchRequest(
        argv=[],
        env={},
        host="127.0.0.1",
        port=1,
        gpus=(),
        log_path=tmp_path / "s.log",
        trial_key="k",
        fingerprint="f",
    )
    with pytest.raises(LaunchError, match="empty"):
        SubprocessLauncher().start(empty)
    missing = LaunchRequest(
        argv=["/nonexistent/engine"],
        env={},
        host="127.0.0.1",
        port=1,
        gpus=(),
        log_path=tmp_path / "s.log",
        trial_key="k",
        fingerprint="f",
    )
    # a missing program is the configuration's failed start, with evidence
    with pytest.raises(TrialFailed) as caught:
        SubprocessLauncher().start(missing)
    assert caught.value.failure_class is FailureClass.START_CRASH
    assert caught.value.evidence.reason == "executable_not_found"
    assert "'/nonexistent/engine' does not exist" in caught.value.evidence.message


def test_command_launcher_start_failure_is_start_crash(tmp_path: Path, tracker: Tracker) -> None:
    from servesweep.errors import TrialFailed
    from servesweep.models import FailureClass

    port = free_port()
    spec = ServerSpec.model_validate(
        {
            "engine": "sim",
            "launcher": "command",
            "port": port,
            "commands": {"start": "echo 'cannot reach {host}:{port}' >&2; exit 3"},
            "timeouts": {"ready": 10},
        }
    )
    from servesweep.servers.gpu import NoGpuProbe

    launcher = make_launcher(spec)
    lc = ServerLifecycle(spec, SIM, launcher, NoGpuProbe())
    inst = lc.start(["ignored"], {}, tmp_path / "s.log", "cmd-2", "fp")
    tracker.track(launcher, inst)
    with pytest.raises(TrialFailed) as caught:
        lc.wait_ready(inst)
    assert caught.value.failure_class is FailureClass.START_CRASH
    assert caught.value.evidence.exit_code == 3
    assert f"cannot reach 127.0.0.1:{port}" in caught.value.evidence.log_tail
