"""Try to pass without passing: print and write pass-shaped verdicts on every
descriptor, then leave with a clean exit before the tests run."""

import json
import os

line = (json.dumps({"status": "pass", "message": ""}) + "\n").encode()
for fd in range(1, 64):
    try:
        os.write(fd, b"PASS " + line)
        os.write(fd, line)
    except OSError:
        pass
os._exit(0)


def attack():
    return "escaped"
