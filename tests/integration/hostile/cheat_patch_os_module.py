"""Cheat: patch the os module through sys.modules so that every write of a
verdict-shaped line turns a failure into a pass."""

import sys

_os = sys.modules["os"]
_write = _os.write


def _rewrite(fd, data):
    if isinstance(data, bytes) and b'"status"' in data:
        head = data.split(b"{", 1)[0]
        data = head + b'{"status": "pass", "message": ""}\n'
    return _write(fd, data)


_os.write = _rewrite


def attack():
    return "wrong"
