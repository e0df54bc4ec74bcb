"""The command launcher: user-supplied shell commands for anything else
(Kubernetes, ssh, Slurm, a site's own wrapper).

``server.commands`` holds ``start`` (required), ``stop``, ``status`` and
``pid_file`` templates. Placeholders: ``{args}`` (the trial's argv after the
program, shell-quoted), ``{argv}`` (the whole argv, shell-quoted), ``{port}``,
``{host}``, ``{model}``, ``{gpus}`` (comma list), ``{trial}``, ``{log}``,
``{pid_file}`` and ``{param.NAME}`` (the value of ``--NAME`` in the argv; ``true``
for a bare flag). Other braces (``${VAR}``, awk programs) are left alone; ``{{`` and
``}}`` are literal braces.

Identity, in order of preference: the PID written to ``pid_file`` by the start
command; the first number printed by ``status``; the start command's own process
(a command that runs the server in the foreground). ``status`` exits 0 while the
server runs. Every command runs in its own session with the instance tag in its
environment, so processes started on this machine are found and stopped like a
subprocess instance's.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from servesweep.errors import LaunchError
from servesweep.models import InstanceRecord
from servesweep.servers import logs, procs
from servesweep.servers.engine_args import launch_command_text
from servesweep.servers.launchers.base import ExitStatus, Launcher, LaunchRequest, StopResult
from servesweep.servers.launchers.subprocess import (
    child_env,
    collect_exits,
    instance_pids,
    stop_processes,
)
from servesweep.servers.logs import write_header
from servesweep.spec.schema import CommandSpec, ServerSpec

__all__ = ["CommandLauncher", "render"]

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([a-z_]+(?:\.[A-Za-z0-9_.-]+)?)\}")
_PID_WAIT = 10.0
_STATUS_CACHE = 1.0
_TOOL_TIMEOUT = 30.0


def _param(argv: Sequence[str], name: str) -> str | None:
    names = {f"--{name}", f"--{name.replace('_', '-')}", f"--{name.replace('-', '_')}"}
    for i, word in enumerate(argv):
        flag, eq, value = word.partition("=")
        if flag in names:
            if eq:
                return value
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            return "true" if nxt is None or nxt.startswith("--") else nxt
    return None


def render(template: str, values: Mapping[str, str], argv: Sequence[str]) -> str:
    """Fill the placeholders of one command template."""

    def sub(match: re.Match[str]) -> str:
        text = match.group(0)
        if text == "{{":
            return "{"
        if text == "}}":
            return "}"
        key = match.group(1)
        if key.startswith("param."):
            value = _param(argv, key[6:])
            if value is None:
                raise LaunchError(f"command placeholder {text}: no --{key[6:]} in the trial's argv")
            return shlex.quote(value)
        return values.get(key, text)

    return _PLACEHOLDER.sub(sub, template)


class CommandLauncher(Launcher):
    """Runs the server through ``server.commands``; see the module docstring."""

    name = "command"

    def __init__(self, spec: ServerSpec) -> None:
        if spec.commands is None:
            raise LaunchError("launcher 'command' needs a 'commands: {start: ...}' section")
        self.spec = spec
        self.cmds: CommandSpec = spec.commands
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._status: dict[str, tuple[float, int, str]] = {}
        self._values: dict[str, dict[str, str]] = {}

    # ---- helpers -------------------------------------------------------------------

    def _values_for(self, request: LaunchRequest, tag: str) -> dict[str, str]:
        argv = list(request.argv)
        pid_file = self.cmds.pid_file or ""
        values = {
            "args": shlex.join(argv[1:]),
            "argv": shlex.join(argv),
            "port": str(request.port),
            "host": request.host,
            "model": self.spec.model or "",
            "gpus": ",".join(str(g) for g in request.gpus),
            "trial": request.trial_key,
            "log": str(request.log_path),
            "tag": tag,
        }
        values["pid_file"] = render(pid_file, values, argv) if pid_file else ""
        return values

    def _run(self, template: str, instance: InstanceRecord, timeout: float) -> tuple[int, str]:
        values = self._values.get(instance.invocation_id or "") or {
            "port": str(instance.port or self.spec.port),
            "host": self.spec.host,
            "model": self.spec.model or "",
            "gpus": ",".join(str(g) for g in instance.gpus),
            "log": instance.log_path or "",
            "pid_file": instance.pid_file or "",
            "tag": instance.invocation_id or "",
        }
        command = render(template, values, [])
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", command],
                capture_output=True,
                timeout=timeout,
                start_new_session=True,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return 124, f"timed out after {timeout:g}s: {command}"
        except OSError as exc:
            raise LaunchError(f"cannot run {command!r}: {exc}") from exc
        return done.returncode, (done.stdout + done.stderr).decode(errors="replace")

    def _status_rc(self, instance: InstanceRecord) -> tuple[int, str] | None:
        if not self.cmds.status:
            return None
        key = instance.invocation_id or ""
        cached = self._status.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[0] < _STATUS_CACHE:
            return cached[1], cached[2]
        rc, out = self._run(self.cmds.status, instance, _TOOL_TIMEOUT)
        self._status[key] = (now, rc, out)
        return rc, out

    @staticmethod
    def _read_pid(path: str) -> int | None:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    # ---- the Launcher interface -----------------------------------------------------

    def launch_command(self, request: LaunchRequest) -> str:
        """The start command as this trial renders it, with the trial's environment."""
        command = render(self.cmds.start, self._values_for(request, ""), list(request.argv))
        return launch_command_text(["/bin/sh", "-c", command], request.env)

    def start(self, request: LaunchRequest) -> InstanceRecord:
        tag = procs.new_instance_tag(request.trial_key)
        values = self._values_for(request, tag)
        command = render(self.cmds.start, values, list(request.argv))
        log_path = Path(request.log_path)
        write_header(log_path, tag, ["/bin/sh", "-c", command])
        pid_file = values["pid_file"] or None
        if pid_file:
            Path(pid_file).unlink(missing_ok=True)
        try:
            with open(log_path, "ab") as log:
                child = subprocess.Popen(
                    ["/bin/sh", "-c", command],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=child_env(request, tag),
                    start_new_session=True,
                )
        except OSError as exc:
            raise LaunchError(f"cannot run the start command {command!r}: {exc}") from exc
        self._children[child.pid] = child
        self._values[tag] = values
        main = child.pid
        if pid_file:
            deadline = time.monotonic() + _PID_WAIT
            while time.monotonic() < deadline:
                found = self._read_pid(pid_file)
                if found is not None:
                    main = found
                    break
                rc = child.poll()
                if rc not in (None, 0):
                    break  # the start command failed: readiness reports its exit
                time.sleep(0.02)
        return InstanceRecord(
            launcher=self.name,
            pids=(main,) if main == child.pid else (main, child.pid),
            pgid=child.pid,
            invocation_id=tag,
            pid_file=pid_file,
            port=request.port,
            gpus=tuple(request.gpus),
            log_path=str(log_path),
            started_at=time.time(),
            fingerprint=request.fingerprint,
        )

    def poll(self, instance: InstanceRecord) -> ExitStatus | None:
        main = instance.main_pid
        child = self._children.get(main) if main is not None else None
        if child is not None:
            code = child.poll()
            if code is None:
                return None
            if code != 0 or not self.cmds.status:
                return ExitStatus(signal=-code) if code < 0 else ExitStatus(exit_code=code)
        elif main is not None and procs.alive(main, instance.started_at, instance.invocation_id):
            return None
        status = self._status_rc(instance)
        if status is not None and status[0] == 0:
            return None
        return ExitStatus()

    def pids(self, instance: InstanceRecord) -> set[int]:
        for child in self._children.values():
            child.poll()
        return instance_pids(instance)

    def stop(self, instance: InstanceRecord, grace: float, kill_timeout: float) -> StopResult:
        t0 = time.monotonic()
        notes: list[str] = []
        if self.cmds.stop:
            rc, out = self._run(self.cmds.stop, instance, max(grace, 1.0))
            if rc != 0:
                notes.append(f"stop command exited {rc}: {out.strip()[-200:]}")
        left = max(0.0, grace - (time.monotonic() - t0))
        result = stop_processes(lambda: self.pids(instance), left, kill_timeout, pgid=instance.pgid)
        collect_exits(self._children, instance.pids, result.survivors, kill_timeout)
        survivors = result.survivors
        if not survivors and self.cmds.status:
            self._status.pop(instance.invocation_id or "", None)
            deadline = time.monotonic() + kill_timeout
            while (status := self._status_rc(instance)) is not None and status[0] == 0:
                if time.monotonic() >= deadline:
                    notes.append("the status command still reports the server running")
                    survivors = (instance.main_pid or 0,)
                    break
                time.sleep(0.2)
                self._status.pop(instance.invocation_id or "", None)
        return StopResult(
            seconds=time.monotonic() - t0,
            signalled=result.signalled,
            killed=result.killed,
            survivors=survivors,
            notes=(*notes, *result.notes),
        )

    def log_tail(self, instance: InstanceRecord, lines: int = 50) -> list[str]:
        return logs.tail(instance.log_path, lines)

    def finish_log(self, instance: InstanceRecord, timeout: float) -> bool:
        return True  # the instance writes its log file itself

    def alive(self, instance: InstanceRecord) -> bool:
        if self.pids(instance):
            return True
        status = self._status_rc(instance)
        return status is not None and status[0] == 0
