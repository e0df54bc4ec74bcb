"""The sandbox for model-generated code.

A candidate program and its hidden tests run only in a fresh interpreter in a
separate process (:mod:`servesweep.bench.evals.harness`) with:

* no network: a new network namespace (bubblewrap ``bwrap --unshare-net``, else
  util-linux ``unshare --net``). Where neither works the sandbox refuses with
  :class:`SandboxError` unless ``allow_no_netns`` is set;
* its own PID namespace, so every process it starts dies with it;
* with bwrap, a read-only view of only ``/usr`` and the interpreter, a private
  size-limited tmpfs as working directory and ``HOME``, nothing else of the host;
* a scrubbed environment (``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` only);
* when servesweep runs as root, a fresh unprivileged uid/gid per run (so the
  process limit counts only this run's processes, and the uid owns nothing);
* rlimits on CPU time, address space, file size, open files, processes, no core;
* a wall-clock timeout that kills the whole process group, and after every run
  every process left with the run's uid;
* stdout/stderr captured up to a cap (more is a ``resource_limit``).

The result of one run is a :class:`SandboxResult` with ``status`` ``pass``,
``fail`` (with the assertion message), ``timeout``, ``crash`` or ``resource_limit``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Literal

from servesweep.bench.evals import procscan
from servesweep.bench.evals.execution import (
    SandboxLimits,
    SandboxResult,
    execute,
    judge,
    read_verdict,
)
from servesweep.errors import SandboxError

__all__ = ["Backend", "Sandbox", "SandboxLimits", "SandboxResult"]

Backend = Literal["bwrap", "unshare", "none"]

_SANDBOX_DIR = "/sandbox"
_WORK_DIR = "/tmp"
_UID_RANGE = (1_900_000_000, 2_000_000_000)
_PROBE_CANDIDATE = "import socket\n\ndef interfaces():\n    return socket.if_nameindex()\n"
_PROBE_TEST = "def check(candidate):\n    assert [n for _, n in candidate()] == ['lo']\n"
_PROBED: dict[tuple[Backend, int, str], str | None] = {}
"""Per (backend, euid, interpreter): None when it works, else why not."""


def _interpreter(python: str | None) -> tuple[str, str]:
    """The interpreter for generated code and its prefix (the folder to expose).
    Default: this interpreter's base (not a venv's): only the stdlib is needed."""
    if python is not None:
        exe = os.path.realpath(shutil.which(python) or python)
        prefix = os.path.dirname(os.path.dirname(exe))
        return exe, "/usr" if prefix.startswith("/usr") else prefix
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return exe, os.path.realpath(sys.base_prefix)


def _world_readable(path: str) -> bool:
    """Whether any user may reach ``path`` (x on every parent folder, r on it)."""
    try:
        target = Path(path).resolve()
        for parent in target.parents:
            if not parent.stat().st_mode & 0o001:
                return False
        return bool(target.stat().st_mode & 0o004)
    except OSError:
        return False


def _harness_source() -> str:
    return (resources.files("servesweep.bench.evals") / "harness.py").read_text(encoding="utf-8")


class Sandbox:
    """Runs candidate programs against their tests; see the module docstring.

    ``backend="auto"`` takes bwrap, then unshare; ``"none"`` (no network
    isolation) is used only with ``allow_no_netns=True``. ``parallel`` is the most
    runs at once; ``python`` the interpreter for generated code (default: the base
    interpreter of this one).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        allow_no_netns: bool = False,
        backend: Literal["auto", "bwrap", "unshare", "none"] = "auto",
        parallel: int = 4,
        python: str | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.allow_no_netns = allow_no_netns
        self.requested = backend
        self._backend: Backend | None = None
        self._harness = _harness_source()
        self._python, self._prefix = _interpreter(python)
        self._root = os.geteuid() == 0
        self._executor = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="sandbox")

    def close(self) -> None:
        """Let the worker threads go (runs in flight finish first)."""
        self._executor.shutdown(wait=True)

    @property
    def backend(self) -> Backend | None:
        """The backend in use once :meth:`start` succeeded."""
        return self._backend

    async def start(self) -> Backend:
        """Find a backend that really isolates the network here (probed once per
        process; two concurrent first calls may both probe, which is harmless)."""
        if self._backend is not None:
            return self._backend
        order: list[Backend]
        if self.requested == "auto":
            order = ["bwrap", "unshare"]
            if self.allow_no_netns:
                order.append("none")
        elif self.requested == "none" and not self.allow_no_netns:
            raise SandboxError(
                "the eval sandbox backend 'none' runs generated code with the host's "
                "network; set eval.allow_no_netns: true to accept that"
            )
        else:
            order = [self.requested]
        reasons = []
        for backend in order:
            key = (backend, os.geteuid(), self._python)
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
            + "). Install bubblewrap (apt-get install bubblewrap) or allow user "
            "namespaces; or set eval.allow_no_netns: true to run it with the host's "
            "network (unsafe)"
        )

    async def _probe(self, backend: Backend) -> str | None:
        tool = {"bwrap": "bwrap", "unshare": "unshare", "none": None}[backend]
        if tool and shutil.which(tool) is None:
            return f"{tool} is not installed"
        if backend == "unshare" and not self._root:
            return "needs root (use bwrap, which works unprivileged)"
        test = _PROBE_TEST if backend != "none" else "def check(candidate):\n    pass\n"
        result = await self._run(backend, _PROBE_CANDIDATE, test, "interfaces")
        if result.status == "pass":
            return None
        detail = (result.stderr.strip().splitlines() or [result.message])[-1]
        return f"{result.status}: {detail}"[:300]

    async def run(self, candidate: str, test: str, entry_point: str) -> SandboxResult:
        """Run ``candidate``, then ``test`` (which defines ``check(candidate)``), then
        ``check(<entry_point>)``; never raises for anything the program does."""
        backend = self._backend or await self.start()
        return await self._run(backend, candidate, test, entry_point)

    async def _run(
        self, backend: Backend, candidate: str, test: str, entry_point: str
    ) -> SandboxResult:
        started = time.monotonic()
        uid = secrets.SystemRandom().randrange(*_UID_RANGE) if self._root else None
        rundir = Path(tempfile.mkdtemp(prefix="servesweep-eval-"))
        verdict_r, verdict_w = os.pipe()
        try:
            argv, env, workdir = self._command(backend, rundir, uid)
            job = {
                "candidate": candidate,
                "test": test,
                "entry_point": entry_point,
                "uid": uid,
                "gid": uid,
                "workdir": workdir,
                "verdict_fd": verdict_w,
                "limits": {
                    "cpu_s": self.limits.cpu_s,
                    "memory_bytes": self.limits.memory_bytes,
                    "file_size_bytes": self.limits.file_size_bytes,
                    "open_files": self.limits.open_files,
                    "processes": self.limits.processes,
                },
            }
            (rundir / "job.json").write_text(json.dumps(job), encoding="utf-8")
            (rundir / "harness.py").write_text(self._harness, encoding="utf-8")
            nonce = secrets.token_hex(16)
            outcome = await asyncio.get_running_loop().run_in_executor(
                self._executor, execute, argv, env, str(rundir), nonce, verdict_w, self.limits
            )
            os.close(verdict_w)
            verdict_w = -1
            verdict = read_verdict(verdict_r, nonce)
        finally:
            if verdict_w >= 0:
                os.close(verdict_w)
            os.close(verdict_r)
            if uid is not None:
                await asyncio.get_running_loop().run_in_executor(
                    self._executor, procscan.kill_uid, uid
                )
            shutil.rmtree(rundir, ignore_errors=True)
        judged = judge(outcome, verdict, self.limits, time.monotonic() - started)
        return dataclasses.replace(judged, uid=uid)

    def _command(
        self, backend: Backend, rundir: Path, uid: int | None
    ) -> tuple[list[str], dict[str, str], str]:
        py = [self._python, "-I", "-S", "-B"]
        base_env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        if backend == "bwrap":
            argv = ["bwrap", *self._bwrap_args(rundir, uid is not None)]
            argv += ["--", *py, f"{_SANDBOX_DIR}/harness.py", f"{_SANDBOX_DIR}/job.json"]
            return argv, base_env, _WORK_DIR
        work = rundir / "work"
        work.mkdir()
        if uid is not None:
            os.chmod(rundir, 0o711)
            os.chown(work, uid, uid)
            if not _world_readable(self._python) or not _world_readable(self._prefix):
                # Without bwrap's private view, the unprivileged uid must reach the
                # interpreter itself (a pyenv under /root is out of its reach).
                system = shutil.which("python3", path="/usr/bin:/bin")
                if system and _world_readable(system):
                    py[0] = system
        env = {**base_env, "HOME": str(work), "TMPDIR": str(work)}
        argv = [*py, str(rundir / "harness.py"), str(rundir / "job.json")]
        if backend == "unshare":
            argv = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", *argv]
        return argv, env, str(work)

    def _bwrap_args(self, rundir: Path, as_root: bool) -> list[str]:
        args = [
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session",
            "--hostname", "sandbox", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "HOME", _WORK_DIR, "--setenv", "TMPDIR", _WORK_DIR,
            "--ro-bind", "/usr", "/usr",
        ]  # fmt: skip
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
        # The interpreter outside /usr (pyenv, conda...): bind it with traversable
        # parents (bwrap would copy a 0700 /root, unreadable after the uid drop).
        made: set[str] = set()
        for path in (self._prefix, os.path.dirname(self._python)):
            if any(path == m or path.startswith(m + "/") for m in ("/usr", *made)):
                continue
            parent = Path(path).parent
            for up in reversed([parent, *parent.parents]):
                if str(up) != "/" and str(up) not in made:
                    args += ["--perms", "0755", "--dir", str(up)]
                    made.add(str(up))
            args += ["--ro-bind", path, path]
            made.add(path)
        args += [
            "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(self.limits.tmpfs_bytes), "--tmpfs", _WORK_DIR,
            "--ro-bind", str(rundir), _SANDBOX_DIR, "--chdir", _WORK_DIR,
        ]  # fmt: skip
        if as_root:
            args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        return args
