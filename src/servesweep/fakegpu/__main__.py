"""``servesweep fake-gpus init|show|hold`` (also ``python -m servesweep.fakegpu``):
manage fake GPUs by hand."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from types import FrameType

from servesweep.fakegpu.store import FakeGpuDir, FakeGpuError, FakeOutOfMemory
from servesweep.fakegpu.units import format_bytes, parse_size
from servesweep.helpstyle import click_style


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _gpu_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid GPU list {text!r}: use e.g. 0,1") from exc


PROG = "python -m servesweep.fakegpu"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Fake GPUs on disk for servesweep's simulated engine (docs/fake-gpus.md).",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{init,show,hold}")
    init = sub.add_parser("init", help="create a fake GPU directory")
    init.add_argument("dir", help="the directory to create (it must not hold GPUs yet)")
    init.add_argument("--count", type=int, default=1, help="number of GPUs (default 1)")
    init.add_argument("--memory", type=_size, default=_size("80GiB"), help="capacity per GPU")
    init.add_argument("--reserved", type=_size, default=0, help="baseline used per GPU")
    init.add_argument("--name", default="NVIDIA H200 (fake)", help="GPU name")
    show = sub.add_parser("show", help="print GPUs, used memory and holders")
    show.add_argument("dir", help="a fake GPU directory")
    hold = sub.add_parser("hold", help="hold memory until killed (a foreign GPU process)")
    hold.add_argument("dir", help="a fake GPU directory")
    hold.add_argument("--gpus", type=_gpu_list, default=[0], help="GPU indexes, e.g. 0,1")
    hold.add_argument("--mem", type=_size, required=True, help="bytes per GPU, e.g. 2GiB")
    hold.add_argument("--release-delay", type=float, default=0.0, help="seconds after exit")
    hold.add_argument("--truth", default=None, help="append ground-truth JSON lines here")
    return click_style(p)


def _show(d: FakeGpuDir) -> None:
    now = time.time()
    for u in d.usage(now):
        g = u.gpu
        print(
            f"GPU {g.index}  {g.name}  used {format_bytes(u.used_bytes)} / "
            f"{format_bytes(g.total_bytes)}  util {u.utilization_pct:.0f}%"
        )
    for h in d.holdings():
        if not h.holds_at(now):
            continue
        state = "alive" if h.alive else f"exited, released in {h.release_at - now:.2f}s"
        mem = ", ".join(f"GPU {i}: {format_bytes(b)}" for i, b in sorted(h.memory.items()))
        print(f"  pid {h.pid} {h.name or '?'} ({state}) {mem}")


def _hold(args: argparse.Namespace, d: FakeGpuDir) -> int:
    stop = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    holder = d.allocate(
        dict.fromkeys(args.gpus, args.mem),
        release_delay_s=args.release_delay,
        truth=args.truth,
        name="fakegpu-hold",
    )
    holder.start_heartbeat()
    print(f"holding {format_bytes(args.mem)} on GPUs {args.gpus} (pid {holder.pid})", flush=True)
    while not stop:
        time.sleep(0.05)
    holder.release()
    return 0


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run ``init``, ``show`` or ``hold``; returns the exit code (argparse: 2 on bad
    flags). ``prog`` names the program in usage and errors."""
    try:
        args = build_parser(prog).parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.command == "init":
            d = FakeGpuDir.create(
                args.dir, args.count, args.memory, name=args.name, reserved_bytes=args.reserved
            )
            print(f"{args.count} fake GPU(s) of {format_bytes(args.memory)} in {d.path}")
            return 0
        d = FakeGpuDir(args.dir)
        if args.command == "show":
            _show(d)
            return 0
        return _hold(args, d)
    except FakeOutOfMemory as exc:
        print(f"torch.OutOfMemoryError: {exc}", file=sys.stderr)
        return 1
    except FakeGpuError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
