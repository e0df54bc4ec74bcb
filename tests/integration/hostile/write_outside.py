"""Write files outside the sandbox: into a test folder, the host's /tmp, $HOME."""

import os


def attack():
    wrote = []
    for path in ["__OUTSIDE_PATH__", "/tmp/__MARKER__.txt", os.path.expanduser("~/__MARKER__.txt")]:
        try:
            with open(path, "w") as f:
                f.write("escaped")
            wrote.append(path)
        except OSError as exc:
            print("blocked:", path, exc)
    return "escaped" if "__OUTSIDE_PATH__" in wrote else "contained"
