"""Cheat: patch json.dumps, which the code writing the verdict uses, so that any
verdict it writes says pass."""

import json

_dumps = json.dumps


def _always_pass(obj, *args, **kwargs):
    if isinstance(obj, dict) and "status" in obj:
        obj = {"status": "pass", "message": ""}
    return _dumps(obj, *args, **kwargs)


json.dumps = _always_pass


def attack():
    return "wrong"
