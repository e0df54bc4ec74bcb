"""One model worker of a GPU test server (one per GPU), started by the front process.

Like an engine's worker it loads (GPU memory held, pinned host memory, model
weights, NCCL communicator when tensor-parallel), then serves steps sent by the
front over a Unix socket: each step is one greedy decode step of a batch, with a
real all-reduce across workers after every block when ``world > 1``.

When the front disappears (EOF on the socket) a normal worker exits; an
``orphan`` worker (started in its own session by ``--orphan-worker(s)``) keeps
its memory and waits forever, as the workers of a crashed engine sometimes do.
SIGTERM makes any worker tear down (communicator, memory) and exit.

Usage (by the front only): ``python worker.py SOCKET AUTHKEY_HEX CONFIG_JSON``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from multiprocessing.connection import Client, Connection
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from tinylm import ModelDims, TinyLM

GiB = 2**30
_CHUNK = 2 * GiB


def log(rank: int, message: str) -> None:
    """One ``write`` per line, so the workers' lines never interleave in the log."""
    os.write(1, f"[worker {rank} pid {os.getpid()}] {message}\n".encode())


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def hold_device_memory(device: torch.device, nbytes: int) -> list[torch.Tensor]:
    """``nbytes`` of device memory in 2 GiB chunks, each written once."""
    chunks = []
    left = nbytes
    while left > 0:
        size = min(_CHUNK, left)
        chunk = torch.empty(size, dtype=torch.uint8, device=device)
        chunk.fill_(1)
        chunks.append(chunk)
        left -= size
    return chunks


def hold_pinned_memory(nbytes: int) -> list[torch.Tensor]:
    """``nbytes`` of page-locked host memory (plain host memory without CUDA)."""
    if nbytes <= 0:
        return []
    pin = torch.cuda.is_available()
    chunks = []
    left = nbytes
    while left > 0:
        size = min(_CHUNK, left)
        chunk = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
        chunk.fill_(1)
        chunks.append(chunk)
        left -= size
    return chunks


class Worker:
    def __init__(self, config: dict[str, Any]) -> None:
        self.rank = int(config["rank"])
        self.world = int(config["world"])
        self.orphan = bool(config["orphan"])
        self.config = config
        cuda = torch.cuda.is_available()
        self.device = torch.device(f"cuda:{self.rank}" if cuda else "cpu")
        self.dtype = torch.bfloat16 if cuda else torch.float32
        self.held: list[torch.Tensor] = []
        self.pinned: list[torch.Tensor] = []
        self.model: TinyLM | None = None
        self.distributed = False

    def load(self) -> dict[str, float]:
        cfg = self.config
        times: dict[str, float] = {}
        t0 = time.monotonic()
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            torch.empty(1, device=self.device)  # the CUDA context
        times["context_s"] = time.monotonic() - t0
        if self.world > 1:
            t = time.monotonic()
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            kwargs: dict[str, Any] = {}
            if self.device.type == "cuda":
                kwargs["device_id"] = self.device
            dist.init_process_group(backend, rank=self.rank, world_size=self.world, **kwargs)
            probe = torch.ones(1, device=self.device)
            dist.all_reduce(probe)
            if int(probe.item()) != self.world:
                raise RuntimeError(f"all-reduce gave {probe.item()}, expected {self.world}")
            self.distributed = True
            times["comm_init_s"] = time.monotonic() - t
            log(self.rank, f"{backend} communicator of {self.world} ranks ready")
        t = time.monotonic()
        self.held = hold_device_memory(self.device, int(float(cfg["hold_gib"]) * GiB))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        times["hold_s"] = time.monotonic() - t
        log(self.rank, f"holding {cfg['hold_gib']} GiB on {self.device}")
        t = time.monotonic()
        self.pinned = hold_pinned_memory(int(float(cfg["pinned_gib"]) * GiB))
        times["pinned_s"] = time.monotonic() - t
        log(self.rank, f"holding {cfg['pinned_gib']} GiB of pinned host memory")
        t = time.monotonic()
        dims = ModelDims(**cfg["dims"])
        self.model = TinyLM(dims, world=self.world).to(self.device, self.dtype).eval()
        warm = torch.ones(int(cfg["batch"]), dims.context, dtype=torch.long, device=self.device)
        self.model.step(warm)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        times["model_s"] = time.monotonic() - t
        times["load_s"] = time.monotonic() - t0
        return times

    def step(self, windows: list[list[int]]) -> list[int]:
        assert self.model is not None
        batch = torch.tensor(windows, dtype=torch.long, device=self.device)
        return [int(t) for t in self.model.step(batch).tolist()]

    def teardown(self) -> None:
        t = time.monotonic()
        if self.distributed:
            dist.destroy_process_group()
            self.distributed = False
        self.held.clear()
        self.pinned.clear()
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        log(self.rank, f"torn down in {time.monotonic() - t:.3f}s")

    def serve(self, conn: Connection) -> int:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return self.front_gone()
            if msg[0] == "step":
                tokens = self.step(msg[1])
                if self.rank == 0:
                    conn.send(("tokens", tokens))
            elif msg[0] == "shutdown":
                log(self.rank, "shutdown asked by the front")
                return 0
            else:
                log(self.rank, f"unknown message {msg[0]!r}")

    def front_gone(self) -> int:
        if not self.orphan:
            log(self.rank, "the front process is gone: exiting")
            return 1
        used = sum(t.numel() for t in self.held) / GiB
        pinned = sum(t.numel() for t in self.pinned) / GiB
        log(
            self.rank,
            f"the front process is gone: orphaned, keeping {used:.1f} GiB on {self.device} "
            f"and {pinned:.1f} GiB pinned (at {time.time():.3f})",
        )
        while True:
            signal.pause()


def main(argv: list[str]) -> int:
    socket_path, authkey, config_text = argv
    config = json.loads(config_text)
    signal.signal(signal.SIGTERM, _terminate)
    worker = Worker(config)
    conn = Client(socket_path, family="AF_UNIX", authkey=bytes.fromhex(authkey))
    conn.send(("hello", worker.rank, os.getpid()))
    try:
        times = worker.load()
        log(worker.rank, "loaded: " + ", ".join(f"{k} {v:.3f}" for k, v in times.items()))
        conn.send(("ready", worker.rank, times))
        return worker.serve(conn)
    finally:
        worker.teardown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
