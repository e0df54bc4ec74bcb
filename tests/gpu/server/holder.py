"""A plain process that holds GPU memory: the "foreign holder" of the GPU tests.

    python holder.py --gib 8 [--device 0] [--gib-per-device 8,4] [--wait-trigger]

It creates its CUDA context(s), optionally waits for a line on stdin, allocates
``--gib`` GiB on each device (or ``--gib-per-device``), prints ``holding`` and
sleeps until it is killed. It carries no servesweep instance tag.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch

GiB = 2**30


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--devices", default="0", help="Comma list of CUDA devices.")
    parser.add_argument("--gib-per-device", default="", help="Comma list, one per device.")
    parser.add_argument("--wait-trigger", action="store_true")
    args = parser.parse_args(argv)
    devices = [int(d) for d in args.devices.split(",")]
    amounts = (
        [float(a) for a in args.gib_per_device.split(",")]
        if args.gib_per_device
        else [args.gib] * len(devices)
    )
    for d in devices:
        torch.empty(1, device=f"cuda:{d}")
    print(f"holder pid {os.getpid()}: contexts ready", flush=True)
    if args.wait_trigger:
        sys.stdin.readline()
    held = []
    for d, gib in zip(devices, amounts, strict=True):
        t = torch.empty(int(gib * GiB), dtype=torch.uint8, device=f"cuda:{d}")
        t.fill_(7)
        held.append(t)
    torch.cuda.synchronize()
    print(f"holding {amounts} GiB on cuda {devices}", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
