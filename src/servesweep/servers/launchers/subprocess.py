"""The default launcher: the server as a child process in its own session.

Identity: the main PID, its process group, and an instance tag
(``SERVESWEEP_INSTANCE=<trial_key>-<hex>``) in the environment that every process of
the instance inherits — so workers that called ``setsid`` or outlived their parent
are still found. The tag is stored in ``InstanceRecord.invocation_id`` (for a
subprocess, the instance's invocation is its tag). stdout and stderr are appended to
the trial's log file after one header line that names the tag.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from servesweep.errors import LaunchError, TrialFailed
from servesweep.models import Evidence, FailureClass, InstanceRecord
from servesweep.servers import logs, procs
from servesweep.servers.engine_args import launch_command_text
from servesweep.servers.launchers.base import ExitStatus, Launcher, LaunchRequest, StopResult
from servesweep.servers.logs import write_header

__all__ = [
    "SubprocessLauncher",
    "collect_exits",
    "instance_pids",
    "stop_processes",
]


def child_env(request: LaunchRequest, tag: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(request.env)
    if request.gpus and "CUDA_VISIBLE_DEVICES" not in request.env:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in request.gpus)
    env[procs.TAG_ENV] = tag
    return env


def instance_pids(instance: InstanceRecord) -> set[int]:
    """Live PIDs of a locally started instance: the main PID's tree, its process
    group and every process carrying its tag."""
    found: set[int] = set()
    tag = instance.invocation_id
    main = instance.main_pid
    if main is not None and procs.alive(main, instance.started_at, tag):
        found |= procs.tree(main)
    if instance.pgid is not None and instance.pgid > 1:
        found |= procs.group_members(instance.pgid)
    if tag:
        found |= set(procs.tagged(tag))
    found.discard(os.getpid())
    return found


def stop_processes(
    discover: Callable[[], set[int]],
    grace: float,
    kill_timeout: float,
    *,
    pgid: int | None = None,
    on_poll: Callable[[], None] | None = None,
) -> StopResult:
    """SIGTERM (and SIGCONT) every process ``discover`` finds, wait up to ``grace``,
    SIGKILL what is left, wait up to ``kill_timeout``; never longer. A process that
    appears meanwhile (a worker forked during shutdown) gets the phase's signal too."""
    t0 = time.monotonic()
    pids = discover()
    if not pids:
        return StopResult(seconds=time.monotonic() - t0)
    sent: dict[signal.Signals, set[int]] = {signal.SIGTERM: set(), signal.SIGKILL: set()}

    def send(sig: signal.Signals, targets: set[int]) -> None:
        new = targets - sent[sig]
        if new:
            sent[sig] |= set(procs.signal_all(new, sig))
            if sig is signal.SIGTERM:
                procs.signal_all(new, signal.SIGCONT)  # a stopped process must run to exit

    def discover_and(sig: signal.Signals) -> Callable[[], set[int]]:
        def again() -> set[int]:
            found = discover()
            send(sig, found)
            return found

        return again

    send(signal.SIGTERM, pids)
    _signal_group(pgid, signal.SIGTERM)
    left = procs.wait_gone(pids, grace, refresh=discover_and(signal.SIGTERM), on_poll=on_poll)
    notes: list[str] = []
    if left:
        send(signal.SIGKILL, left)
        _signal_group(pgid, signal.SIGKILL)
        notes.append(f"{len(left)} process(es) still running after {grace:g}s grace: SIGKILL")
        left = procs.wait_gone(
            left, kill_timeout, refresh=discover_and(signal.SIGKILL), on_poll=on_poll
        )
        if left:
            notes.append(f"{len(left)} process(es) survived SIGKILL for {kill_timeout:g}s")
    return StopResult(
        seconds=time.monotonic() - t0,
        signalled=tuple(sorted(sent[signal.SIGTERM])),
        killed=tuple(sorted(sent[signal.SIGKILL])),
        survivors=tuple(sorted(left)),
        notes=tuple(notes),
    )


def collect_exits(
    children: Mapping[int, subprocess.Popen[bytes]],
    pids: Iterable[int],
    survivors: Iterable[int],
    timeout: float,
) -> None:
    """After a stop, wait for the exit status of our own children among ``pids``: gone
    for /proc can still be exiting for the kernel (threads tearing down), and a child
    not waited for stays a zombie (and warns when its Popen is collected)."""
    left = set(survivors)
    for pid in pids:
        child = children.get(pid)
        if child is not None and pid not in left:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=max(1.0, timeout))


def _signal_group(pgid: int | None, sig: signal.Signals) -> None:
    if pgid is None or pgid <= 1 or pgid == os.getpgrp():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _not_runnable(request: LaunchRequest, exc: OSError, log_path: Path) -> TrialFailed:
    program = request.argv[0]
    missing = isinstance(exc, FileNotFoundError)
    reason = "executable_not_found" if missing else "executable_not_runnable"
    what = "does not exist" if missing else f"cannot be run ({exc.strerror or exc})"
    return TrialFailed(
        FailureClass.START_CRASH,
        Evidence(
            message=f"the server program {program!r} {what}: nothing was started "
            "(check server.executable and PATH)",
            reason=reason,
            log_path=str(log_path),
            details={"argv0": program, "errno": exc.errno},
        ),
    )


class SubprocessLauncher(Launcher):
    """Runs the server as a child process; see the module docstring."""

    name = "subprocess"

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, request: LaunchRequest) -> InstanceRecord:
        if not request.argv:
            raise LaunchError("the server command is empty (check server.executable)")
        tag = procs.new_instance_tag(request.trial_key)
        log_path = Path(request.log_path)
        write_header(log_path, tag, request.argv)
        try:
            with open(log_path, "ab") as log:
                child = subprocess.Popen(
                    list(request.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=child_env(request, tag),
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            # the configuration's program is not there (or not runnable): a start that
            # failed with its evidence, not a fault of servesweep
            raise _not_runnable(request, exc, log_path) from None
        except ValueError as exc:
            raise LaunchError(
                f"cannot run the server command {request.argv[0]!r}: {exc} "
                "(check server.executable and PATH)"
            ) from exc
        self._children[child.pid] = child
        return InstanceRecord(
            launcher=self.name,
            pids=(child.pid,),
            pgid=child.pid,
            invocation_id=tag,
            port=request.port,
            gpus=tuple(request.gpus),
            log_path=str(log_path),
            started_at=time.time(),
            fingerprint=request.fingerprint,
        )

    def launch_command(self, request: LaunchRequest) -> str:
        return launch_command_text(request.argv, request.env)

    def poll(self, instance: InstanceRecord) -> ExitStatus | None:
        main = instance.main_pid
        if main is None:
            return ExitStatus()
        child = self._children.get(main)
        if child is not None:
            code = child.poll()
            if code is None:
                return None
            return ExitStatus(signal=-code) if code < 0 else ExitStatus(exit_code=code)
        if procs.alive(main, instance.started_at, instance.invocation_id):
            return None
        return ExitStatus()  # not our child: the status is not known

    def pids(self, instance: InstanceRecord) -> set[int]:
        self._reap()
        return instance_pids(instance)

    def stop(self, instance: InstanceRecord, grace: float, kill_timeout: float) -> StopResult:
        result = stop_processes(
            lambda: instance_pids(instance),
            grace,
            kill_timeout,
            pgid=instance.pgid,
            on_poll=self._reap,
        )
        collect_exits(self._children, instance.pids, result.survivors, kill_timeout)
        self._reap()
        return result

    def log_tail(self, instance: InstanceRecord, lines: int = 50) -> list[str]:
        return logs.tail(instance.log_path, lines)

    def finish_log(self, instance: InstanceRecord, timeout: float) -> bool:
        return True  # the instance writes its log file itself

    def alive(self, instance: InstanceRecord) -> bool:
        self._reap()
        main = instance.main_pid
        if main is not None and procs.alive(main, instance.started_at, instance.invocation_id):
            return True
        return bool(instance.invocation_id and procs.tagged(instance.invocation_id))

    def _reap(self) -> None:
        # a copy: slots or gates on other threads may start children meanwhile
        for child in list(self._children.values()):
            child.poll()
