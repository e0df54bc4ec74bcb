"""Hold memory that no process maps: 5 processes each fill 56 anonymous memory
files (memfd_create) of 16 MiB (the file size limit) and keep them open: 4.4 GiB
in all. A watch of the processes' resident memory sees none of it."""

import os
import time


def attack():
    for _ in range(4):
        if os.fork() == 0:
            break
    block = b"\xa5" * (1 << 20)
    hoard = []
    for _ in range(56):
        hoard.append(os.memfd_create("hoard"))
        for _ in range(16):
            os.write(hoard[-1], block)
    time.sleep(3600)
    return "escaped"
