"""The docker launcher: each trial is one container.

``docker run -d --name <prefix>-<trial_key> --network host [--gpus "device=0,1"]
--label servesweep.* -e KEY=VALUE ... -e NAME ... <run_args> IMAGE <argv>``. Only the
trial's own environment goes in (not servesweep's), plus the instance tag
``SERVESWEEP_INSTANCE`` and, by name only, ``server.env_passthrough`` (docker takes
their values from its client's environment, so they are not on the command line).
With ``--gpus``, the container sees its GPUs numbered from 0, so a
``CUDA_VISIBLE_DEVICES`` naming host indexes is left out.

Identity: the container id, and its main process as the host sees it
(``State.Pid``). ``pids``: the main process's tree (``docker top`` when it is not
visible here). Logs: ``docker logs -f`` copied into the
trial's log file. ``stop``: ``docker stop -t <grace>`` (the image's stop signal,
then SIGKILL after the grace), ``docker kill`` if it still runs, then up to
``kill_timeout`` for every process to vanish, then ``docker rm -f`` (after the
log is saved). ``poll``: ``docker inspect`` (exit code, OOM kill).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servesweep.errors import LaunchError
from servesweep.models import InstanceRecord
from servesweep.servers import logs, procs
from servesweep.servers.launchers.base import ExitStatus, Launcher, LaunchRequest, StopResult
from servesweep.servers.launchers.external import LogCopier, run_tool
from servesweep.spec.schema import DockerSpec, ServerSpec

__all__ = ["DockerLauncher", "container_name", "gpus_flag"]

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_.-]")
_ALIVE = ("running", "created", "paused", "restarting")
_NO_SUCH = ("No such object", "No such container", "no such container")


def container_name(prefix: str, trial_key: str) -> str:
    """``<prefix>-<trial_key>`` with characters Docker refuses replaced by ``_``."""
    name = _NAME_BAD.sub("_", f"{prefix}-{trial_key}")
    if not name[0].isalnum():
        name = "s" + name
    return name[:200]


def gpus_flag(gpus: tuple[int, ...]) -> list[str]:
    """``--gpus "device=0,1"`` (the inner quotes keep the comma inside one field)."""
    if not gpus:
        return []
    return ["--gpus", '"device=' + ",".join(str(g) for g in gpus) + '"']


def _exit_status(state: Mapping[str, Any]) -> ExitStatus:
    code = state.get("ExitCode")
    if not isinstance(code, int):
        return ExitStatus()
    if state.get("OOMKilled"):
        return ExitStatus(exit_code=code, signal=9)
    # A container whose main process died of a signal exits 128+N.
    if 128 < code <= 128 + 64:
        return ExitStatus(exit_code=code, signal=code - 128)
    return ExitStatus(exit_code=code)


class DockerLauncher(Launcher):
    """Runs trials as Docker containers; see the module docstring."""

    name = "docker"

    def __init__(self, spec: ServerSpec) -> None:
        if spec.docker is None:
            raise LaunchError("launcher 'docker' needs a 'docker: {image: ...}' section")
        self.spec = spec
        self.dk: DockerSpec = spec.docker
        self._warnings: list[str] = []
        self._copiers: dict[str, LogCopier] = {}
        self._last_state: dict[str, dict[str, Any]] = {}

    @property
    def warnings(self) -> list[str]:
        """What watching the containers showed (one OOM-killed by its memory limit)."""
        return list(self._warnings)

    def docker(self, *args: str, check: bool = True, timeout: float = 60.0) -> str:
        done = run_tool([*self.dk.docker, *args], timeout=timeout, check=check, what="docker")
        return done.stdout

    def run_argv(self, request: LaunchRequest, name: str, tag: str) -> list[str]:
        """The ``docker run`` command line of one instance."""
        argv = [*self.dk.docker, "run", "-d", "--name", name]
        labels = [
            "--label",
            f"servesweep.trial={request.trial_key}",
            "--label",
            f"servesweep.fingerprint={request.fingerprint}",
            "--label",
            f"servesweep.instance={tag}",
        ]
        return self._container_argv(argv, request, {procs.TAG_ENV: tag}, labels)

    def launch_command(self, request: LaunchRequest) -> str:
        """``docker run --rm ... IMAGE ARGV``: the trial's container in the foreground,
        without servesweep's name, labels and instance tag."""
        argv = [*self.dk.docker, "run", "--rm"]
        return shlex.join(self._container_argv(argv, request, {}, []))

    def _container_argv(
        self,
        head: list[str],
        request: LaunchRequest,
        extra_env: Mapping[str, str],
        labels: list[str],
    ) -> list[str]:
        argv = list(head)
        if self.dk.network:
            argv += ["--network", self.dk.network]
        if self.dk.gpus_flag:
            argv += gpus_flag(tuple(request.gpus))
        argv += labels
        env = dict(request.env)
        if self.dk.gpus_flag and request.gpus:
            env.pop("CUDA_VISIBLE_DEVICES", None)
        env.update(extra_env)
        for key, value in sorted(env.items()):
            argv += ["-e", f"{key}={value}"]
        # Secrets by name only: docker copies the value from its client's environment.
        for key in self.spec.env_passthrough:
            if key not in env and os.environ.get(key) is not None:
                argv += ["-e", key]
        argv += [*self.dk.run_args, self.dk.image, *request.argv]
        return argv

    def inspect(self, container: str) -> dict[str, Any] | None:
        """``docker inspect`` of a container; None when it does not exist."""
        done = run_tool(
            [*self.dk.docker, "inspect", "--type", "container", container],
            timeout=30.0,
            check=False,
            what="docker",
        )
        if done.returncode != 0:
            if any(s in done.stderr for s in _NO_SUCH):
                return None
            raise LaunchError(f"`docker inspect {container}` failed: {done.stderr.strip()[-300:]}")
        try:
            data = json.loads(done.stdout)
        except ValueError as exc:
            raise LaunchError(f"`docker inspect {container}` printed no JSON") from exc
        return data[0] if isinstance(data, list) and data else None

    def _state(self, container: str) -> dict[str, Any] | None:
        info = self.inspect(container)
        if info is None:
            return self._last_state.get(container)
        state = info.get("State")
        if isinstance(state, dict):
            self._last_state[container] = state
            if state.get("OOMKilled"):
                note = f"container {container[:12]} was OOM-killed (its memory limit)"
                if note not in self._warnings:
                    self._warnings.append(note)
            return state
        return None

    # ---- Launcher protocol ------------------------------------------------------------

    def start(self, request: LaunchRequest) -> InstanceRecord:
        if not request.argv:
            raise LaunchError("the server command is empty (check server.executable)")
        name = container_name(self.dk.name_prefix, request.trial_key)
        old = self.inspect(name)
        if old is not None:
            state = old.get("State") or {}
            if state.get("Status") in _ALIVE:
                raise LaunchError(
                    f"container {name} ({str(old.get('Id', ''))[:12]}) is still "
                    f"{state.get('Status')}; stop the previous instance first"
                )
            self.docker("rm", "-f", name)  # a finished leftover of the same trial
        tag = procs.new_instance_tag(request.trial_key)
        started_at = time.time()
        out = self.docker(*self.run_argv(request, name, tag)[len(self.dk.docker) :], timeout=120.0)
        container = out.strip().splitlines()[-1] if out.strip() else ""
        if not re.fullmatch(r"[0-9a-f]{64}", container):
            raise LaunchError(f"`docker run` printed no container id: {out.strip()[-300:]!r}")
        state = self._state(container) or {}
        main = state.get("Pid")
        log_path = Path(request.log_path)
        copier = LogCopier(
            log_path,
            tag,
            [*self.dk.docker, "logs", "-f", container],
            [*self.dk.docker, "logs", container],
        )
        copier.start(request.argv)
        self._copiers[container] = copier
        return InstanceRecord(
            launcher=self.name,
            pids=(main,) if isinstance(main, int) and main > 0 else (),
            invocation_id=tag,
            container_id=container,
            port=request.port,
            gpus=tuple(request.gpus),
            log_path=str(log_path),
            started_at=started_at,
            fingerprint=request.fingerprint,
        )

    def _main_alive(self, instance: InstanceRecord) -> bool:
        main = instance.main_pid
        return main is not None and procs.alive(main, instance.started_at, instance.invocation_id)

    def poll(self, instance: InstanceRecord) -> ExitStatus | None:
        container = _require_id(instance)
        if self._main_alive(instance):
            return None  # its main process runs: no need to ask Docker
        state = self._state(container)
        if state is None:
            return ExitStatus()  # removed: its status is gone
        if state.get("Status") in ("running", "created", "paused"):
            return None
        return _exit_status(state)

    def pids(self, instance: InstanceRecord) -> set[int]:
        """The main process's tree (every process of the container's PID namespace
        descends from it); once it is gone, processes still carrying the instance tag;
        ``docker top`` when the main process is not visible here."""
        container = _require_id(instance)
        if self._main_alive(instance):
            assert instance.main_pid is not None
            return procs.tree(instance.main_pid)
        if instance.main_pid is not None and instance.invocation_id:
            return set(procs.tagged(instance.invocation_id))
        done = run_tool(
            [*self.dk.docker, "top", container, "-o", "pid"],
            timeout=30.0,
            check=False,
            what="docker",
        )
        if done.returncode != 0:
            return set()
        return {
            p for p in (int(w) for w in done.stdout.split() if w.isdigit()) if not procs.is_gone(p)
        }

    def stop(self, instance: InstanceRecord, grace: float, kill_timeout: float) -> StopResult:
        container = _require_id(instance)
        t0 = time.monotonic()
        notes: list[str] = []
        first = self.pids(instance)
        signalled: tuple[int, ...] = ()
        killed: tuple[int, ...] = ()
        exists = self.inspect(container) is not None
        if not exists:
            # Already removed: only leftovers carrying its tag can remain.
            left = procs.wait_gone(first, kill_timeout, refresh=lambda: self.pids(instance))
            self._copiers.pop(container, None)
            return StopResult(seconds=time.monotonic() - t0, survivors=tuple(sorted(left)))
        state = self._state(container)
        if state is not None and state.get("Status") in _ALIVE:
            signalled = tuple(sorted(first))
            seconds = max(0, math.ceil(grace))
            began = time.monotonic()
            try:
                self.docker(
                    "stop", "-t", str(seconds), container, timeout=seconds + kill_timeout + 30
                )
            except LaunchError as exc:
                notes.append(f"docker stop failed: {exc}")
            left = self.pids(instance)
            state = self._state(container)
            waited = time.monotonic() - began
            if state is not None and state.get("ExitCode") == 137 and waited >= seconds:
                # docker stop itself sent SIGKILL: the grace ran out.
                notes.append(f"still running after {seconds}s grace: docker sent SIGKILL")
                killed = signalled
            if left or (state is not None and state.get("Status") in _ALIVE):
                notes.append(f"{len(left)} process(es) still running after docker stop: kill")
                killed = tuple(sorted(left))
                with contextlib.suppress(LaunchError):
                    self.docker("kill", container, check=False, timeout=30.0)
        survivors = procs.wait_gone(
            self.pids(instance), kill_timeout, refresh=lambda: self.pids(instance)
        )
        if survivors:
            notes.append(f"{len(survivors)} process(es) survived SIGKILL for {kill_timeout:g}s")
        copier = self._copiers.pop(container, None)
        if copier is not None:
            copier.finish()
        elif instance.log_path:
            self._save_log(instance)
        if not survivors:
            self._state(container)  # remember the exit status before removing it
            try:
                self.docker("rm", "-f", container, check=False, timeout=60.0)
            except LaunchError as exc:
                notes.append(f"docker rm failed: {exc}")
        else:
            notes.append(f"container {container[:12]} kept: processes survive")
        return StopResult(
            seconds=time.monotonic() - t0,
            signalled=signalled,
            killed=killed,
            survivors=tuple(sorted(survivors)),
            notes=tuple(notes),
        )

    def _save_log(self, instance: InstanceRecord) -> None:
        """A container started by another servesweep process: save its log before rm."""
        container = _require_id(instance)
        with contextlib.suppress(LaunchError, OSError):
            text = self.docker("logs", container, check=True, timeout=30.0)
            with open(str(instance.log_path), "a", encoding="utf-8") as fh:
                fh.write(text)

    def log_tail(self, instance: InstanceRecord, lines: int = 50) -> list[str]:
        container = _require_id(instance)
        with contextlib.suppress(LaunchError):
            done = run_tool(
                [*self.dk.docker, "logs", "--tail", str(lines), container],
                timeout=30.0,
                check=True,
                what="docker",
                merge_stderr=True,
            )
            return done.stdout.splitlines()[-lines:]
        return logs.tail(instance.log_path, lines)

    def finish_log(self, instance: InstanceRecord, timeout: float) -> bool:
        """Once the container exited, ``docker logs`` has all of its output: end the
        follower and copy what it had not yet."""
        copier = self._copiers.pop(_require_id(instance), None)
        return copier.finish(timeout) if copier is not None else True

    def alive(self, instance: InstanceRecord) -> bool:
        container = _require_id(instance)
        state = self.inspect(container)
        if state is not None and (state.get("State") or {}).get("Status") in _ALIVE:
            return True
        return bool(self.pids(instance))

    def exit_details(self, instance: InstanceRecord) -> dict[str, Any]:
        """What Docker says about the container's end: ``oom_killed``, ``exit_code``,
        ``error`` (empty while it runs or when nothing is known)."""
        state = self._state(_require_id(instance)) or {}
        if state.get("Status") in ("running", "created", "paused"):
            return {}
        return {
            "oom_killed": bool(state.get("OOMKilled")),
            "exit_code": state.get("ExitCode"),
            "error": state.get("Error") or "",
        }


def _require_id(instance: InstanceRecord) -> str:
    if not instance.container_id:
        raise LaunchError("this instance record has no container id (not a docker instance)")
    return instance.container_id
