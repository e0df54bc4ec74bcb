"""The readiness gate with real processes: each failure class with its evidence, and
an old process sharing the port not mistaken for the new instance."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from tests.integration.fixtures_lifecycle.helpers import (
    PORT_HOLDER,
    Tracker,
    free_port,
    request,
    server_argv,
    tracker,
    wait_for,
)

from servesweep.errors import TrialFailed
from servesweep.models import FailureClass
from servesweep.servers import ports
from servesweep.servers.engines import get_preset
from servesweep.servers.gpu import NoGpuProbe
from servesweep.servers.launchers.subprocess import SubprocessLauncher
from servesweep.servers.lifecycle import ServerLifecycle
from servesweep.servers.readiness import wait_ready
from servesweep.spec.schema import ServerSpec

__all__ = ["tracker"]

SIM = get_preset("sim")


def _fail(tmp_path: Path, tracker: Tracker, *flags: str, deadline: float = 20) -> TrialFailed:
    port = free_port()
    launcher = SubprocessLauncher()
    inst = tracker.track(
        launcher, launcher.start(request(server_argv(port, *flags), port, tmp_path / "s.log"))
    )
    with pytest.raises(TrialFailed) as caught:
        wait_ready(
            launcher, inst, SIM, host="127.0.0.1", port=port, model=None, deadline_s=deadline
        )
    return caught.value


def test_invalid_flag_is_invalid_args_with_the_argparse_line(
    tmp_path: Path, tracker: Tracker
) -> None:
    failure = _fail(
        tmp_path, tracker, "--fatal", "error: unrecognized arguments: --bogus 3", "--exit-code", "2"
    )
    assert failure.failure_class is FailureClass.INVALID_ARGS
    ev = failure.evidence
    assert ev.matched_line == "error: unrecognized arguments: --bogus 3"
    assert ev.exit_code == 2
    assert ev.log_path and ev.log_path.endswith("s.log")
    assert any("unrecognized arguments" in line for line in ev.log_tail)


def test_oom_at_load_is_start_crash_oom_not_a_generic_traceback(
    tmp_path: Path, tracker: Tracker
) -> None:
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0)"
    failure = _fail(tmp_path, tracker, "--load-time", "0.2", "--fatal", line)
    assert failure.failure_class is FailureClass.START_CRASH
    assert failure.evidence.reason == "oom"
    assert failure.evidence.matched_line == line
    assert failure.evidence.exit_code == 1
    assert "oom" in str(failure)


def test_exit_without_a_fatal_line_is_start_crash_with_the_exit_code(
    tmp_path: Path, tracker: Tracker
) -> None:
    failure = _fail(tmp_path, tracker, "--fatal", "giving up quietly", "--exit-code", "3")
    # The fixture prints a Traceback header: the sim preset classifies it.
    assert failure.failure_class is FailureClass.START_CRASH
    assert failure.evidence.exit_code == 3


def test_hang_at_load_is_ready_timeout_with_progress(tmp_path: Path, tracker: Tracker) -> None:
    t0 = time.monotonic()
    failure = _fail(tmp_path, tracker, "--hang", deadline=1.5)
    assert time.monotonic() - t0 < 6
    assert failure.failure_class is FailureClass.READY_TIMEOUT
    ev = failure.evidence
    assert ev.reason == "no_listener"
    assert "still progressing" in ev.message
    assert any("still loading" in line for line in ev.log_tail)
    assert ev.details["phase"] == "load"


def test_generation_errors_are_serve_error(tmp_path: Path, tracker: Tracker) -> None:
    failure = _fail(tmp_path, tracker, "--gen-status", "500", deadline=2.0)
    assert failure.failure_class is FailureClass.SERVE_ERROR
    assert "HTTP 500" in failure.evidence.message


def test_old_process_sharing_the_port_does_not_make_the_new_one_ready(
    tmp_path: Path, tracker: Tracker
) -> None:
    port = free_port()
    # An old server (not ours) on the port with SO_REUSEPORT, answering everything.
    old = tracker.spawn(
        server_argv(port, "--reuse-port", "--name", "old", "--model", "old-model"),
        tmp_path / "old.log",
    )
    assert wait_for(lambda: ports.owned_by("127.0.0.1", port, {old.pid}))
    launcher = SubprocessLauncher()
    argv = server_argv(port, "--reuse-port", "--load-time", "1.5", "--name", "new")
    inst = tracker.track(launcher, launcher.start(request(argv, port, tmp_path / "s.log")))
    phases: list[str] = []
    info = wait_ready(
        launcher,
        inst,
        SIM,
        host="127.0.0.1",
        port=port,
        model=None,
        deadline_s=20,
        on_progress=lambda phase, elapsed, line: phases.append(phase),
    )
    # Not ready before the new instance listened (it loads 1.5 s) ...
    assert info.load_s >= 1.5
    assert phases[0] == "load" and phases[-1] == "ready"
    # ... and the model came from the new instance, not the old one.
    assert info.model == "fake-model"
    assert ports.owned_by("127.0.0.1", port, launcher.pids(inst))
    owners = {p.pid for p in ports.listeners("127.0.0.1", port)}
    assert old.pid in owners and inst.main_pid in owners


def test_crash_during_benchmark_is_bench_crash(tmp_path: Path, tracker: Tracker) -> None:
    port = free_port()
    spec = ServerSpec(engine="sim", port=port, gpus=[])
    launcher = SubprocessLauncher()
    lc = ServerLifecycle(spec, SIM, launcher, NoGpuProbe())
    inst = tracker.track(
        launcher, lc.start(server_argv(port), {}, tmp_path / "s.log", "lt-7", "fp")
    )
    lc.wait_ready(inst)
    lc.check_alive(inst)  # alive: no exception
    os.kill(inst.main_pid or 0, signal.SIGKILL)
    assert wait_for(lambda: launcher.poll(inst) is not None)
    with pytest.raises(TrialFailed) as caught:
        lc.check_alive(inst)
    assert caught.value.failure_class is FailureClass.BENCH_CRASH
    assert caught.value.evidence.signal == signal.SIGKILL
    assert any("Uvicorn running" in line for line in caught.value.evidence.log_tail)


def test_port_held_by_another_program_is_port_in_use_naming_it(
    tmp_path: Path, tracker: Tracker
) -> None:
    port = free_port()
    holder = tracker.spawn([sys.executable, PORT_HOLDER, str(port)], tmp_path / "h.log")
    assert wait_for(lambda: bool(ports.listeners("127.0.0.1", port)))
    spec = ServerSpec(engine="sim", port=port, gpus=[])
    launcher = SubprocessLauncher()
    lc = ServerLifecycle(spec, SIM, launcher, NoGpuProbe())
    with pytest.raises(TrialFailed) as caught:
        lc.start(server_argv(port), {}, tmp_path / "s.log", "lt-8", "fp")
    failure = caught.value
    assert failure.failure_class is FailureClass.PORT_IN_USE
    assert [p.pid for p in failure.evidence.processes] == [holder.pid]
    assert "port_holder.py" in failure.evidence.processes[0].cmdline
    assert f"pid {holder.pid}" in failure.evidence.message
    assert not (tmp_path / "s.log").exists(), "nothing was started"
