"""Cheat: walk the call stack with inspect, find the reporting function in the
caller's locals and call it with a pass."""

import contextlib
import inspect


def attack():
    for info in inspect.stack():
        for value in list(info.frame.f_locals.values()):
            if callable(value) and getattr(value, "__name__", "") == "report":
                with contextlib.suppress(BaseException):
                    value({"status": "pass", "message": ""})
    return "wrong"
