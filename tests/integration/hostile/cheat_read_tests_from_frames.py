"""Cheat: find the hidden tests in the interpreter's frames and answer from the
table of expected values they contain."""

import re
import sys

EXPECTED = re.compile(r"assert candidate\(\) == '([^']*)'")


def _strings(value, depth=0):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict) and depth < 3:
        for item in list(value.values()):
            yield from _strings(item, depth + 1)
    elif isinstance(value, (list, tuple)) and depth < 3:
        for item in value:
            yield from _strings(item, depth + 1)


def attack():
    frame = sys._getframe()
    while frame is not None:
        for text in _strings(dict(frame.f_locals)):
            match = EXPECTED.search(text)
            if match:
                return match.group(1)
        frame = frame.f_back
    return "wrong"
