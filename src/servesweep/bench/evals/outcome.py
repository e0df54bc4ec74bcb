"""What a sandboxed run left and what it means: the limits, the outcome of the two
processes, and the one place that decides a run's status.

Only the judge's verdict can make a run ``pass``; everything else (a limit, the
wall clock, the candidate's death) can only make it something else.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Ended",
    "Outcome",
    "SandboxLimits",
    "SandboxResult",
    "Status",
    "decide",
    "parse_verdict",
]

Status = Literal["pass", "fail", "timeout", "crash", "resource_limit"]


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0
    """Wall clock for one run, interpreter start included."""
    memory_bytes: int = 1 << 30
    """Address space (RLIMIT_AS) per process."""
    file_size_bytes: int = 16 << 20
    open_files: int = 64
    processes: int = 32
    """RLIMIT_NPROC of the run's own uid (root: a fresh uid per run), and the
    pids cgroup's limit (plus the sandbox's own few)."""
    total_memory_bytes: int = 2 << 30
    """Memory of all the candidate's processes together, files in memory
    included: a memory cgroup where the machine allows it, else a watch of their
    resident memory every 0.1 s."""
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
    """The run's own time, from starting its processes to their end."""
    stdout: str = ""
    stderr: str = ""
    """The candidate's output (the judge's only when it ended without a verdict)."""
    exit_code: int | None = None
    """The candidate's exit status when it ended on its own, else None."""
    uid: int | None = None
    """The candidate's own uid (root only): no process of it is left after the run."""


@dataclass
class Ended:
    """What one process left."""

    returncode: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    on_its_own: bool = False
    """It ended before servesweep killed it."""


@dataclass
class Outcome:
    candidate: Ended = field(default_factory=Ended)
    judge: Ended = field(default_factory=Ended)
    verdict: dict[str, str] | None = None
    seconds: float = 0.0
    timed_out: bool = False
    overflow: bool = False
    memory: Literal["", "cgroup", "watch"] = ""
    error: str = ""
    """servesweep could not start the run."""


def parse_verdict(data: bytes) -> dict[str, str] | None:
    """The judge's verdict line, or None when there is none that makes sense."""
    for line in data.decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError):
            verdict = json.loads(line)
            if isinstance(verdict, dict) and verdict.get("status") in {
                "pass",
                "fail",
                "crash",
                "resource_limit",
                "gone",
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


def _tail(output: bytes) -> str:
    return (output.decode("utf-8", "replace").strip().splitlines() or [""])[-1][:300]


def _death(ended: Ended, limits: SandboxLimits, why: str) -> tuple[Status, str]:
    """Why the candidate's process stopped answering, from its exit status."""
    if not ended.on_its_own:
        return "crash", f"the program stopped answering the tests ({why})"
    tail = _tail(ended.stderr)
    sig = _signal_of(ended.returncode)
    if sig == signal.SIGXCPU:
        return "resource_limit", f"CPU time limit ({limits.cpu_s} s)"
    if sig == signal.SIGXFSZ:
        return "resource_limit", f"file size limit ({limits.file_size_bytes} bytes)"
    if sig is not None:
        return "crash", f"killed by {_signal_name(sig)}; {tail}".rstrip("; ")
    return "crash", f"exited with code {ended.returncode} before the tests finished; {tail}".rstrip(
        "; "
    )


def decide(outcome: Outcome, limits: SandboxLimits) -> SandboxResult:
    """The run's status and message. Only the judge's verdict can say ``pass``."""
    ended = outcome.candidate
    out = ended.stdout.decode("utf-8", "replace")
    err = ended.stderr.decode("utf-8", "replace")

    def result(status: Status, message: str, stderr: str = err) -> SandboxResult:
        code = ended.returncode if ended.on_its_own else None
        return SandboxResult(status, message, outcome.seconds, out, stderr, code)

    if outcome.error:
        return result("crash", outcome.error)
    if outcome.overflow:
        return result("resource_limit", f"output over {limits.output_bytes} bytes")
    if outcome.memory:
        mib = limits.total_memory_bytes >> 20
        how = "its memory cgroup" if outcome.memory == "cgroup" else "watched"
        return result("resource_limit", f"memory of all its processes over {mib} MiB ({how})")
    if outcome.timed_out:
        return result("timeout", f"no result within {limits.timeout_s:g} s (wall clock)")
    verdict = outcome.verdict
    if verdict is not None and outcome.judge.returncode == 0:
        if verdict["status"] == "gone":
            return result(*_death(ended, limits, verdict["message"]))
        status: Status = verdict["status"]  # type: ignore[assignment]
        return result(status, verdict["message"])
    judge = outcome.judge
    sig = _signal_of(judge.returncode)
    how = f"killed by {_signal_name(sig)}" if sig else f"exit code {judge.returncode}"
    if sig == signal.SIGXCPU:
        return result("resource_limit", f"CPU time limit of the tests ({limits.cpu_s} s)")
    text = judge.stderr.decode("utf-8", "replace")
    return result(
        "crash", f"the tests ended without a verdict ({how}); {_tail(judge.stderr)}", text
    )
