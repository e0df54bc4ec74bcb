"""The readiness gate with real processes: each failure class with its evidence, and
an old process sharing the port not mistaken for the new instance."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
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
from servesweep.servers import ports, procs
from servesweep.servers.engines import build_launch, get_preset
from servesweep.servers.gpu import NoGpuProbe
from servesweep.servers.launchers.subprocess import SubprocessLauncher
from servesweep.servers.lifecycle import ServerLifecycle
from servesweep.servers.readiness import http_call, wait_ready
from servesweep.spec.schema import ServerSpec

__all__ = ["tracker"]

HIDDEN_LISTENER = str(Path(__file__).parent / "fixtures_lifecycle" / "hidden_listener.py")

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
    # Every generation answers 500: classified once that is clear, not at the deadline.
    t0 = time.monotonic()
    failure = _fail(tmp_path, tracker, "--gen-status", "500", deadline=120)
    assert time.monotonic() - t0 < 30
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


def _fail_with(
    tmp_path: Path, tracker: Tracker, preset: str, argv: list[str], port: int, deadline: float
) -> TrialFailed:
    launcher = SubprocessLauncher()
    inst = tracker.track(launcher, launcher.start(request(argv, port, tmp_path / "s.log")))
    with pytest.raises(TrialFailed) as caught:
        wait_ready(
            launcher,
            inst,
            get_preset(preset),
            host="127.0.0.1",
            port=port,
            model=None,
            deadline_s=deadline,
        )
    return caught.value


def test_missing_engine_module_is_import_error_quoting_the_line(
    tmp_path: Path, tracker: Tracker
) -> None:
    # The real sglang preset, where sglang is not installed: Python reports the missing
    # module inside a longer line ("Error while finding module specification ...").
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here: its launcher would really start")
    port = free_port()
    spec = ServerSpec(engine="sglang", model="/models/none", port=port)
    argv, _ = build_launch(spec, {})
    failure = _fail_with(tmp_path, tracker, "sglang", argv, port, deadline=20)
    assert failure.failure_class is FailureClass.START_CRASH
    ev = failure.evidence
    assert ev.reason == "import_error"
    assert ev.matched_line is not None and "No module named 'sglang'" in ev.matched_line
    assert ev.exit_code == 1
    assert "No module named 'sglang'" in failure.evidence.summary()


VLLM_HELD = (
    "(EngineCore_DP0 pid=4242) ValueError: Free memory on device cuda:0 (2.6/79.19 GiB) on "
    "startup is less than desired GPU memory utilization (0.9, 71.27 GiB). Decrease GPU "
    "memory utilization or reduce GPU memory used by other processes."
)


def test_engine_refusing_held_gpu_memory_names_the_held_memory(
    tmp_path: Path, tracker: Tracker
) -> None:
    port = free_port()
    argv = server_argv(port, "--load-time", "0.2", "--fatal", VLLM_HELD)
    failure = _fail_with(tmp_path, tracker, "vllm", argv, port, deadline=20)
    assert failure.failure_class is FailureClass.START_CRASH
    ev = failure.evidence
    assert ev.reason == "gpu_memory_held"
    assert ev.matched_line == VLLM_HELD
    assert ev.exit_code == 1
    assert "another process" in ev.message


def test_a_trickling_generation_ends_at_the_ready_deadline(
    tmp_path: Path, tracker: Tracker
) -> None:
    # The server accepts the generation and sends one byte every 2 s, forever: no
    # socket read ever times out, yet the gate must end at its own deadline.
    t0 = time.monotonic()
    failure = _fail(tmp_path, tracker, "--trickle", "2", deadline=3)
    took = time.monotonic() - t0
    assert took < 3 + 3, f"the gate took {took:.1f}s with a 3 s deadline"
    assert failure.failure_class is FailureClass.SERVE_ERROR
    assert "no token before the deadline" in failure.evidence.message


def test_a_large_valid_answer_is_ready(tmp_path: Path, tracker: Tracker) -> None:
    port = free_port()
    launcher = SubprocessLauncher()
    argv = server_argv(port, "--big-answer", str(3 * 2**20))
    inst = tracker.track(launcher, launcher.start(request(argv, port, tmp_path / "s.log")))
    info = wait_ready(launcher, inst, SIM, host="127.0.0.1", port=port, model=None, deadline_s=20)
    assert info.model == "fake-model"


def test_a_server_resetting_every_connection_is_serve_error_before_the_deadline(
    tmp_path: Path, tracker: Tracker
) -> None:
    t0 = time.monotonic()
    failure = _fail(tmp_path, tracker, "--reset-all", deadline=120)
    took = time.monotonic() - t0
    assert failure.failure_class is FailureClass.SERVE_ERROR
    assert took < 30, f"classified after {took:.1f}s of a 120 s deadline"
    ev = failure.evidence
    assert ev.reason == "generation_failed"
    assert re.search(r"Reset|RemoteDisconnected|BrokenPipe", ev.message), ev.message
    assert ev.details["failures"] >= 5


def test_crash_during_benchmark_quotes_the_fatal_line_of_the_log(
    tmp_path: Path, tracker: Tracker
) -> None:
    port = free_port()
    spec = ServerSpec(engine="sim", port=port, gpus=[])
    launcher = SubprocessLauncher()
    lc = ServerLifecycle(spec, SIM, launcher, NoGpuProbe())
    # Generation 1 is the readiness probe; generation 2 (the benchmark's) kills it.
    argv = server_argv(port, "--crash-after", "2")
    inst = tracker.track(launcher, lc.start(argv, {}, tmp_path / "s.log", "lt-9", "fp"))
    lc.wait_ready(inst)
    body = {"model": "fake-model", "prompt": "x", "max_tokens": 4}
    http_call("127.0.0.1", port, "POST", "/v1/completions", body=body, api_key=None, timeout=5)
    assert wait_for(lambda: launcher.poll(inst) is not None)
    with pytest.raises(TrialFailed) as caught:
        lc.check_alive(inst)
    ev = caught.value.evidence
    assert caught.value.failure_class is FailureClass.BENCH_CRASH
    assert ev.reason == "cuda_error"
    assert ev.matched_line == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert ev.exit_code == 1
    assert "illegal memory access" in ev.summary()


def test_port_owner_whose_main_thread_exited_is_named(tmp_path: Path, tracker: Tracker) -> None:
    # /proc shows such a process as a zombie with no descriptors, yet its other
    # threads keep the socket listening: the owner is found through its threads.
    port = free_port()
    holder = tracker.spawn(
        [sys.executable, HIDDEN_LISTENER, str(port), "--main-exits"], tmp_path / "h.log"
    )
    assert wait_for(lambda: _zombie(holder.pid))
    spec = ServerSpec(engine="sim", port=port, gpus=[])
    lc = ServerLifecycle(spec, SIM, SubprocessLauncher(), NoGpuProbe())
    with pytest.raises(TrialFailed) as caught:
        lc.start(server_argv(port), {}, tmp_path / "s.log", "lt-10", "fp")
    ev = caught.value.evidence
    assert caught.value.failure_class is FailureClass.PORT_IN_USE
    assert [p.pid for p in ev.processes] == [holder.pid], ev.message
    assert "hidden_listener.py" in ev.processes[0].cmdline
    assert "main thread exited" in ev.processes[0].state
    assert f"pid {holder.pid}" in ev.message
    # and the release/stop side agrees that it is not gone
    assert not procs.is_gone(holder.pid)


def _zombie(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2] == "Z"


NOBODY = 65534


def test_port_owner_that_cannot_be_read_is_explained(tmp_path: Path, tracker: Tracker) -> None:
    # Run as an unprivileged user, against a listener of the same user that is not
    # dumpable: its descriptors cannot be read, and the message says so and names it.
    python = "/usr/bin/python3"
    if os.geteuid() != 0:
        pytest.skip("needs root to run two processes as another user")
    if not os.access(python, os.X_OK) or _version(python) != sys.version_info[:2]:
        pytest.skip(f"{python} (for the unprivileged user) is not Python {sys.version_info[:2]}")
    port = free_port()
    src = str(Path(__file__).resolve().parents[2] / "src")
    site = [p for p in sys.path if p.endswith("site-packages")]
    env = {"PYTHONPATH": os.pathsep.join([src, *site]), "PATH": "/usr/bin:/bin"}
    holder = subprocess.Popen(
        [python, HIDDEN_LISTENER, str(port), "--not-dumpable"],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        stdout=subprocess.PIPE,
        env=env,
    )
    tracker.popens.append(holder)
    assert holder.stdout is not None
    with holder.stdout:
        assert holder.stdout.readline() == b"listening\n"
    code = (
        "import json, sys; from servesweep.servers import ports; "
        f"print(json.dumps([p.__dict__ for p in ports.listeners('127.0.0.1', {port})]))"
    )
    done = subprocess.run(
        [python, "-c", code],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    if done.returncode != 0 and "Permission denied" in done.stderr:
        pytest.skip(f"the checkout is not readable by an unprivileged user: {done.stderr[-200:]}")
    assert done.returncode == 0, done.stderr
    [found] = json.loads(done.stdout)
    assert found["pid"] == 0
    why = found["cmdline"]
    assert "uid 65534" in why and "cannot be read" in why, why
    assert f"pid {holder.pid}" in why and "hidden_listener.py" in why, why


def _version(python: str) -> tuple[int, ...]:
    out = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple(int(x) for x in out.split())
