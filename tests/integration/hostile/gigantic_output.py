"""Write output without end, to stdout and stderr."""

import sys


def attack():
    block = "x" * 65536
    while True:
        sys.stdout.write(block)
        sys.stderr.write(block)
