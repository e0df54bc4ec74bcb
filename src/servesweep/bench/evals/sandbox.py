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
import contextlib
import dataclasses
import json
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from servesweep.bench.evals import procscan
from servesweep.errors import SandboxError

__all__ = ["Backend", "Sandbox", "SandboxLimits", "SandboxResult"]

Backend = Literal["bwrap", "unshare", "none"]
Status = Literal["pass", "fail", "timeout", "crash", "resource_limit"]

_SANDBOX_DIR = "/sandbox"
_WORK_DIR = "/tmp"
_UID_RANGE = (1_900_000_000, 2_000_000_000)
_VERDICT_MAX = 65536
_MEMORY_CHECK_S = 0.1
_PROBE_CANDIDATE = "import socket\n\ndef interfaces():\n    return socket.if_nameindex()\n"
_PROBE_TEST = "def check(candidate):\n    assert [n for _, n in candidate()] == ['lo']\n"
_PROBED: dict[tuple[Backend, int, str], str | None] = {}
"""Per (backend, euid, interpreter): None when it works, else why not."""


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
                self._executor, _execute, argv, env, str(rundir), nonce, verdict_w, self.limits
            )
            os.close(verdict_w)
            verdict_w = -1
            verdict = _read_verdict(verdict_r, nonce)
        finally:
            if verdict_w >= 0:
                os.close(verdict_w)
            os.close(verdict_r)
            if uid is not None:
                await asyncio.get_running_loop().run_in_executor(
                    self._executor, procscan.kill_uid, uid
                )
            shutil.rmtree(rundir, ignore_errors=True)
        judged = _judge(outcome, verdict, self.limits, time.monotonic() - started)
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


@dataclass
class _Outcome:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    overflow: bool = False
    memory: bool = False


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _execute(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    nonce: str,
    verdict_w: int,
    limits: SandboxLimits,
) -> _Outcome:
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
        return _Outcome(None, b"", f"cannot start {argv[0]}: {exc}".encode())
    outcome = _Outcome(None, b"", b"")
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
            _kill_group(proc.pid)
        outcome.returncode = proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    outcome.stdout, outcome.stderr = bytes(buffers[out_fd]), bytes(buffers[err_fd])
    return outcome


def _read_verdict(fd: int, nonce: str) -> dict[str, str] | None:
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


def _judge(
    outcome: _Outcome, verdict: dict[str, str] | None, limits: SandboxLimits, seconds: float
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
