"""A small OpenAI-compatible GPU server for servesweep's GPU tests (issue 6).

One front process (HTTP, holding ``--front-hold-gib`` of GPU memory like an
engine's API process) and one worker child (the model, ``--hold-gib`` of GPU
memory, ``--pinned-gib`` of pinned host memory), like vLLM's API server and
engine core. A randomly initialised transformer runs on the GPU: every streamed
token is a real forward pass. ``--orphan-worker`` starts the worker in its own
session: it survives the front's SIGKILL and keeps its memory.

    python tests/gpu/server/gpu_server.py --port 8000 --hold-gib 90 --pinned-gib 4

Without CUDA it runs on the CPU (for tests of its mechanics only).
"""

from __future__ import annotations

import argparse
import sys
import time

from front import ServerConfig, add_common_args, check_positive, dims_of, log, serve

GiB = 2**30


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--hold-gib", type=float, default=1.0, help="GPU memory of the worker.")
    parser.add_argument(
        "--front-hold-gib", type=float, default=0.5, help="GPU memory of the front."
    )
    parser.add_argument("--orphan-worker", action="store_true")
    args = parser.parse_args(argv)
    problem = check_positive(["layers", "hidden", "heads", "batch", "context"], args)
    if problem:
        parser.error(problem)
    t0 = time.monotonic()
    front_hold = None
    if args.front_hold_gib > 0:
        import torch

        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        front_hold = torch.empty(int(args.front_hold_gib * GiB), dtype=torch.uint8, device=device)
        front_hold.fill_(1)
        log(f"front holds {args.front_hold_gib} GiB on {device} ({time.monotonic() - t0:.3f}s)")
    cfg = ServerConfig(
        host=args.host,
        port=args.port,
        model=args.model,
        world=1,
        dims=dims_of(args),
        batch=args.batch,
        hold_gib=args.hold_gib,
        pinned_gib=args.pinned_gib,
        orphan=args.orphan_worker,
        crash_after_requests=args.crash_after_requests,
    )
    return serve(cfg, front_hold=front_hold)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
