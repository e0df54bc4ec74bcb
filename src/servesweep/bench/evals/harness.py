"""The program that runs inside the sandbox: drop privileges, set limits, run the
candidate and its hidden tests, and report one verdict line.

This file is executed as a script by a fresh interpreter (``python -I -S -B``) in
the sandbox; it imports nothing outside the standard library and must stay so.

Protocol (all inputs are read *before* the candidate runs):

* ``argv[1]``: path of the job file, JSON ``{"candidate", "test", "entry_point",
  "uid", "gid", "workdir", "limits": {...}, "verdict_fd"}``;
* stdin: one line, the nonce; stdin is replaced by ``/dev/null`` afterwards;
* the verdict goes to ``verdict_fd`` as ``NONCE {"status": ..., "message": ...}``.

The nonce keeps a program that merely prints or writes a verdict-shaped line from
being taken for a pass; the parent requires the nonce and a clean exit.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import sys
import traceback
from typing import Any, NoReturn

_LIMIT_ERRNOS = {errno.EAGAIN, errno.EMFILE, errno.ENFILE, errno.EFBIG, errno.ENOSPC, errno.ENOMEM}
_MESSAGE_MAX = 2000


def _where(exc: BaseException, sources: dict[str, str]) -> str:
    """``test line 3: assert candidate(1) == 2`` for the innermost frame in our code."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename in sources and frame.lineno:
            lines = sources[frame.filename].splitlines()
            text = lines[frame.lineno - 1].strip() if frame.lineno <= len(lines) else ""
            name = frame.filename.strip("<>")
            return f" (at {name} line {frame.lineno}: {text})" if text else ""
    return ""


def _classify(
    exc: BaseException, sources: dict[str, str], limits: dict[str, int]
) -> dict[str, str]:
    text = f"{type(exc).__name__}: {exc}".rstrip(": ")
    where = _where(exc, sources)
    if isinstance(exc, MemoryError):
        mib = limits.get("memory_bytes", 0) // 2**20
        return {"status": "resource_limit", "message": f"out of memory (limit {mib} MiB){where}"}
    if isinstance(exc, OSError) and exc.errno in _LIMIT_ERRNOS:
        return {"status": "resource_limit", "message": f"{text}{where}"}
    if isinstance(exc, SystemExit):
        return {"status": "crash", "message": f"exited with {exc.code!r} before the tests finished"}
    if isinstance(exc, AssertionError):
        return {"status": "fail", "message": f"{text}{where}"}
    return {"status": "fail", "message": f"{text}{where}"}


def _drop_privileges(uid: int | None, gid: int | None) -> None:
    if gid is not None:
        os.setgroups([])
        os.setgid(gid)
    if uid is not None:
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise RuntimeError("could not drop privileges")


def _set_limits(limits: dict[str, int]) -> None:
    pairs = {
        resource.RLIMIT_CPU: limits["cpu_s"],
        resource.RLIMIT_AS: limits["memory_bytes"],
        resource.RLIMIT_FSIZE: limits["file_size_bytes"],
        resource.RLIMIT_NOFILE: limits["open_files"],
        resource.RLIMIT_NPROC: limits["processes"],
        resource.RLIMIT_CORE: 0,
    }
    for which, value in pairs.items():
        hard = value + 1 if which == resource.RLIMIT_CPU else value
        resource.setrlimit(which, (value, hard))


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        job: dict[str, Any] = json.load(f)
    nonce = sys.stdin.readline().strip()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    verdict_fd = int(job["verdict_fd"])
    limits: dict[str, int] = job["limits"]

    def report(verdict: dict[str, str]) -> NoReturn:
        verdict["message"] = verdict.get("message", "")[:_MESSAGE_MAX]
        line = f"{nonce} {json.dumps(verdict)}\n".encode()
        for stream in (sys.stdout, sys.stderr):
            # The candidate may have replaced or closed it.
            with contextlib.suppress(BaseException):
                stream.flush()
        try:
            os.write(verdict_fd, line)
        finally:
            os._exit(0)

    _drop_privileges(job.get("uid"), job.get("gid"))
    os.chdir(job["workdir"])
    _set_limits(limits)
    name = str(job["entry_point"])
    sources = {"<candidate>": str(job["candidate"]), "<test>": str(job["test"])}
    del job
    # Not "__main__": an answer's `if __name__ == "__main__":` demo block must not run.
    namespace: dict[str, Any] = {"__name__": "candidate", "__builtins__": __builtins__}
    try:
        exec(compile(sources["<candidate>"], "<candidate>", "exec"), namespace)
        exec(compile(sources["<test>"], "<test>", "exec"), namespace)
        candidate = namespace.get(name)
        check = namespace.get("check")
        if not callable(candidate):
            report({"status": "fail", "message": f"the answer defines no function {name!r}"})
        if not callable(check):
            report({"status": "fail", "message": "the test code defines no check(candidate)"})
        check(candidate)
    except BaseException as exc:
        report(_classify(exc, sources, limits))
    report({"status": "pass", "message": ""})


if __name__ == "__main__":
    main()
