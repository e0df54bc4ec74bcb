"""The systemd launcher against a real systemd (the sandbox), running the simulated engine.

Each test owns one unit; the finalizer stops it and removes its files. Processes
live in the sandbox's cgroups and die with their unit or at the sandbox's ``down``.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from launcher_services import Sandbox, free_port, port_open, sim_argv

from servesweep.errors import LaunchError, TrialFailed
from servesweep.models import FailureClass, InstanceRecord
from servesweep.servers import ports, procs
from servesweep.servers.engines import get_preset
from servesweep.servers.gpu import open_probe
from servesweep.servers.launchers import make_launcher
from servesweep.servers.launchers.base import ExitStatus, LaunchRequest
from servesweep.servers.launchers.systemd import DROPIN_NAME, SystemdLauncher
from servesweep.servers.lifecycle import ServerLifecycle
from servesweep.servers.readiness import wait_ready
from servesweep.spec.schema import ServerSpec

UNIT_TEMPLATE = """\
[Unit]
Description=servesweep test unit ({name})

[Service]
Type=simple
KillMode={kill_mode}
Environment=PYTHONUNBUFFERED=1
ExecStart={python} -m servesweep.sim --port 9 --load-time 600
"""


class Unit:
    """One test unit plus the launcher that drives it."""

    def __init__(self, sandbox: Sandbox, name: str, tmp: Path, **systemd: Any) -> None:
        self.sandbox = sandbox
        self.name = name
        self.tmp = tmp
        self.port = free_port()
        self.spec = ServerSpec(
            engine="sim",
            launcher="systemd",
            port=self.port,
            systemd={
                "unit": name,
                "systemctl": [sandbox.systemctl],
                "journalctl": [sandbox.journalctl],
                "unit_dir": str(sandbox.unit_dir),
                **systemd,
            },
        )
        launcher = make_launcher(self.spec)
        assert isinstance(launcher, SystemdLauncher)
        self.launcher = launcher
        self.instances: list[InstanceRecord] = []

    def request(self, argv: list[str], key: str = "t1") -> LaunchRequest:
        return LaunchRequest(
            argv=argv,
            env={"SIM_NOTE": "x y"},
            host="127.0.0.1",
            port=self.port,
            gpus=(),
            log_path=self.tmp / "server.log",
            trial_key=f"sdtest-{key}",
            fingerprint=key,
        )

    def start(self, argv: list[str], key: str = "t1") -> InstanceRecord:
        rec = self.launcher.start(self.request(argv, key))
        self.instances.append(rec)
        return rec

    def sim(self, model: str, **params: Any) -> list[str]:
        spec = self.spec.model_copy(update={"model": model})
        return sim_argv(spec, **params)


@pytest.fixture
def unit_factory(systemd_sandbox: Sandbox, tmp_path: Path) -> Iterator[Any]:
    made: list[Unit] = []

    def make(
        name: str, kill_mode: str = "control-group", text: str | None = None, **kw: Any
    ) -> Unit:
        body = text or UNIT_TEMPLATE.format(name=name, kill_mode=kill_mode, python=sys.executable)
        systemd_sandbox.write_unit(name, body)
        unit = Unit(systemd_sandbox, name, tmp_path, **kw)
        made.append(unit)
        return unit

    yield make
    for unit in made:
        for rec in unit.instances:
            with contextlib.suppress(LaunchError):
                unit.launcher.stop(rec, grace=2.0, kill_timeout=5.0)
        systemd_sandbox.remove_unit(unit.name)


def _models(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as resp:
        return [m["id"] for m in json.load(resp)["data"]]


def test_type_simple_unit_is_active_before_ready_and_the_gate_waits(
    unit_factory: Any, systemd_sandbox: Sandbox
) -> None:
    unit = unit_factory("ss-simple.service")
    # Known before any start: read from systemd when first asked.
    assert any("Type=simple" in w for w in unit.launcher.warnings)
    load = 2.5
    argv = unit.sim("m-a", load_time=load)
    rec = unit.start(argv)

    # Identity: a fresh invocation, the unit's cgroup, the main PID as this host sees it.
    assert re.fullmatch(r"[0-9a-f]{32}", rec.invocation_id or "")
    assert rec.unit == "ss-simple.service" and rec.cgroup == "/system.slice/ss-simple.service"
    main = rec.main_pid
    assert main is not None and main in unit.launcher.pids(rec)
    cmdline = Path(f"/proc/{main}/cmdline").read_bytes().split(b"\0")
    assert b"servesweep.sim" in cmdline and str(unit.port).encode() in cmdline
    props = systemd_sandbox.show(unit.name, "InvocationID", "ActiveState", "ControlGroup")
    assert props["InvocationID"] == rec.invocation_id

    # systemd says active at once; nothing listens yet: active is not ready.
    assert props["ActiveState"] == "active"
    assert not port_open(unit.port)
    assert any("Type=simple" in w for w in unit.launcher.warnings)
    assert not any("KillMode" in w for w in unit.launcher.warnings)

    info = wait_ready(
        unit.launcher,
        rec,
        get_preset("sim"),
        host="127.0.0.1",
        port=unit.port,
        model=None,
        deadline_s=60,
    )
    assert info.model == "m-a"
    assert info.load_s >= load * 0.8, info
    assert ports.owned_by("127.0.0.1", unit.port, unit.launcher.pids(rec))
    assert unit.launcher.poll(rec) is None and unit.launcher.alive(rec)

    # The drop-in carries the trial; the unit file itself is untouched.
    dropin = (systemd_sandbox.unit_dir / f"{unit.name}.d" / DROPIN_NAME).read_text()
    assert "ExecStart=\n" in dropin and "--load-time 2.5" in dropin
    assert "--load-time 600" in (systemd_sandbox.unit_dir / unit.name).read_text()

    pids = unit.launcher.pids(rec)
    assert len(pids) >= 1
    result = unit.launcher.stop(rec, grace=10.0, kill_timeout=5.0)
    assert result.survivors == () and set(result.signalled) == pids
    assert unit.launcher.pids(rec) == set()
    assert not port_open(unit.port)
    assert unit.launcher.poll(rec) is not None and not unit.launcher.alive(rec)
    log = Path(rec.log_path or "").read_text()
    assert f"servesweep instance {rec.invocation_id} starting" in log
    assert "Loading weights took" in log and "model='m-a'" in log

    # After the sweep: the drop-in goes, the unit runs its own command again.
    unit.launcher.restore()
    assert not (systemd_sandbox.unit_dir / f"{unit.name}.d").exists()
    shown = systemd_sandbox.sdctl("show", "-p", "ExecStart", unit.name).stdout
    assert "--load-time 600" in shown and "--load-time 2.5" not in shown


def test_restart_with_new_params_gets_a_new_invocation_and_only_its_journal(
    unit_factory: Any,
) -> None:
    unit = unit_factory("ss-restart.service")
    ready: dict[str, Any] = {"host": "127.0.0.1", "port": unit.port, "model": None}
    # The first instance shuts down slowly, answering /v1/models meanwhile: stop
    # returns only once every process of the unit is gone and the port is closed.
    first = unit.start(unit.sim("m-a", load_time=0.5, shutdown_delay=1.0), key="a")
    wait_ready(unit.launcher, first, get_preset("sim"), deadline_s=60, **ready)
    assert _models(unit.port) == ["m-a"]
    stopped = unit.launcher.stop(first, grace=10.0, kill_timeout=5.0)
    assert stopped.survivors == () and stopped.killed == ()
    assert stopped.seconds >= 0.9, stopped
    assert not port_open(unit.port) and unit.launcher.pids(first) == set()

    second = unit.start(unit.sim("m-b", load_time=0.5, seed=7), key="b")
    assert second.invocation_id != first.invocation_id
    assert second.main_pid != first.main_pid
    wait_ready(unit.launcher, second, get_preset("sim"), deadline_s=60, **ready)
    assert _models(unit.port) == ["m-b"]
    # The stored first instance is not mistaken for the invocation now running the unit.
    assert unit.launcher.alive(second) and not unit.launcher.alive(first)
    assert unit.launcher.poll(first) is not None

    tail = unit.launcher.log_tail(second, 200)
    assert any("model='m-b'" in line for line in tail)
    assert not any("model='m-a'" in line for line in tail)
    assert any(f"pid {second.main_pid}" in line or "simulated engine" in line for line in tail)
    unit.launcher.stop(second, grace=10.0, kill_timeout=5.0)
    # One log file, one header per instance, each instance's lines after its header.
    log = Path(second.log_path or "").read_text()
    a_at = log.index(f"instance {first.invocation_id} starting")
    b_at = log.index(f"instance {second.invocation_id} starting")
    assert a_at < log.index("model='m-a'") < b_at < log.index("model='m-b'")


def test_killmode_process_warns_and_stop_kills_what_systemd_leaves(
    unit_factory: Any, systemd_sandbox: Sandbox
) -> None:
    # KillMode=process: systemd signals only the main process, which here ignores
    # SIGTERM; its worker (holding fake GPU memory, in its own session) would outlive a
    # SIGKILL of the main process. servesweep kills the whole cgroup after the grace.
    unit = unit_factory("ss-orphan.service", kill_mode="process")
    gpus = systemd_sandbox.scratch / f"gpus-{unit.port}"
    subprocess.run(
        [sys.executable, "-m", "servesweep.fakegpu", "init", str(gpus), "--memory", "4GiB"],
        check=True,
        timeout=60,
    )
    argv = unit.sim(
        "m-o", load_time=0.3, orphan_worker=True, ignore_sigterm=True, fake_gpus=str(gpus), gpus="0"
    )
    rec = unit.start(argv)
    wait_ready(
        unit.launcher,
        rec,
        get_preset("sim"),
        host="127.0.0.1",
        port=unit.port,
        model=None,
        deadline_s=60,
    )
    assert any("KillMode=process" in w for w in unit.launcher.warnings)
    before = unit.launcher.pids(rec)
    assert len(before) >= 2, "the sim's orphan worker should run beside the server"
    t0 = time.monotonic()
    result = unit.launcher.stop(rec, grace=1.5, kill_timeout=5.0)
    assert result.survivors == ()
    assert result.killed, result
    assert any("SIGKILL" in note for note in result.notes)
    assert 1.4 <= time.monotonic() - t0 < 15
    assert unit.launcher.pids(rec) == set()


def test_crash_at_load_is_an_exit_status_and_start_crash(unit_factory: Any) -> None:
    unit = unit_factory("ss-crash.service")
    rec = unit.start(unit.sim("m-c", load_time=0.3, crash_at_load=True))
    with pytest.raises(TrialFailed) as err:
        wait_ready(
            unit.launcher,
            rec,
            get_preset("sim"),
            host="127.0.0.1",
            port=unit.port,
            model=None,
            deadline_s=60,
        )
    assert err.value.failure_class is FailureClass.START_CRASH
    deadline = time.monotonic() + 10
    while unit.launcher.poll(rec) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    status = unit.launcher.poll(rec)
    assert status is not None and status.exit_code == 1, status
    lines = _journal_until(unit.launcher, rec, lambda ls: any("Traceback" in x for x in ls))
    assert any("Traceback" in line for line in lines)
    assert unit.launcher.stop(rec, grace=2.0, kill_timeout=2.0).survivors == ()


def _journal_until(
    launcher: SystemdLauncher, rec: InstanceRecord, done: Callable[[list[str]], bool]
) -> list[str]:
    """The invocation's last journal lines, waiting (10 s at most) until ``done`` holds:
    journald stores a stream's lines asynchronously, after the process may have exited."""
    deadline = time.monotonic() + 10
    lines = launcher.log_tail(rec, 100)
    while not done(lines) and time.monotonic() < deadline:
        time.sleep(0.1)
        lines = launcher.log_tail(rec, 100)
    return lines


def test_argv_reaches_the_process_verbatim_in_both_modes(
    unit_factory: Any, systemd_sandbox: Sandbox
) -> None:
    script = "import os, sys; print(repr(sys.argv[1:]), repr(os.environ.get('SIM_NOTE')))"
    words = ["a b", "50%", "$HOME", 'q"uote', "back\\slash"]
    unit = unit_factory("ss-argv.service")
    rec = unit.start([sys.executable, "-c", script, *words])
    deadline = time.monotonic() + 15
    while unit.launcher.poll(rec) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert unit.launcher.poll(rec) == ExitStatus(exit_code=0)
    expected = repr(words) + " 'x y'"
    lines = _journal_until(unit.launcher, rec, lambda ls: expected in ls)
    assert expected in lines, lines
    unit.launcher.stop(rec, grace=2.0, kill_timeout=2.0)

    # envfile mode: the unit's own ExecStart takes $SERVESWEEP_ARGS (split at spaces).
    text = (
        "[Service]\nType=simple\nEnvironment=PYTHONUNBUFFERED=1\n"
        f'ExecStart={sys.executable} -c "{script}" $SERVESWEEP_ARGS\n'
    )
    env_unit = unit_factory("ss-envfile.service", text=text, mode="envfile")
    rec2 = env_unit.start([sys.executable, "--flag", "50%", "$HOME"])
    deadline = time.monotonic() + 15
    while env_unit.launcher.poll(rec2) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    expected2 = "['--flag', '50%', '$HOME'] 'x y'"
    lines = _journal_until(env_unit.launcher, rec2, lambda ls: expected2 in ls)
    assert expected2 in lines, lines
    with pytest.raises(LaunchError, match="whitespace"):
        env_unit.start([sys.executable, "a b"], key="t2")


def test_lifecycle_moves_the_unit_between_two_configs(unit_factory: Any) -> None:
    """The trial lifecycle (port check, start, readiness, liveness, stop) over the unit."""
    unit = unit_factory("ss-life.service")
    spec = unit.spec.model_copy(update={"gpu_backend": "none"})
    life = ServerLifecycle(spec, get_preset("sim"), unit.launcher, open_probe("none"))
    seen: list[tuple[str, int | None]] = []
    for n, model in enumerate(["m-1", "m-2"]):
        argv = unit.sim(model, load_time=0.4)
        rec = life.start(argv, {}, unit.tmp / f"t{n}.log", f"sdlife-{n}", f"f{n}")
        unit.instances.append(rec)
        info = life.wait_ready(rec)
        assert info.model == model and _models(unit.port) == [model]
        life.check_alive(rec)
        assert procs.tag_of(rec.main_pid or 0) == next(
            iter(procs.tagged(prefix=f"sdlife-{n}-").values())
        )
        seen.append((rec.invocation_id or "", rec.main_pid))
        assert life.stop(rec).survivors == ()
        assert not port_open(unit.port)
    assert seen[0] != seen[1]


def test_a_unit_already_running_is_refused_then_stopped_through_current(
    unit_factory: Any, systemd_sandbox: Sandbox
) -> None:
    """The user's own server runs in the unit before the sweep: start refuses it,
    ``current()`` names it, and stopping that record frees the unit."""
    unit = unit_factory("ss-busy.service")
    systemd_sandbox.sdctl("start", unit.name)
    try:
        with pytest.raises(LaunchError, match="already active"):
            unit.start(unit.sim("m-z", load_time=0.2))
        theirs = unit.launcher.current()
        assert theirs is not None and theirs.invocation_id
        props = systemd_sandbox.show(unit.name, "InvocationID")
        assert theirs.invocation_id == props["InvocationID"]
        assert theirs.main_pid in unit.launcher.pids(theirs)
        assert unit.launcher.stop(theirs, grace=5.0, kill_timeout=5.0).survivors == ()
        assert unit.launcher.current() is None
    finally:
        systemd_sandbox.sdctl("stop", unit.name, check=False)
    rec = unit.start(unit.sim("m-z", load_time=0.2))
    assert rec.invocation_id != theirs.invocation_id
    unit.launcher.stop(rec, grace=5.0, kill_timeout=5.0)


OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0)"
ARGS_LINE = "server.py: error: unrecognized arguments: --bogus 3"
FAST_EXITS = 10


NO_SYNC = 'case "$1" in --sync) echo "--sync refused" >&2; exit 1;; esac; exec "$0" "$@"'
"""A journalctl that refuses --sync (as for a user who may not signal journald)."""


@pytest.mark.parametrize("journal_sync", [True, False], ids=["sync", "no-sync"])
def test_servers_that_exit_at_once_are_classified_from_their_journal_lines(
    unit_factory: Any, systemd_sandbox: Sandbox, journal_sync: bool
) -> None:
    """A server that prints its fatal line and exits at once: journald stores the line
    asynchronously, often after systemd reports the exit. The gate must classify it
    from that line (oom, invalid_args) every time, not as a bare exit — with
    ``journalctl --sync`` and without it."""
    journalctl = (
        [systemd_sandbox.journalctl]
        if journal_sync
        else ["sh", "-c", NO_SYNC, systemd_sandbox.journalctl]
    )
    unit = unit_factory("ss-fastexit.service", journalctl=journalctl)
    wrong: list[str] = []
    for n in range(FAST_EXITS):
        line, code, reason = (OOM_LINE, 1, "oom") if n % 2 == 0 else (ARGS_LINE, 2, "invalid_args")
        script = f"import sys; print({line!r}); sys.exit({code})"
        rec = unit.start([sys.executable, "-c", script], key=f"fx{n}")
        with pytest.raises(TrialFailed) as caught:
            wait_ready(
                unit.launcher,
                rec,
                get_preset("sim"),
                host="127.0.0.1",
                port=unit.port,
                model=None,
                deadline_s=60,
            )
        ev = caught.value.evidence
        if ev.reason != reason or ev.matched_line != line or ev.exit_code != code:
            wrong.append(
                f"start {n}: {caught.value.failure_class.value} ({ev.reason}) {ev.message}"
            )
        assert unit.launcher.stop(rec, grace=2.0, kill_timeout=2.0).survivors == ()
    assert not wrong, f"{len(wrong)} of {FAST_EXITS} misclassified:\n" + "\n".join(wrong)


def _stored(sandbox: Sandbox, line: str, since: float) -> list[dict[str, Any]]:
    """The journal entries whose message is ``line``, stored after ``since`` (epoch s)."""
    argv = [sandbox.journalctl, "-o", "json", "-q", "--no-pager", f"MESSAGE={line}"]
    out = subprocess.run(
        [*argv, f"--since=@{int(since) - 1}"], capture_output=True, text=True, timeout=60
    ).stdout
    return [json.loads(x) for x in out.splitlines() if x.strip()]


@pytest.mark.parametrize("journal_sync", [True, False], ids=["sync", "no-sync"])
def test_a_line_journald_stored_without_the_invocation_is_the_instance_s(
    unit_factory: Any, systemd_sandbox: Sandbox, journal_sync: bool
) -> None:
    """journald tags a stream's lines with the unit's invocation when it first reads the
    stream, from the process's cgroup: a server that printed and exited before that (a
    busy journald; here journald is paused meanwhile) has its line stored without
    ``_SYSTEMD_INVOCATION_ID``. The line is still the instance's (by ``ExecMainPID``),
    and the gate classifies from it."""
    journalctl = (
        [systemd_sandbox.journalctl]
        if journal_sync
        else ["sh", "-c", NO_SYNC, systemd_sandbox.journalctl]
    )
    unit = unit_factory("ss-untagged.service", journalctl=journalctl)
    line = f"{OOM_LINE} [{'sync' if journal_sync else 'no-sync'} {time.time():.6f}]"
    script = f"import sys; print({line!r}); sys.exit(1)"
    journald = "systemd-journald.service"
    systemd_sandbox.sdctl("kill", "--signal=SIGSTOP", journald)
    try:
        rec = unit.start([sys.executable, "-c", script])
        deadline = time.monotonic() + 30
        while unit.launcher.poll(rec) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert unit.launcher.poll(rec) is not None, "the server did not exit within 30 s"
    finally:
        systemd_sandbox.sdctl("kill", "--signal=SIGCONT", journald)
    with pytest.raises(TrialFailed) as caught:
        wait_ready(
            unit.launcher,
            rec,
            get_preset("sim"),
            host="127.0.0.1",
            port=unit.port,
            model=None,
            deadline_s=60,
        )
    stored = _stored(systemd_sandbox, line, rec.started_at or 0.0)
    assert len(stored) == 1 and "_SYSTEMD_INVOCATION_ID" not in stored[0], stored
    props = systemd_sandbox.show(unit.name, "ExecMainPID", "InvocationID")
    assert props["InvocationID"] == rec.invocation_id
    assert stored[0]["_PID"] == props["ExecMainPID"]
    ev = caught.value.evidence
    assert (ev.reason, ev.matched_line, ev.exit_code) == ("oom", line, 1), ev
    assert line in Path(rec.log_path or "").read_text()
    assert unit.launcher.log_tail(rec, 10) == [line]
    assert unit.launcher.stop(rec, grace=2.0, kill_timeout=2.0).survivors == ()
