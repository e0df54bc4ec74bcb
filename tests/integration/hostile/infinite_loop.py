"""Spin forever at module level, before the tests can even start."""

while True:
    pass


def attack():
    return "escaped"
