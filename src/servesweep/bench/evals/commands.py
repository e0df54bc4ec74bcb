"""How each process of a sandboxed run is started: its folder (the program or
the tests, the scripts, the job), its command line for the backend (bwrap,
unshare, none), its interpreter and its uid.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from servesweep.bench.evals.execution import Launch
from servesweep.bench.evals.outcome import SandboxLimits

__all__ = ["Backend", "Commands", "Role", "bwrap_can_disable_userns"]

Backend = Literal["bwrap", "unshare", "none"]
Role = Literal["candidate", "judge"]

_SANDBOX_DIR = "/sandbox"
_WORK_DIR = "/tmp"
_SCRIPTS = {
    "candidate": ("wire.py", "confine.py", "rootfs.py", "sandboxed_candidate.py"),
    "judge": ("wire.py", "confine.py", "rootfs.py", "sandboxed_judge.py"),
}
_TOPS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64")
_UNSHARE = [
    "setpriv", "--pdeathsig", "KILL", "--",  # dies with servesweep, and so does all below
    "unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--",
]  # fmt: skip


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


def _for_any_user(exe: str, prefix: str) -> tuple[str, str]:
    """As root, generated code runs under a fresh uid from its first instruction:
    the interpreter must be readable by anyone (a pyenv under /root is not; then
    the system's python3)."""
    if _world_readable(exe) and _world_readable(prefix):
        return exe, prefix
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system and _world_readable(system):
        return os.path.realpath(system), "/usr"
    return exe, prefix


@functools.cache
def bwrap_can_disable_userns() -> bool:
    """bubblewrap >= 0.8 has ``--disable-userns``."""
    try:
        text = subprocess.run(
            ["bwrap", "--help"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "--disable-userns" in text


def _script(name: str) -> str:
    return (resources.files("servesweep.bench.evals") / name).read_text(encoding="utf-8")


class Commands:
    """Writes a role's folder and says how to start it, for one interpreter and
    one set of limits. As root the interpreter must be readable by any user
    (generated code runs as a fresh uid from its first instruction)."""

    def __init__(self, limits: SandboxLimits, python: str | None, root: bool) -> None:
        self.limits = limits
        self.python, self._prefix = _interpreter(python)
        if root:
            self.python, self._prefix = _for_any_user(self.python, self._prefix)
        self._scripts = {name: _script(name) for names in _SCRIPTS.values() for name in names}

    def launch(
        self,
        backend: Backend,
        role: Role,
        rundir: Path,
        uid: int | None,
        job: dict[str, Any],
        fds: tuple[int, ...],
    ) -> Launch:
        """Write the role's folder (scripts and job) and say how to start it."""
        folder = rundir / role
        folder.mkdir(mode=0o700)
        for name in _SCRIPTS[role]:
            (folder / name).write_text(self._scripts[name], encoding="utf-8")
        py = [self.python, "-I", "-S", "-B", *(["-u"] if role == "candidate" else [])]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        script = f"sandboxed_{role}.py"
        limits = {
            "cpu_s": self.limits.cpu_s,
            "memory_bytes": self.limits.memory_bytes,
            "file_size_bytes": self.limits.file_size_bytes,
            "open_files": self.limits.open_files,
            "processes": self.limits.processes,
        }
        if backend == "bwrap":
            # As root, bwrap itself runs as the fresh uid (a user namespace that maps
            # only it), so nothing of the run ever holds a privilege.
            job = {**job, "uid": None, "gid": None, "workdir": _WORK_DIR, "limits": limits}
            (folder / "job.json").write_text(json.dumps(job), encoding="utf-8")
            self._own(folder, uid)
            argv = ["bwrap", *self.bwrap_args(folder)]
            argv += ["--", *py, f"{_SANDBOX_DIR}/{script}", f"{_SANDBOX_DIR}/job.json"]
            return Launch(argv, env, str(rundir), fds, user=uid)
        if backend == "unshare":
            # The process builds its own root (rootfs.py) as root in its new mount
            # namespace, then drops to the run's uid (confine.py).
            base = rundir / f"{role}-root"  # outside the folder /sandbox shows
            base.mkdir(mode=0o700)
            rootfs = {**self.rootfs_plan(folder), "base": str(base)}
            job = {**job, "uid": uid, "gid": uid, "workdir": _WORK_DIR, "limits": limits}
            job["rootfs"] = rootfs
            (folder / "job.json").write_text(json.dumps(job), encoding="utf-8")
            self._own(folder, uid)
            env |= {"HOME": _WORK_DIR, "TMPDIR": _WORK_DIR}
            argv = [*_UNSHARE, *py, str(folder / script), str(folder / "job.json")]
            return Launch(argv, env, "/", fds)
        work = folder / "work"
        work.mkdir()
        job = {**job, "uid": uid, "gid": uid, "workdir": str(work), "limits": limits}
        (folder / "job.json").write_text(json.dumps(job), encoding="utf-8")
        self._own(folder, uid)
        env |= {"HOME": str(work), "TMPDIR": str(work)}
        argv = [*py, str(folder / script), str(folder / "job.json")]
        return Launch(argv, env, str(work), fds)

    def _interpreter_dirs(self) -> list[str]:
        """The interpreter's folders outside ``/usr`` (pyenv, conda...)."""
        found: list[str] = []
        for path in (self._prefix, os.path.dirname(self.python)):
            if not any(path == m or path.startswith(m + "/") for m in ("/usr", *found)):
                found.append(path)
        return found

    def rootfs_plan(self, folder: Path) -> dict[str, Any]:
        """What :mod:`rootfs` mounts for the ``unshare`` backend: the same host
        folders as :meth:`bwrap_args`, all read-only."""
        binds: list[list[str]] = [["/usr", "/usr"]]
        symlinks: list[list[str]] = []
        for top in _TOPS:
            if os.path.islink(top):
                symlinks.append([os.readlink(top), top])
            elif os.path.isdir(top):
                binds.append([top, top])
        if os.path.exists("/etc/ld.so.cache"):
            binds.append(["/etc/ld.so.cache", "/etc/ld.so.cache"])
        binds += [[path, path] for path in self._interpreter_dirs()]
        return {
            "binds": binds,
            "symlinks": symlinks,
            "folder": str(folder),
            "tmpfs_bytes": self.limits.tmpfs_bytes,
        }

    @staticmethod
    def _own(folder: Path, uid: int | None) -> None:
        """The role's folder belongs to its own uid (root): the other role's uid
        cannot read it."""
        if uid is None:
            return
        for path in [folder, *folder.rglob("*")]:
            os.chown(path, uid, uid)

    def bwrap_args(self, folder: Path) -> list[str]:
        args = ["--unshare-user"]
        if bwrap_can_disable_userns():
            args.append("--disable-userns")
        args += [
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session",
            "--hostname", "sandbox", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "HOME", _WORK_DIR, "--setenv", "TMPDIR", _WORK_DIR,
            "--ro-bind", "/usr", "/usr",
        ]  # fmt: skip
        for top in _TOPS:
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
        # The interpreter outside /usr (pyenv, conda...): bind it with traversable
        # parents in the sandbox's own root.
        made: set[str] = set()
        for path in self._interpreter_dirs():
            parent = Path(path).parent
            for up in reversed([parent, *parent.parents]):
                if str(up) != "/" and str(up) not in made:
                    args += ["--perms", "0755", "--dir", str(up)]
                    made.add(str(up))
            args += ["--ro-bind", path, path]
            made.add(path)
        # In its own user namespace the program owns the sandbox's root and /dev:
        # both read-only, so the only writable place is the size-limited tmpfs.
        args += [
            "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(self.limits.tmpfs_bytes), "--tmpfs", _WORK_DIR,
            "--ro-bind", str(folder), _SANDBOX_DIR, "--chdir", _WORK_DIR,
            "--remount-ro", "/dev", "--remount-ro", "/",
        ]  # fmt: skip
        return args
