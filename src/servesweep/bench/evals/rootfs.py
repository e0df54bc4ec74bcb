"""A root of its own for a sandboxed process (the ``unshare`` backend): built by
the process itself, as root in the fresh mount namespace ``unshare --mount``
gave it, before it drops to the run's uid.

What it sees afterwards is what bubblewrap gives: read-only binds (``nosuid``,
``nodev``) of only what the interpreter needs (``/usr``, the ``/bin``-like
folders, ``/etc/ld.so.cache``, the interpreter's own prefix), its own folder at
``/sandbox`` (read-only), a new ``/proc`` of its PID namespace, a read-only
``/dev`` with ``null``, ``zero``, ``full``, ``random`` and ``urandom``, and one
writable place: a private size-limited tmpfs at ``/tmp`` (its working folder,
``HOME`` and ``TMPDIR``). ``/var/tmp``, ``/dev/shm``, ``/run``, home folders and
the rest of the host are not there at all. The new root is entered with
``pivot_root`` and the host's root is detached from the namespace; the process
then lives in a ``chroot`` one folder below the namespace's root, where the
kernel refuses it new user namespaces (so no mounts of its own either).

Standard library only: copied next to ``confine.py`` in the sandbox.
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Any

__all__ = ["enter"]

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
MNT_DETACH = 0x2
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
_DEVICES = ("null", "zero", "full", "random", "urandom")
_INNER = "r"
"""The chroot below the namespace's root."""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _fail(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    args = [s.encode() if s is not None else None for s in (source, target, fstype)]
    if _libc.mount(*args, flags, data.encode() if data is not None else None) != 0:
        raise _fail(f"mount {source or fstype or ''} on {target}")


def _bind_ro(source: str, target: str, flags: int = MS_NOSUID | MS_NODEV) -> None:
    """A read-only bind of ``source`` alone (not what is mounted below it)."""
    if os.path.isdir(source):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(source, target, None, MS_BIND)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)


def enter(spec: dict[str, Any]) -> None:
    """Build the root described by ``spec`` (``base``: an empty host folder to
    build it in; ``binds``: ``[source, target]`` pairs; ``symlinks``: ``[target,
    path]``; ``folder``: the role's folder for ``/sandbox``; ``tmpfs_bytes``) and
    enter it. Raises OSError when a step fails (then the run cannot start)."""
    number = _PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(f"no pivot_root system call known for {platform.machine()}")
    base = str(spec["base"])
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
    _mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    new = os.path.join(base, _INNER)
    os.mkdir(new, 0o755)
    for source, target in spec["binds"]:
        _bind_ro(str(source), new + str(target))
    for target, path in spec["symlinks"]:
        os.symlink(str(target), new + str(path))
    _bind_ro(str(spec["folder"]), new + "/sandbox")
    os.mkdir(new + "/proc", 0o555)
    _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    dev = new + "/dev"
    os.mkdir(dev, 0o755)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in _DEVICES:
        _bind_ro(f"/dev/{name}", f"{dev}/{name}", MS_NOSUID | MS_NOEXEC)
    _mount(None, dev, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    os.mkdir(new + "/tmp", 0o755)
    size = int(spec["tmpfs_bytes"])
    _mount("tmpfs", new + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    _mount(None, base, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    os.chdir(base)
    if _libc.syscall(number, b".", b".") != 0:
        raise _fail("pivot_root")
    if _libc.umount2(b".", MNT_DETACH) != 0:  # the host's root, now stacked on ours
        raise _fail("umount of the host's root")
    os.chdir("/")
    os.chroot(_INNER)
    os.chdir("/")
