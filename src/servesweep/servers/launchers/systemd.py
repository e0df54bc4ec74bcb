"""The systemd launcher: run each trial through an existing unit.

servesweep never edits the unit file. The trial's command goes into a drop-in,
``<unit_dir>/<unit>.d/servesweep.conf``: in ``execstart`` mode it replaces
``ExecStart=`` and adds ``Environment=`` lines; in ``envfile`` mode it leaves
the unit's own ``ExecStart=`` (which uses ``$SERVESWEEP_ARGS``) and sets
``SERVESWEEP_ARGS`` and ``SERVESWEEP_PROGRAM`` with ``Environment=`` lines. Then
``daemon-reload``, ``reset-failed`` and ``start --no-block``. Secrets named in
``server.env_passthrough`` go through the manager's environment instead (see
``_import_secrets``), never into the drop-in.

Identity: systemd's ``InvocationID`` (new for every start), the unit's
``ControlGroup`` and the main PID. ``pids`` reads every process of the unit's cgroup
from the local cgroup file system, also when systemd runs in a container whose
cgroup namespace nests the path (the systemd sandbox of the tests). Logs: the
journal lines of that invocation only (its ``_SYSTEMD_INVOCATION_ID``, or its main
process's ``ExecMainPID`` for lines journald stored without it: see :mod:`.journal`),
copied into the trial's log file while the instance runs; once it exited,
``finish_log`` waits for the journal to hold its last lines and copies them, so a
server that dies at once is classified by its fatal line. ``stop``: ``systemctl stop --no-block``,
``grace`` seconds, then ``systemctl kill --signal=SIGKILL`` and SIGKILL to every
local PID of the cgroup, then up to ``kill_timeout`` for the cgroup to empty.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import servesweep.servers.launchers.journal as journal
from servesweep.errors import LaunchError
from servesweep.models import InstanceRecord
from servesweep.servers import logs, procs
from servesweep.servers.engine_args import launch_command_text
from servesweep.servers.launchers.base import ExitStatus, Launcher, LaunchRequest, StopResult
from servesweep.servers.launchers.external import LogCopier, run_tool
from servesweep.servers.launchers.systemd_unit import (
    args_dropin_text,
    dropin_text,
    exit_status,
    parse_int,
    systemd_quote,
    unit_warnings,
)
from servesweep.servers.launchers.unit_cgroup import UnitCgroup, host_pid
from servesweep.spec.schema import ServerSpec, SystemdSpec

__all__ = [
    "DROPIN_NAME",
    "SystemdLauncher",
    "UnitCgroup",
    "args_dropin_text",
    "dropin_text",
    "systemd_quote",
    "unit_warnings",
]

DROPIN_NAME = "servesweep.conf"

_PROPS = (
    "LoadState",
    "ActiveState",
    "SubState",
    "Type",
    "KillMode",
    "Restart",
    "MainPID",
    "ExecMainPID",
    "InvocationID",
    "ControlGroup",
    "ExecMainCode",
    "ExecMainStatus",
    "Result",
    "TimeoutStopUSec",
    "Job",
)
_RUNNING_STATES = ("active", "activating", "deactivating", "reloading")
_START_WAIT = 15.0
_TTL = 0.2
_KEEP_JOURNALS = 64
"""Invocations whose main PID the launcher remembers for their journal lines."""


class SystemdLauncher(Launcher):
    """Runs trials through an existing systemd unit; see the module docstring."""

    name = "systemd"

    def __init__(self, spec: ServerSpec) -> None:
        if spec.systemd is None:
            raise LaunchError("launcher 'systemd' needs a 'systemd: {unit: ...}' section")
        self.spec = spec
        self.sd: SystemdSpec = spec.systemd
        self.unit = self.sd.unit
        self._warnings: list[str] | None = None
        self._cached_state: tuple[str | None, float, dict[str, str]] | None = None
        self.cgroups = UnitCgroup()
        self._copiers: dict[str, LogCopier] = {}
        self._journals: dict[str, journal.Invocation] = {}

    # ---- systemctl and journalctl -------------------------------------------------

    def systemctl(self, *args: str, check: bool = True, timeout: float = 30.0) -> str:
        done = run_tool([*self.sd.systemctl, *args], timeout=timeout, check=check, what=self.unit)
        return done.stdout

    def show(self, props: Sequence[str] = _PROPS) -> dict[str, str]:
        """``systemctl show`` of the unit as a dict."""
        out = self.systemctl("show", "-p", ",".join(props), self.unit)
        data: dict[str, str] = {}
        for line in out.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                data[key] = value
        return data

    def journal_of(self, instance: InstanceRecord) -> journal.Invocation:
        """Which journal lines are the instance's: by its main process too when this
        launcher started it (see :mod:`.journal`)."""
        inv = instance.invocation_id or ""
        return self._journals.get(inv) or journal.Invocation(self.unit, inv)

    # ---- drop-in ----------------------------------------------------------------------

    @property
    def dropin_dir(self) -> Path:
        return Path(self.sd.unit_dir) / f"{self.unit}.d"

    def write_dropin(self, request: LaunchRequest, env: Mapping[str, str]) -> Path:
        folder = self.dropin_dir
        try:
            folder.mkdir(parents=True, exist_ok=True)
            make = dropin_text if self.sd.mode == "execstart" else args_dropin_text
            _write_atomic(folder / DROPIN_NAME, make(request.argv, env, request.trial_key))
        except OSError as exc:
            raise LaunchError(
                f"cannot write the drop-in for {self.unit} in {folder}: {exc} "
                "(check systemd.unit_dir; servesweep needs write access there)"
            ) from exc
        return folder / DROPIN_NAME

    def restore(self, *, keep_running: bool = False, restart: bool = False) -> str:
        """Give the unit back as it was before the sweep; returns what was done (or
        left, and how to undo it), in one line.

        Without ``keep_running``: remove servesweep's drop-in, reload, clear a
        ``failed`` state the last trial left (``reset-failed``) and, with ``restart``
        (the unit ran before the sweep), start it again with its own settings. With
        ``keep_running`` the last trial's instance goes on running through the drop-in.
        """
        dropin = self.dropin_dir / DROPIN_NAME
        if keep_running:
            if not dropin.exists():
                return ""
            return (
                f"{self.unit} keeps running the last trial's command from {dropin}; to give "
                f"it back its own settings: rm {dropin} && systemctl daemon-reload && "
                f"systemctl restart {self.unit}"
            )
        had_dropin = dropin.exists()
        with contextlib.suppress(FileNotFoundError):
            dropin.unlink()
        with contextlib.suppress(OSError):
            self.dropin_dir.rmdir()
        self.systemctl("daemon-reload")
        state = self.show(("ActiveState",)).get("ActiveState", "")
        done = []
        if had_dropin:
            done.append(f"removed {dropin}")
        if state == "failed":
            self.systemctl("reset-failed", self.unit, check=False)
            done.append("cleared its failed state")
        if restart:
            self.systemctl("start", "--no-block", self.unit)
            done.append("started it again with its own settings, as it ran before the sweep")
        self._cached_state = None
        return f"{self.unit}: " + "; ".join(done) if done else ""

    @property
    def warnings(self) -> list[str]:
        """What the unit's settings imply (Type, KillMode, Restart), read from systemd on
        first use and refreshed at every start."""
        if self._warnings is None:
            try:
                self._warnings = self.check_unit()
            except LaunchError as exc:
                return [f"cannot check unit {self.unit}: {exc}"]
        return list(self._warnings)

    def check_unit(self) -> list[str]:
        """The unit's warnings (Type, KillMode, Restart); LaunchError if it is not loaded."""
        props = self.show()
        self._require_loaded(props)
        return unit_warnings(self.unit, props)

    def _require_loaded(self, props: Mapping[str, str]) -> None:
        state = props.get("LoadState", "")
        if state != "loaded":
            raise LaunchError(
                f"unit {self.unit} is not loaded (LoadState={state or '?'}): servesweep manages "
                "an existing unit through a drop-in; create the unit file first"
            )

    # ---- Launcher protocol ------------------------------------------------------------

    def start(self, request: LaunchRequest) -> InstanceRecord:
        if not request.argv:
            raise LaunchError("the server command is empty (check server.executable)")
        before = self.show()
        self._require_loaded(before)
        if before.get("ActiveState") in _RUNNING_STATES:
            raise LaunchError(
                f"unit {self.unit} is already {before['ActiveState']} (MainPID "
                f"{before.get('MainPID', '?')}); stop the previous instance first"
            )
        tag = procs.new_instance_tag(request.trial_key)
        env = dict(request.env)
        if request.gpus and "CUDA_VISIBLE_DEVICES" not in env:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in request.gpus)
        env[procs.TAG_ENV] = tag
        self.write_dropin(request, env)
        self.systemctl("daemon-reload")
        if self.sd.mode == "execstart":
            self._check_execstart(request.argv)
        # Clears a failed state and the start rate limit (StartLimitBurst).
        self.systemctl("reset-failed", self.unit, check=False)
        started_at = time.time()
        passed = self._import_secrets()
        try:
            self.systemctl("start", "--no-block", self.unit)
            props = self._wait_started(before, started_at)
        finally:
            if passed:
                self.systemctl("unset-environment", *passed, check=False)
        self._warnings = unit_warnings(self.unit, props)
        invocation = props["InvocationID"]
        cgroup = props.get("ControlGroup") or f"/system.slice/{self.unit}"
        ns_main = parse_int(props.get("MainPID"))
        main = self._host_pid(cgroup, ns_main)
        log_path = Path(request.log_path)
        # ExecMainPID: the process that opened the unit's stdout stream (MainPID is 0
        # once it exited, and may move to another process on Type=notify).
        lines = journal.Invocation(
            self.unit, invocation, parse_int(props.get("ExecMainPID")) or ns_main, started_at
        )
        self._journals[invocation] = lines
        for old in list(self._journals)[:-_KEEP_JOURNALS]:
            del self._journals[old]
        copier = LogCopier(
            log_path,
            invocation,
            lines.follow_argv(self.sd.journalctl),
            functools.partial(lines.read, self.sd.journalctl),
        )
        copier.start(request.argv)
        self._copiers[invocation] = copier
        return InstanceRecord(
            launcher=self.name,
            pids=(main,) if main else (),
            unit=self.unit,
            invocation_id=invocation,
            cgroup=cgroup,
            port=request.port,
            gpus=tuple(request.gpus),
            log_path=str(log_path),
            started_at=started_at,
            fingerprint=request.fingerprint,
        )

    def launch_command(self, request: LaunchRequest) -> str:
        """The command the drop-in makes the unit run, with its environment."""
        return launch_command_text(request.argv, request.env)

    def _import_secrets(self) -> list[str]:
        """``server.env_passthrough``: ``systemctl import-environment NAME...`` copies the
        values from systemctl's own environment (servesweep's) into the manager's
        environment block, which every process the manager starts inherits. They are
        unset again as soon as the unit's main process runs: the values never appear on
        a command line or in the drop-in. Units started meanwhile inherit them too."""
        names = [n for n in self.spec.env_passthrough if os.environ.get(n) is not None]
        if names:
            self.systemctl("import-environment", *names)
        return names

    def current(self, port: int | None = None) -> InstanceRecord | None:
        """The unit's running invocation as an instance record (None when it is not
        running): what to stop, or to adopt, when the unit already runs before a sweep
        (for example the user's own server). Its log is not copied."""
        props = self.show()
        if props.get("ActiveState") not in _RUNNING_STATES or not props.get("InvocationID"):
            return None
        cgroup = props.get("ControlGroup") or f"/system.slice/{self.unit}"
        main = self._host_pid(cgroup, parse_int(props.get("MainPID")))
        return InstanceRecord(
            launcher=self.name,
            pids=(main,) if main else (),
            unit=self.unit,
            invocation_id=props["InvocationID"],
            cgroup=cgroup,
            port=port,
        )

    def _check_execstart(self, argv: Sequence[str]) -> None:
        shown = self.systemctl("show", "-p", "ExecStart", self.unit)
        # systemd shows words unquoted, with ``$`` still doubled (expanded at exec time).
        expected = " ".join(w.replace("$", "$$") for w in argv)
        if f"argv[]={expected} ;" not in shown:
            paths = self.systemctl("show", "-p", "DropInPaths", "--value", self.unit).strip()
            raise LaunchError(
                f"after daemon-reload, {self.unit}'s ExecStart is not the trial's command: "
                f"another drop-in may override it (drop-ins: {paths or 'none'}); "
                f"systemd shows: {shown.strip()[:300]}"
            )

    def _wait_started(self, before: Mapping[str, str], since: float) -> dict[str, str]:
        """Until systemd has a new invocation with a main PID (or it already ended)."""
        old_invocation = before.get("InvocationID", "")
        deadline = time.monotonic() + _START_WAIT
        delay = 0.01
        props: dict[str, str] = {}
        while time.monotonic() < deadline:
            props = self.show()
            inv = props.get("InvocationID", "")
            running = props.get("ActiveState") in _RUNNING_STATES
            if inv and inv != old_invocation and (parse_int(props.get("MainPID")) or not running):
                return props
            if not inv and not running and not props.get("Job"):
                # No job queued and no invocation: it ran and already ended cleanly,
                # and systemd dropped its state; the journal still knows it.
                found = self._last_invocation(since)
                if found and found != old_invocation:
                    return {**props, "InvocationID": found}
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        raise LaunchError(
            f"`systemctl start {self.unit}` queued, but no new invocation appeared within "
            f"{_START_WAIT:g}s (ActiveState={props.get('ActiveState', '?')}); "
            f"see `journalctl -u {self.unit}`"
        )

    def _last_invocation(self, since: float) -> str | None:
        """The invocation of the unit's last journal entry written after ``since``."""
        argv = [*self.sd.journalctl, "-u", self.unit, "-o", "json", "-n", "20", "-q", "--no-pager"]
        done = run_tool(argv, timeout=15.0, check=False, what=self.unit)
        found: str | None = None
        for line in done.stdout.splitlines():
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                entry = json.loads(line)
                if int(entry.get("__REALTIME_TIMESTAMP", 0)) < (since - 1.0) * 1e6:
                    continue
                value = entry.get("_SYSTEMD_INVOCATION_ID") or entry.get("INVOCATION_ID")
                if isinstance(value, str) and value:
                    found = value
        return found

    def _host_pid(self, cgroup: str, ns_pid: int | None) -> int | None:
        """systemd's MainPID as this machine's PID namespace sees it."""
        if not ns_pid:
            return None
        folder = self.cgroups.find(cgroup, ns_pid)
        return None if folder is None else host_pid(folder, ns_pid)

    def _state(self, instance: InstanceRecord) -> dict[str, str]:
        """``show()``, reused for a moment: the readiness gate polls many times a second."""
        now = time.monotonic()
        cached = self._cached_state
        if cached is not None and cached[0] == instance.invocation_id and now - cached[1] < _TTL:
            return cached[2]
        props = self.show()
        self._cached_state = (instance.invocation_id, now, props)
        return props

    def poll(self, instance: InstanceRecord) -> ExitStatus | None:
        main = instance.main_pid
        if main is not None and procs.alive(main, instance.started_at):
            return None  # its main process runs: no need to ask systemd
        props = self._state(instance)
        ours = props.get("InvocationID") == instance.invocation_id
        running = props.get("ActiveState") in _RUNNING_STATES
        if ours and running and props.get("SubState") != "auto-restart":
            return None
        if not ours:
            if not props.get("InvocationID") and props.get("Result") == "success":
                return ExitStatus(exit_code=0)  # a clean exit clears the invocation
            return ExitStatus()  # a later invocation replaced it: its status is gone
        return exit_status(props)

    def pids(self, instance: InstanceRecord) -> set[int]:
        if instance.cgroup:
            folder = self.cgroups.find(instance.cgroup)
            if folder is not None:
                return {p for p in UnitCgroup.procs(folder) if not procs.is_gone(p)}
        main = instance.main_pid
        if main is not None and procs.alive(main, instance.started_at):
            return procs.tree(main)
        return set()

    def stop(self, instance: InstanceRecord, grace: float, kill_timeout: float) -> StopResult:
        t0 = time.monotonic()
        notes: list[str] = []
        self._cached_state = None
        props = self.show()
        running = props.get("ActiveState") in _RUNNING_STATES
        if running and props.get("InvocationID") != instance.invocation_id:
            notes.append(
                f"{self.unit} runs invocation {props.get('InvocationID')} (not "
                f"{instance.invocation_id}); stopped it too"
            )
        first = self.pids(instance)
        signalled: tuple[int, ...] = ()
        killed: tuple[int, ...] = ()
        if running or first:
            try:
                self.systemctl("stop", "--no-block", self.unit)
            except LaunchError as exc:
                notes.append(f"systemctl stop failed ({exc}); SIGKILL after the grace")
            signalled = tuple(sorted(first))
            if not self._wait_down(instance, grace):
                left = self.pids(instance)
                state = self.show(["ActiveState"]).get("ActiveState", "?")
                notes.append(
                    f"{self.unit} still {state} with {len(left)} process(es) after "
                    f"{grace:g}s grace: SIGKILL to the cgroup"
                )
                self.systemctl("kill", "--signal=SIGKILL", self.unit, check=False)
                procs.signal_all(left, signal.SIGKILL)  # also if systemctl kill failed
                killed = tuple(sorted(left))
                if not self._wait_down(instance, kill_timeout):
                    notes.append(f"processes survived SIGKILL for {kill_timeout:g}s")
        survivors = tuple(sorted(self.pids(instance)))
        copier = self._copiers.pop(instance.invocation_id or "", None)
        if copier is not None:
            copier.finish()
        return StopResult(
            seconds=time.monotonic() - t0,
            signalled=signalled,
            killed=killed,
            survivors=survivors,
            notes=tuple(notes),
        )

    def _wait_down(self, instance: InstanceRecord, timeout: float) -> bool:
        """Until the cgroup is empty and systemd calls the unit stopped."""
        deadline = time.monotonic() + max(0.0, timeout)
        delay = 0.005
        while True:
            if not self.pids(instance):
                state = self.show(["ActiveState"]).get("ActiveState", "")
                if state not in _RUNNING_STATES:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, 0.1)

    def log_tail(self, instance: InstanceRecord, lines: int = 50) -> list[str]:
        if instance.invocation_id:
            with contextlib.suppress(LaunchError):
                text, ok = self.journal_of(instance).read(self.sd.journalctl, 15.0, lines)
                if ok:
                    return text.splitlines()[-lines:]
        return logs.tail(instance.log_path, lines)

    def finish_log(self, instance: InstanceRecord, timeout: float) -> bool:
        """Wait until the journal holds the exited invocation's last lines, then copy
        what the follower has not yet into the trial's log file."""
        invocation = instance.invocation_id
        if not invocation:
            return True
        deadline = time.monotonic() + timeout
        complete = journal.wait_complete(self.sd.journalctl, self.journal_of(instance), timeout)
        copier = self._copiers.pop(invocation, None)
        if copier is not None:
            complete = copier.finish(max(1.0, deadline - time.monotonic())) and complete
        return complete

    def alive(self, instance: InstanceRecord) -> bool:
        """Its invocation still runs, or the stopped unit's cgroup still holds processes
        (leftovers of it). Another invocation running the unit is not this instance."""
        self._cached_state = None
        props = self._state(instance)
        running = props.get("ActiveState") in _RUNNING_STATES
        if props.get("InvocationID") == instance.invocation_id:
            return running or bool(self.pids(instance))
        if running and props.get("InvocationID"):
            return False
        return bool(self.pids(instance))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
