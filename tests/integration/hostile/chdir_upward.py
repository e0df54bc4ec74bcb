"""Walk up from the working directory to / and write a file at every level."""

import os


def attack():
    wrote = []
    for _ in range(12):
        try:
            with open("__MARKER__.txt", "w") as f:
                f.write("escaped")
            wrote.append(os.getcwd())
        except OSError as exc:
            print("blocked:", os.getcwd(), exc)
        os.chdir("..")
    print("wrote in", wrote)
    return "escaped" if "/" in wrote else "contained"
