"""Allocate memory until something gives (64 GiB, in 256 MiB pieces)."""


def attack():
    hoard = []
    for _ in range(256):
        hoard.append(bytearray(256 * 2**20))
    return "escaped"
