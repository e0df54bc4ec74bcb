"""Sleep far longer than the wall-clock limit."""

import time


def attack():
    time.sleep(3600)
    return "escaped"
