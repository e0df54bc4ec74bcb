"""The sandbox for model-generated code, and the judge that checks it.

One check is two processes, each a fresh interpreter in a sandbox of its own
(:mod:`servesweep.bench.evals.sandboxed_candidate`, ``sandboxed_judge``):

* the candidate's process loads the answer's program and answers calls;
* the judge runs the hidden tests; the tests' calls of the answer's functions go
  to the candidate's process and come back as plain data (:mod:`wire`). The tests,
  the expected values and the verdict never enter the candidate's process, so no
  patching, frame walking or ``__eq__`` trick there can change the verdict.

Each process gets:

* no network: a new network namespace (bubblewrap ``bwrap --unshare-net``, else
  util-linux ``unshare --net``). Where neither works the sandbox refuses with
  :class:`SandboxError`; the ``none`` backend (no namespaces, the host's
  filesystem and network) runs only when asked for by name with
  ``host_filesystem=True`` (``eval.sandbox: host-filesystem``), never by ``auto``;
* its own PID namespace, so every process it starts dies with it, and with
  servesweep (bwrap ``--die-with-parent``; for unshare a parent-death signal on
  ``unshare`` and on the namespace's first process, see :mod:`confine`);
* its own root: a read-only view of only ``/usr`` and the interpreter, a private
  size-limited tmpfs as working directory and ``HOME``, nothing else of the host
  (bwrap; for unshare a mount namespace the process builds itself,
  :mod:`rootfs`); no user namespaces of its own (bwrap ``--disable-userns``, for
  unshare a chroot below the namespace's root), so no private mounts;
* a scrubbed environment (``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` only);
* when servesweep runs as root, a fresh unprivileged uid/gid per process and run,
  from its first instruction with bwrap;
* a memory and a pids cgroup of its own where the machine allows it
  (:mod:`cgroups`; else the resident memory is watched);
* rlimits on CPU time, address space, file size, open files, processes, no core;
* a wall-clock timeout that kills both, and after every run every process left
  with the run's uids or in its cgroups;
* stdout/stderr captured up to a cap (more is a ``resource_limit``).

The result of one run is a :class:`SandboxResult` with ``status`` ``pass``,
``fail`` (with the assertion message), ``timeout``, ``crash`` or ``resource_limit``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import servesweep.bench.evals.leftovers as leftovers
import servesweep.bench.evals.procscan as procscan
from servesweep.bench.evals.cgroups import Cgroups, RunCgroup
from servesweep.bench.evals.commands import Backend, Commands, Role, bwrap_can_disable_userns
from servesweep.bench.evals.execution import Launch, execute
from servesweep.bench.evals.outcome import SandboxLimits, SandboxResult, decide
from servesweep.errors import SandboxError

__all__ = ["UNPROTECTED", "Backend", "Sandbox", "SandboxLimits", "SandboxResult", "describe"]

_UID_RANGE = (1_900_000_000, 2_000_000_000)
_SANDBOX_PIDS = 4
"""Processes of the sandbox itself in a run's pids cgroup (bwrap, its init)."""
_PROBE_CANDIDATE = (
    "import os, socket\n\n"
    "def interfaces():\n"
    "    return [n for _, n in socket.if_nameindex()], os.listdir('/tmp'), os.access('/', 2)\n"
)
_PROBE_TEST = "def check(candidate):\n    assert candidate() == (['lo'], [], False)\n"
"""Only a loopback of its own, an empty private /tmp, a read-only root."""
UNPROTECTED: dict[Backend, str] = {
    "bwrap": "nothing of the threat model in docs/evals.md (with bubblewrap older than "
    "0.8, generated code may make user namespaces)",
    "unshare": "nothing of the threat model in docs/evals.md",
    "none": "generated code sees and may change every file the run's uid can reach "
    "(world-readable secrets, world-writable files, /tmp, /dev/shm), reaches the "
    "network and the host's loopback, and a process it leaves in the background "
    "outlives a servesweep killed with SIGKILL",
}
"""What each backend does not protect (docs/evals.md has the table)."""
_PROBED: dict[tuple[Backend, int, str], str | None] = {}
"""Per (backend, euid, interpreter): None when it works, else why not."""


class Sandbox:
    """Runs candidate programs against their tests; see the module docstring.

    ``backend="auto"`` takes bwrap, then unshare (both: no view of the host's
    files, no network); ``"none"`` (the host's filesystem and network) is used
    only when asked for by name with ``host_filesystem=True``. ``parallel`` is the
    most runs at once; ``python`` the interpreter for generated code (default: the
    base interpreter of this one).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        host_filesystem: bool = False,
        backend: Literal["auto", "bwrap", "unshare", "none"] = "auto",
        parallel: int = 4,
        python: str | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.host_filesystem = host_filesystem
        self.requested = backend
        self._backend: Backend | None = None
        self._root = os.geteuid() == 0
        self._commands = Commands(self.limits, python, self._root)
        self._executor = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="sandbox")
        self._cgroups: Cgroups | None = None
        self._cgroups_why = ""
        self._prepared = False
        self._preparing = threading.Lock()
        self._stuck: list[RunCgroup] = []

    def close(self) -> None:
        """Let the worker threads go (runs in flight finish first)."""
        self._executor.shutdown(wait=True)
        for group in self._stuck:
            group.remove(deadline_s=1.0)

    @property
    def backend(self) -> Backend | None:
        """The backend in use once :meth:`start` succeeded."""
        return self._backend

    @property
    def python(self) -> str:
        """The interpreter generated code runs with."""
        return self._commands.python

    @property
    def memory_limit(self) -> str:
        """How the memory limit holds once started: ``cgroup v1``/``cgroup v2``
        (the kernel's) or ``watch`` (resident memory, checked every 0.1 s)."""
        return self._cgroups.description if self._cgroups else "watch"

    @property
    def nested_userns(self) -> bool:
        """Whether generated code may make user namespaces (and so private mounts)."""
        if self._backend == "unshare":
            return False  # it lives in a chroot, where the kernel refuses them
        return not (self._backend == "bwrap" and bwrap_can_disable_userns())

    @property
    def warnings(self) -> tuple[str, ...]:
        """What this sandbox cannot enforce here, with advice (once started)."""
        found = []
        if self._backend == "none":
            found.append(
                "generated code ran with the host's filesystem and network "
                f"(eval.sandbox: host-filesystem): {UNPROTECTED['none']}; "
                "apt-get install bubblewrap to isolate it"
            )
        if self._prepared and self._cgroups is None:
            found.append(
                f"the eval sandbox's memory limit is only watched ({self._cgroups_why}): "
                "memory held in files (tmpfs, memfd) is not counted; run servesweep as root "
                "on a machine with memory cgroups for a kernel-enforced limit"
            )
        if self._backend is not None and self.nested_userns:
            found.append(
                "generated code may create user namespaces here (needs bubblewrap >= 0.8 "
                "with --disable-userns)"
            )
        return tuple(found)

    def _prepare(self) -> None:
        """Once: remove what killed runs left, find the cgroups."""
        with self._preparing:
            if self._prepared:
                return
            leftovers.clean_folders(tempfile.gettempdir())
            self._cgroups, self._cgroups_why = Cgroups.detect()
            if self._cgroups is not None:
                self._cgroups.clean_dead()
            self._prepared = True

    async def start(self) -> Backend:
        """Find a backend that really isolates the network here (probed once per
        process; two concurrent first calls may both probe, which is harmless)."""
        if self._backend is not None:
            return self._backend
        await asyncio.get_running_loop().run_in_executor(self._executor, self._prepare)
        order: list[Backend]
        if self.requested == "auto":
            order = ["bwrap", "unshare"]
        elif self.requested == "none" and not self.host_filesystem:
            raise SandboxError(
                "the eval sandbox backend 'none' lets generated code read and write the "
                "host's files and network; apt-get install bubblewrap, or set "
                "eval.sandbox: host-filesystem to accept that"
            )
        else:
            order = [self.requested]
        reasons = []
        for backend in order:
            key = (backend, os.geteuid(), self._commands.python)
            if key not in _PROBED:
                _PROBED[key] = await self._probe(backend)
            reason = _PROBED[key]
            if reason is None:
                self._backend = backend
                return backend
            reasons.append(f"{backend}: {reason}")
        raise SandboxError(
            "cannot run generated code safely here ("
            + "; ".join(reasons)
            + "): apt-get install bubblewrap (and allow user namespaces), or set "
            "eval.sandbox: host-filesystem to run it with the host's files and network "
            "(unsafe)"
        )

    async def _probe(self, backend: Backend) -> str | None:
        tool = {"bwrap": "bwrap", "unshare": "unshare", "none": None}[backend]
        if tool and shutil.which(tool) is None:
            return f"{tool} is not installed"
        if backend == "unshare" and not self._root:
            return "needs root (use bwrap, which works unprivileged)"
        if backend == "unshare" and shutil.which("setpriv", path="/usr/bin:/bin") is None:
            return "setpriv (util-linux) is not installed"
        test = _PROBE_TEST if backend != "none" else "def check(candidate):\n    candidate()\n"
        result = await self._run(backend, _PROBE_CANDIDATE, test, "interfaces", "")
        if result.status == "pass":
            return None
        detail = (result.stderr.strip().splitlines() or [result.message])[-1]
        return f"{result.status}: {detail}"[:300]

    async def run(
        self, candidate: str, test: str, entry_point: str, *, prompt: str = ""
    ) -> SandboxResult:
        """Check ``candidate`` against ``test`` (code defining ``check(candidate)``,
        called with the answer's ``entry_point``). ``prompt``, when it is Python,
        gives the tests the task's own helpers and imports. Never raises for
        anything the program does."""
        backend = self._backend or await self.start()
        return await self._run(backend, candidate, test, entry_point, prompt)

    async def _run(
        self, backend: Backend, candidate: str, test: str, entry_point: str, prompt: str
    ) -> SandboxResult:
        job = {"program": candidate, "test": test, "entry_point": entry_point, "prompt": prompt}
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._run_blocking, backend, job
        )

    def _run_blocking(self, backend: Backend, job: dict[str, str]) -> SandboxResult:
        """One run in a worker thread, from the run folder to its cleanup."""
        fresh = secrets.SystemRandom().sample(range(*_UID_RANGE), 2) if self._root else [None] * 2
        uids: dict[Role, int | None] = {"candidate": fresh[0], "judge": fresh[1]}
        rundir = Path(tempfile.mkdtemp(prefix=leftovers.owner_prefix()))
        groups: list[RunCgroup] = []
        fds: list[int] = []
        try:
            requests_r, requests_w = os.pipe()
            fds += [requests_r, requests_w]
            replies_r, replies_w = os.pipe()
            fds += [replies_r, replies_w]
            verdict_r, verdict_w = os.pipe()
            fds += [verdict_r, verdict_w]
            os.chmod(rundir, 0o711)
            candidate_job = {
                "program": job["program"],
                "requests_fd": requests_r,
                "replies_fd": replies_w,
            }
            judge_job = {
                "test": job["test"],
                "prompt": job["prompt"],
                "entry_point": job["entry_point"],
                "requests_fd": requests_w,
                "replies_fd": replies_r,
                "verdict_fd": verdict_w,
            }
            launches: dict[Role, Launch] = {}
            plan: tuple[tuple[Role, dict[str, Any], tuple[int, ...]], ...] = (
                ("candidate", candidate_job, (requests_r, replies_w)),
                ("judge", judge_job, (requests_w, replies_r, verdict_w)),
            )
            for role, role_job, keep in plan:
                group = self._cgroup(rundir.name, role)
                if group is not None:
                    groups.append(group)
                launches[role] = self._commands.launch(
                    backend, role, rundir, uids[role], role_job, keep
                )
                launches[role].cgroup = group
            fds = []  # execute owns them now
            outcome = execute(launches["candidate"], launches["judge"], verdict_r, self.limits)
        except OSError as exc:
            raise SandboxError(f"cannot set up a sandbox run in {rundir}: {exc}") from exc
        finally:
            for fd in fds:
                os.close(fd)
            self._cleanup(groups, uids, rundir)
        return dataclasses.replace(decide(outcome, self.limits), uid=uids["candidate"])

    def _cgroup(self, name: str, role: Role) -> RunCgroup | None:
        if self._cgroups is None:
            return None
        return self._cgroups.create(
            f"{name}-{role}",
            self.limits.total_memory_bytes,
            self.limits.processes + _SANDBOX_PIDS,
        )

    def _cleanup(self, groups: list[RunCgroup], uids: dict[Role, int | None], rundir: Path) -> None:
        for group in groups:
            group.kill()
        procscan.kill_uids({uid for uid in uids.values() if uid is not None})
        for group in groups:
            if not group.remove():
                self._stuck.append(group)
        shutil.rmtree(rundir, ignore_errors=True)


def describe(setting: str) -> dict[str, Any]:
    """What ``servesweep doctor`` says of an ``eval.sandbox`` setting here: the
    backend that will run generated code (found as a run would: a real probe), what
    it does not protect and what it cannot enforce; ``error`` when none can run."""
    host = setting == "host-filesystem"
    backend: Any = "none" if host else setting
    box = Sandbox(backend=backend, host_filesystem=host, parallel=1)
    try:
        chosen = asyncio.run(box.start())
        warnings = list(box.warnings)
        memory = box.memory_limit
    except SandboxError as exc:
        return {"setting": setting, "backend": None, "error": str(exc)}
    finally:
        box.close()
    return {
        "setting": setting,
        "backend": chosen,
        "does_not_protect": UNPROTECTED[chosen],
        "memory_limit": memory,
        "warnings": warnings,
    }
