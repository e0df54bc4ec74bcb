"""Run one sandboxed check to its end: the judge and the candidate's process side
by side, output caps, the wall clock, the memory limit, the verdict; what they
left is an :class:`~servesweep.bench.evals.outcome.Outcome`.

:func:`execute` is synchronous on purpose (the sandbox calls it in a worker
thread): it never waits for pipes to reach EOF, so a process that escaped and
still holds a pipe cannot hang it. It measures the run's own time, from starting
the processes to their end (not the time queued behind other runs).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Literal

import servesweep.bench.evals.procscan as procscan
from servesweep.bench.evals.cgroups import RunCgroup
from servesweep.bench.evals.outcome import Ended, Outcome, SandboxLimits, parse_verdict

__all__ = ["Launch", "execute"]

_VERDICT_MAX = 65536
_CHECK_S = 0.1
_GRACE_S = 1.0
_GATE = 'read -r go && exec "$@"'
"""Runs as the first process of a gated launch: waits until servesweep moved it
into its cgroups, then becomes the real command (everything it starts stays in)."""


@dataclass(eq=False)
class Launch:
    """How to start one of the two processes of a run."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    pass_fds: tuple[int, ...]
    """Closed here once the process started (servesweep keeps no copy)."""
    user: int | None = None
    """Start it as this uid/gid (no supplementary groups)."""
    cgroup: RunCgroup | None = None
    """Moved in before it runs anything (a gate, :data:`_GATE`)."""


class _Proc:
    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        gated = launch.cgroup is not None
        argv = ["/bin/sh", "-c", _GATE, "sh", *launch.argv] if gated else launch.argv
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=launch.env,
            cwd=launch.cwd,
            start_new_session=True,
            pass_fds=launch.pass_fds,
            user=launch.user,
            group=launch.user,
            extra_groups=[] if launch.user is not None else None,
        )
        assert self.popen.stdin and self.popen.stdout and self.popen.stderr
        self.buffers = {
            self.popen.stdout.fileno(): bytearray(),
            self.popen.stderr.fileno(): bytearray(),
        }
        try:
            if launch.cgroup is not None:
                launch.cgroup.join(self.popen.pid)
                self.popen.stdin.write(b"go\n")
                self.popen.stdin.flush()
            # stdin stays open for the run: the sandboxed program's lifeline
            # (confine.py), at its end only once servesweep is gone.
        except OSError:
            self.kill()
            self.popen.wait()
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        if self.launch.cgroup is not None:
            self.launch.cgroup.kill()

    def close(self) -> None:
        for stream in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()

    def ended(self, on_its_own: bool) -> Ended:
        assert self.popen.stdout and self.popen.stderr
        return Ended(
            self.popen.returncode,
            bytes(self.buffers[self.popen.stdout.fileno()]),
            bytes(self.buffers[self.popen.stderr.fileno()]),
            on_its_own,
        )


def _close_fds(launch: Launch) -> None:
    for fd in launch.pass_fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def execute(candidate: Launch, judge: Launch, verdict_fd: int, limits: SandboxLimits) -> Outcome:
    """Start the judge and the candidate's process, run until the judge is done
    (its verdict descriptor reaches EOF), the wall clock, an output cap or the
    memory limit; kill what is left. Owns the launches' ``pass_fds`` and closes
    ``verdict_fd``."""
    outcome = Outcome()
    started = time.monotonic()
    procs: dict[str, _Proc] = {}
    pending = [judge, candidate]
    try:
        for name, launch in (("judge", judge), ("candidate", candidate)):
            try:
                procs[name] = _Proc(launch)
            finally:
                _close_fds(launch)
                pending.remove(launch)
    except OSError as exc:
        outcome.error = f"cannot start the sandbox ({exc})"
    if outcome.error:
        for launch in pending:
            _close_fds(launch)
        for proc in procs.values():
            proc.kill()
            proc.popen.wait()
            proc.close()
        os.close(verdict_fd)
        return outcome
    try:
        verdict = _watch(procs, verdict_fd, limits, started, outcome)
        outcome.verdict = parse_verdict(bytes(verdict))
        _finish(procs, outcome, started + limits.timeout_s)
    finally:
        for proc in procs.values():
            if proc.popen.returncode is None:
                proc.kill()
        for proc in procs.values():
            proc.popen.wait()
        outcome.seconds = time.monotonic() - started
        for proc in procs.values():
            _drain(proc, limits)
        outcome.candidate = procs["candidate"].ended(outcome.candidate.on_its_own)
        outcome.judge = procs["judge"].ended(True)
        for proc in procs.values():
            proc.close()
        os.close(verdict_fd)
    if not outcome.memory and any(
        p.launch.cgroup and p.launch.cgroup.memory_hit() for p in procs.values()
    ):
        outcome.memory = "cgroup"
    return outcome


def _memory_over(procs: dict[str, _Proc], limits: SandboxLimits) -> Literal["", "cgroup", "watch"]:
    groups = [p.launch.cgroup for p in procs.values() if p.launch.cgroup is not None]
    if groups:
        return "cgroup" if any(g.memory_hit() for g in groups) else ""
    total = sum(procscan.tree_rss(p.pid) for p in procs.values())
    return "watch" if total > limits.total_memory_bytes else ""


def _watch(
    procs: dict[str, _Proc],
    verdict_fd: int,
    limits: SandboxLimits,
    started: float,
    outcome: Outcome,
) -> bytearray:
    """Read output and the verdict until the judge is done or a limit ends the run."""
    verdict = bytearray()
    deadline = started + limits.timeout_s
    os.set_blocking(verdict_fd, False)
    with selectors.DefaultSelector() as sel:
        sel.register(verdict_fd, selectors.EVENT_READ, None)
        for proc in procs.values():
            for fd in proc.buffers:
                sel.register(fd, selectors.EVENT_READ, proc)
        next_check = started + _CHECK_S
        while True:
            now = time.monotonic()
            if now >= deadline:
                outcome.timed_out = True
                return verdict
            if now >= next_check:
                next_check = now + _CHECK_S
                outcome.memory = _memory_over(procs, limits)
                if outcome.memory:
                    return verdict
            for key, _ in sel.select(timeout=max(min(deadline, next_check) - now, 0.0)):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if key.data is None:
                    if not chunk:
                        return verdict  # the judge's tree is gone: its verdict is complete
                    verdict += chunk[: max(_VERDICT_MAX - len(verdict), 0)]
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                if _keep(key.data, key.fd, chunk, limits):
                    outcome.overflow = True
                    return verdict


def _keep(proc: _Proc, fd: int, chunk: bytes, limits: SandboxLimits) -> bool:
    """Add output within the cap; True when there was more than the cap."""
    buf = proc.buffers[fd]
    room = limits.output_bytes - len(buf)
    buf += chunk[: max(room, 0)]
    return len(chunk) > room


def _finish(procs: dict[str, _Proc], outcome: Outcome, deadline: float) -> None:
    """After the verdict: let both end on their own for a moment (the candidate's
    process ends when the judge's requests reach EOF; when it is said to be gone,
    its exit status says why). Ending in order leaves no orphan for init to reap."""
    if outcome.timed_out or outcome.overflow or outcome.memory:
        return
    for proc in (procs["judge"], procs["candidate"]):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=max(min(_GRACE_S, deadline - time.monotonic()), 0))
    outcome.candidate.on_its_own = procs["candidate"].popen.poll() is not None


def _drain(proc: _Proc, limits: SandboxLimits) -> None:
    """Output still in the pipes after the end (never waits for EOF)."""
    for fd in proc.buffers:
        os.set_blocking(fd, False)
        for _ in range(64):
            try:
                chunk = os.read(fd, 65536)
            except (BlockingIOError, OSError):
                break
            if not chunk or _keep(proc, fd, chunk, limits):
                break
