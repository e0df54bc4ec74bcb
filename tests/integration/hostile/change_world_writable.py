"""Change a world-writable file outside its folder (a canary the test made with
mode 0666 in a folder of mode 0777): append, truncate, change its times."""

import os


def attack():
    path = "__WORLD_WRITABLE__"
    changed = False
    for step in (
        lambda: os.write(os.open(path, os.O_WRONLY | os.O_APPEND), b" and changed"),
        lambda: os.truncate(path, 0),
        lambda: os.utime(path, (0, 0)),
    ):
        try:
            step()
            changed = True
        except OSError as exc:
            print("blocked:", path, exc)
    return "escaped" if changed else "contained"
