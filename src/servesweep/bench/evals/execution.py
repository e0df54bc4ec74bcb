"""Run one sandboxed program to its end and judge it: output caps, the wall clock,
the memory of its process tree, the verdict line and the exit status.

Synchronous on purpose (the sandbox calls it in a worker thread): it never waits
for pipes to reach EOF, so a process that escaped and still holds a pipe cannot
hang it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Literal

from servesweep.bench.evals import procscan

__all__ = [
    "Outcome",
    "SandboxLimits",
    "SandboxResult",
    "Status",
    "execute",
    "judge",
    "read_verdict",
]

Status = Literal["pass", "fail", "timeout", "crash", "resource_limit"]

_VERDICT_MAX = 65536
_MEMORY_CHECK_S = 0.1


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0
    """Wall clock for one run, interpreter start included."""
    memory_bytes: int = 1 << 30
    """Address space (RLIMIT_AS)."""
    file_size_bytes: int = 16 << 20
    open_files: int = 64
    processes: int = 32
    """RLIMIT_NPROC of the run's own uid (root: a fresh uid per run)."""
    total_memory_bytes: int = 2 << 30
    """Resident memory of all the run's processes together (checked every 0.1 s):
    RLIMIT_AS is per process, and a run may have ``processes`` of them."""
    output_bytes: int = 1 << 20
    """Per stream; more output ends the run as ``resource_limit``."""
    tmpfs_bytes: int = 64 << 20
    """Size of the private working directory (bwrap)."""

    cpu_seconds: int | None = None
    """RLIMIT_CPU; default: the timeout rounded up, plus one (a backstop)."""

    @property
    def cpu_s(self) -> int:
        if self.cpu_seconds is not None:
            return self.cpu_seconds
        return math.ceil(self.timeout_s) + 1


@dataclass(frozen=True)
class SandboxResult:
    status: Status
    message: str = ""
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    uid: int | None = None
    """The run's own uid (root only): no process of it is left after the run."""


@dataclass
class Outcome:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    overflow: bool = False
    memory: bool = False


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def execute(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    nonce: str,
    verdict_w: int,
    limits: SandboxLimits,
) -> Outcome:
    """Run one program to its end, the wall-clock limit or the output cap.

    Synchronous on purpose (called in a worker thread): it never waits for pipes to
    reach EOF, so a process that escaped and still holds a pipe cannot hang it."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            pass_fds=(verdict_w,),
        )
    except OSError as exc:
        return Outcome(None, b"", f"cannot start {argv[0]}: {exc}".encode())
    outcome = Outcome(None, b"", b"")
    deadline = time.monotonic() + limits.timeout_s
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    buffers = {out_fd: bytearray(), err_fd: bytearray()}
    try:
        with contextlib.suppress(OSError):
            proc.stdin.write(nonce.encode() + b"\n")
        with contextlib.suppress(OSError):
            proc.stdin.close()
        with selectors.DefaultSelector() as sel:
            for fd in buffers:
                sel.register(fd, selectors.EVENT_READ)
            next_check = time.monotonic() + _MEMORY_CHECK_S
            while sel.get_map():
                now = time.monotonic()
                if now >= deadline:
                    outcome.timed_out = True
                    break
                if now >= next_check:
                    next_check = now + _MEMORY_CHECK_S
                    if procscan.tree_rss(proc.pid) > limits.total_memory_bytes:
                        outcome.memory = True
                        break
                wait = min(deadline, next_check) - now
                for key, _ in sel.select(timeout=max(wait, 0.0)):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    buf = buffers[key.fd]
                    room = limits.output_bytes - len(buf)
                    buf += chunk[: max(room, 0)]
                    if len(chunk) > room:
                        outcome.overflow = True
                if outcome.overflow:
                    break
        while not (outcome.timed_out or outcome.overflow or outcome.memory):
            # Pipes closed; the process exits right after (or hangs: same deadline).
            left = deadline - time.monotonic()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(min(left, _MEMORY_CHECK_S), 0.0))
            if proc.returncode is not None:
                break
            if procscan.tree_rss(proc.pid) > limits.total_memory_bytes:
                outcome.memory = True
            outcome.timed_out = time.monotonic() >= deadline
    finally:
        if proc.returncode is None:
            kill_group(proc.pid)
        outcome.returncode = proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    outcome.stdout, outcome.stderr = bytes(buffers[out_fd]), bytes(buffers[err_fd])
    return outcome


def read_verdict(fd: int, nonce: str) -> dict[str, str] | None:
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while len(data) < _VERDICT_MAX:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    for line in data.decode("utf-8", "replace").splitlines():
        if line.startswith(nonce + " "):
            with contextlib.suppress(ValueError):
                verdict = json.loads(line[len(nonce) + 1 :])
                if isinstance(verdict, dict) and verdict.get("status") in {
                    "pass",
                    "fail",
                    "crash",
                    "resource_limit",
                }:
                    return {
                        "status": str(verdict["status"]),
                        "message": str(verdict.get("message", "")),
                    }
    return None


def _signal_of(returncode: int | None) -> int | None:
    """Signal that ended the program: negative codes (direct child) or 128+N (bwrap,
    unshare and shells report a child's death this way)."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if 128 < returncode < 128 + 65:
        return returncode - 128
    return None


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def judge(
    outcome: Outcome, verdict: dict[str, str] | None, limits: SandboxLimits, seconds: float
) -> SandboxResult:
    out = outcome.stdout.decode("utf-8", "replace")
    err = outcome.stderr.decode("utf-8", "replace")

    def result(status: Status, message: str) -> SandboxResult:
        return SandboxResult(status, message, seconds, out, err, outcome.returncode)

    if outcome.overflow:
        return result("resource_limit", f"output over {limits.output_bytes} bytes")
    if outcome.memory:
        mib = limits.total_memory_bytes >> 20
        return result("resource_limit", f"memory of all its processes over {mib} MiB")
    if outcome.timed_out:
        return result("timeout", f"no result within {limits.timeout_s:g} s (wall clock)")
    if verdict is not None and (outcome.returncode == 0 or verdict["status"] != "pass"):
        status: Status = verdict["status"]  # type: ignore[assignment]
        return result(status, verdict["message"])
    sig = _signal_of(outcome.returncode)
    tail = (err.strip().splitlines() or [""])[-1][:300]
    if sig == signal.SIGXCPU:
        return result("resource_limit", f"CPU time limit ({limits.cpu_s} s)")
    if sig == signal.SIGXFSZ:
        return result("resource_limit", f"file size limit ({limits.file_size_bytes} bytes)")
    if sig is not None:
        return result("crash", f"killed by {_signal_name(sig)}; {tail}".rstrip("; "))
    return result(
        "crash",
        f"exited with code {outcome.returncode} before the tests finished; {tail}".rstrip("; "),
    )
