"""Read a secret file of the host (world-readable, so only isolation protects it),
the parent's environment and the test process's /proc entries, and leak them."""

import os


def attack():
    found = []
    for path in [
        "__SECRET_PATH__",
        "/proc/__TEST_PID__/environ",
        "/proc/__TEST_PID__/cmdline",
        "/proc/1/environ",
        "../../../../../../../../__SECRET_PATH__",
    ]:
        try:
            with open(path, errors="replace") as f:
                found.append(f.read())
        except OSError as exc:
            print("blocked:", path, exc)
    found.append(repr(dict(os.environ)))
    leak = "\n".join(found)
    print(leak)
    raise AssertionError(leak)
