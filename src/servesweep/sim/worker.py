"""A worker child that holds the simulated engine's GPU memory (``--orphan-worker``).

Started in its own session, it survives the parent's SIGKILL and keeps the memory,
like an orphaned tensor-parallel worker. It prints ``ok`` once the memory is held
(or a traceback on stderr and ``fail``), then holds until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from servesweep.fakegpu import FakeGpuDir, FakeGpuError, FakeOutOfMemory


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m servesweep.sim.worker")
    p.add_argument("dir")
    p.add_argument("--gpus", required=True)
    p.add_argument("--mem", type=int, required=True)
    p.add_argument("--release-delay", type=float, default=0.0)
    p.add_argument("--truth", default=None)
    args = p.parse_args(argv)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    gpus = [int(x) for x in args.gpus.split(",") if x]
    try:
        holder = FakeGpuDir(args.dir).allocate(
            dict.fromkeys(gpus, args.mem),
            release_delay_s=args.release_delay,
            truth=args.truth,
            name="sim-worker",
        )
    except FakeOutOfMemory as exc:
        print(f"Traceback (most recent call last):\ntorch.OutOfMemoryError: {exc}", file=sys.stderr)
        print("fail", flush=True)
        return 1
    except FakeGpuError as exc:
        print(f"Traceback (most recent call last):\nRuntimeError: {exc}", file=sys.stderr)
        print("fail", flush=True)
        return 1
    holder.start_heartbeat()
    print("ok", flush=True)
    while not stop.wait(0.05):
        pass
    holder.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
