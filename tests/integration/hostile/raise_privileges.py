"""Try to become root again, make a user namespace, and reach the host's /proc."""

import os


def attack():
    for step in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.chroot("/")):
        try:
            step()
            return "escaped"
        except OSError as exc:
            print("blocked:", exc)
    return "contained"
