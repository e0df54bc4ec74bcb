"""Delete a folder of the test's files and one file of the host's /tmp."""

import os
import shutil


def attack():
    existed = os.path.isdir("__DELETE_DIR__")
    shutil.rmtree("__DELETE_DIR__", ignore_errors=True)
    for path in ["__DELETE_FILE__"]:
        try:
            os.remove(path)
        except OSError as exc:
            print("blocked:", path, exc)
    gone = existed and not os.path.exists("__DELETE_DIR__")
    return "escaped" if gone else "contained"
