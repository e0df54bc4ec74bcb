"""A tensor-parallel-like OpenAI-compatible server for servesweep's multi-GPU tests (issue 8).

One worker process per GPU, joined by ``torch.distributed`` with NCCL; each holds
``--hold-gib`` of its GPU plus ``--pinned-gib`` of pinned host memory and a shard
of a randomly initialised transformer; every decode step does real all-reduces
across the workers. One front process (no GPU memory) serves the OpenAI API.
``--orphan-workers`` starts the workers in their own sessions: they survive the
front's SIGKILL and keep their memory on every GPU.

    python tests/gpu/server/tp_server.py --tp 2 --hold-gib 120 --pinned-gib 8

NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends) in every process.
Without CUDA the workers run on the CPU through gloo (mechanics tests only).
"""

from __future__ import annotations

import argparse
import sys

from front import ServerConfig, add_common_args, check_positive, dims_of, serve


def _gpu_count() -> int:
    try:
        import torch

        return max(1, torch.cuda.device_count())
    except ImportError:
        return 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--tp", type=int, default=0, help="Workers (default: every GPU).")
    parser.add_argument("--hold-gib", type=float, default=1.0, help="GPU memory per worker.")
    parser.add_argument("--orphan-workers", action="store_true")
    args = parser.parse_args(argv)
    problem = check_positive(["layers", "hidden", "heads", "batch", "context"], args)
    if problem:
        parser.error(problem)
    world = args.tp or _gpu_count()
    if args.heads % world or (args.hidden * 4) % world:
        parser.error(f"--heads {args.heads} and 4*--hidden must divide by --tp {world}")
    cfg = ServerConfig(
        host=args.host,
        port=args.port,
        model=args.model,
        world=world,
        dims=dims_of(args),
        batch=args.batch,
        hold_gib=args.hold_gib,
        pinned_gib=args.pinned_gib,
        orphan=args.orphan_workers,
        crash_after_requests=args.crash_after_requests,
    )
    return serve(cfg)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
