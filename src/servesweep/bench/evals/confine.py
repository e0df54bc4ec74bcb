"""What both sandboxed programs do to themselves before anything else: stdin from
``/dev/null``, a root of their own (the ``unshare`` backend, :mod:`rootfs`), the
run's own uid (when servesweep is root and the backend does not start them as
it), death with their parent, the working directory and the resource limits.

Standard library only: copied next to ``sandboxed_candidate.py`` and
``sandboxed_judge.py`` in the sandbox and imported there.
"""

from __future__ import annotations

import ctypes
import os
import resource
import select
import signal
from typing import Any

__all__ = ["confine"]

_PR_SET_PDEATHSIG = 1


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


def _die_with_parent(lifeline: int) -> None:
    """SIGKILL when the parent dies (a change of uid cleared what the backend set),
    and exit now if servesweep is already gone: ``lifeline`` is a pipe whose only
    writer is servesweep, at its end once servesweep died."""
    if ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(125)
    poller = select.poll()
    poller.register(lifeline, select.POLLIN)
    if any(events & (select.POLLHUP | select.POLLERR) for _, events in poller.poll(0)):
        os._exit(125)
    os.close(lifeline)


def confine(job: dict[str, Any]) -> None:
    """Apply the job's ``rootfs``, ``uid``/``gid``, ``workdir`` and ``limits``."""
    lifeline = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if job.get("rootfs"):
        if __package__:
            from servesweep.bench.evals.rootfs import enter
        else:
            from rootfs import enter  # type: ignore[import-not-found,no-redef]
        enter(job["rootfs"])
    _drop_privileges(job.get("uid"), job.get("gid"))
    _die_with_parent(lifeline)
    os.chdir(job["workdir"])
    _set_limits(job["limits"])
