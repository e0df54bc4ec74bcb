"""Deaf to SIGTERM, SIGHUP and SIGINT, and leave a daemon that is deaf too (double
fork, new session, a fresh interpreter): both sleep for an hour, to outlive the
run and the servesweep that started it."""

import os
import signal
import sys
import time

DAEMON = (
    "import signal, time\n"
    "for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
    "    signal.signal(s, signal.SIG_IGN)\n"
    "time.sleep(3600)  # __MARKER__\n"
)

for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", DAEMON])
    os._exit(0)


def attack():
    time.sleep(3600)
    return "escaped"
