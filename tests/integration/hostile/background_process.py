"""Leave processes behind: a double-forked daemon in a new session and a
detached shell, both meant to outlive the run. Prints their pids."""

import os
import subprocess


def attack():
    shell = subprocess.Popen(["/bin/sh", "-c", "sleep 3600; : __MARKER__"], start_new_session=True)
    print("shell pid", shell.pid, flush=True)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sh", ["/bin/sh", "-c", "while :; do sleep 1; done; : __MARKER__"])
        os._exit(0)
    return "contained"
