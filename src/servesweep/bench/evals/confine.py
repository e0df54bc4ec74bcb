"""What both sandboxed programs do to themselves before anything else: stdin from
``/dev/null``, the run's own uid (when servesweep is root and the backend does not
start them as it), the working directory and the resource limits.

Standard library only: copied next to ``sandboxed_candidate.py`` and
``sandboxed_judge.py`` in the sandbox and imported there.
"""

from __future__ import annotations

import os
import resource
from typing import Any

__all__ = ["confine"]


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


def confine(job: dict[str, Any]) -> None:
    """Apply the job's ``uid``/``gid``, ``workdir`` and ``limits``."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    _drop_privileges(job.get("uid"), job.get("gid"))
    os.chdir(job["workdir"])
    _set_limits(job["limits"])
