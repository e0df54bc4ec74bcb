"""Cheat: find the function that reports the verdict among all live objects
(gc.get_objects) and call it with a pass."""

import contextlib
import gc


def attack():
    for obj in gc.get_objects():
        code = getattr(obj, "__code__", None)
        if code is not None and callable(obj) and getattr(obj, "__name__", "") == "report":
            with contextlib.suppress(BaseException):
                obj({"status": "pass", "message": ""})
    return "wrong"
