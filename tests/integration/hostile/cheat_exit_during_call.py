"""Cheat: leave with exit status 0 from inside the call, before the test can
compare the answer."""

import os


def attack():
    os._exit(0)
