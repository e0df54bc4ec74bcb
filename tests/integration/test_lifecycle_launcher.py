"""The subprocess launcher and the stop half of the release gate, with real processes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from tests.integration.fixtures_lifecycle.helpers import (
    Tracker,
    free_port,
    request,
    server_argv,
    tracker,
    wait_for,
)

from servesweep.errors import TrialFailed
from servesweep.models import FailureClass
from servesweep.servers import procs
from servesweep.servers.engines import get_preset
from servesweep.servers.launchers.subprocess import SubprocessLauncher
from servesweep.servers.logs import log_marker
from servesweep.servers.readiness import wait_ready
from servesweep.servers.release import stop_instance
from servesweep.spec.schema import Timeouts

__all__ = ["tracker"]


def test_start_tags_every_process_and_stop_ends_the_escaped_worker(
    tmp_path: Path, tracker: Tracker
) -> None:
    port = free_port()
    launcher = SubprocessLauncher()
    log = tmp_path / "server.log"
    inst = tracker.track(
        launcher,
        launcher.start(
            request(server_argv(port, "--setsid-worker", "--load-time", "0.2"), port, log)
        ),
    )
    assert inst.launcher == "subprocess" and inst.pgid == inst.main_pid
    assert inst.invocation_id and inst.invocation_id.startswith("lt-1-")
    info = wait_ready(
        launcher, inst, get_preset("sim"), host="127.0.0.1", port=port, model=None, deadline_s=20
    )
    assert info.model == "fake-model" and 0 < info.load_s <= info.ready_s
    # The worker called setsid: not in the tree's group, found by its tag.
    assert wait_for(lambda: "worker ready" in log.read_text())
    pids = launcher.pids(inst)
    escaped = {p for p in pids if p != inst.main_pid and os.getsid(p) == p}
    assert escaped, f"no setsid worker among {pids}"
    assert all(procs.tag_of(p) == inst.invocation_id for p in pids)
    assert log_marker(inst.invocation_id) in log.read_text()
    # The main process dies like a SIGKILLed API server: the worker is an orphan
    # outside the process group, still found by its tag.
    main = inst.main_pid or 0
    os.kill(main, signal.SIGKILL)
    assert wait_for(lambda: launcher.poll(inst) is not None)
    assert launcher.alive(inst)
    assert escaped <= launcher.pids(inst)

    result = stop_instance(launcher, inst, Timeouts(stop=5, kill=5))
    assert not result.survivors
    assert set(result.signalled) >= escaped
    assert all(procs.is_gone(p) for p in pids)
    assert launcher.poll(inst) is not None
    assert not launcher.alive(inst)


def test_stop_kills_a_child_that_ignores_sigterm(tmp_path: Path, tracker: Tracker) -> None:
    port = free_port()
    launcher = SubprocessLauncher()
    argv = server_argv(port, "--child-ignore-term")
    inst = tracker.track(launcher, launcher.start(request(argv, port, tmp_path / "s.log")))
    assert wait_for(lambda: "worker ready" in (tmp_path / "s.log").read_text())
    t0 = time.monotonic()
    result = launcher.stop(inst, grace=0.5, kill_timeout=5)
    assert time.monotonic() - t0 < 4
    assert not result.survivors
    assert result.killed, "the SIGTERM-ignoring child needed SIGKILL"
    assert any("SIGKILL" in note for note in result.notes)


def test_poll_reports_signal_and_alive_survives_a_new_launcher(
    tmp_path: Path, tracker: Tracker
) -> None:
    port = free_port()
    launcher = SubprocessLauncher()
    inst = tracker.track(
        launcher, launcher.start(request(server_argv(port), port, tmp_path / "s.log"))
    )
    assert launcher.poll(inst) is None
    # A servesweep that crashed and restarted has only the stored record.
    fresh = SubprocessLauncher()
    assert fresh.alive(inst)
    assert fresh.poll(inst) is None
    os.kill(inst.main_pid or 0, signal.SIGKILL)
    assert wait_for(lambda: launcher.poll(inst) is not None)
    status = launcher.poll(inst)
    assert status is not None and status.signal == signal.SIGKILL
    assert not fresh.alive(inst)


def test_unkillable_process_is_stop_failed_with_state_evidence(
    tmp_path: Path, tracker: Tracker
) -> None:
    if not (Path("/sys/fs/cgroup/freezer").is_dir() and os.geteuid() == 0):
        pytest.skip("needs root and the cgroup-v1 freezer")
    port = free_port()
    launcher = SubprocessLauncher()
    argv = server_argv(port, "--child-ignore-term")
    inst = tracker.track(launcher, launcher.start(request(argv, port, tmp_path / "s.log")))
    assert wait_for(lambda: "worker ready" in (tmp_path / "s.log").read_text())
    child = next(p for p in launcher.pids(inst) if p != inst.main_pid)
    cgroup = tracker.freezer("unkillable")
    (cgroup / "tasks").write_text(str(child))
    (cgroup / "freezer.state").write_text("FROZEN")
    assert wait_for(lambda: (cgroup / "freezer.state").read_text().strip() == "FROZEN", 5)

    t0 = time.monotonic()
    with pytest.raises(TrialFailed) as caught:
        stop_instance(launcher, inst, Timeouts(stop=0.3, kill=1.0))
    elapsed = time.monotonic() - t0
    assert elapsed < 5, f"stop hung for {elapsed:.1f}s"
    failure = caught.value
    assert failure.failure_class is FailureClass.STOP_FAILED
    ev = failure.evidence
    assert [p.pid for p in ev.processes] == [child]
    assert ev.processes[0].state == "D"
    assert ev.processes[0].wchan  # e.g. __refrigerator
    assert "fake_server" in ev.processes[0].cmdline or "python" in ev.processes[0].cmdline
    assert ev.reason == "unkillable" and f"pid {child}" in ev.message
    # Thawed, the pending SIGKILL ends it.
    (cgroup / "freezer.state").write_text("THAWED")
    assert wait_for(lambda: procs.is_gone(child), 5)
