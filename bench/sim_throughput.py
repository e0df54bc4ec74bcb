"""How fast is servesweep's simulated engine? Requests/s and streamed chunks/s on one core.

The engine runs pinned to one CPU core, the client processes (raw asyncio streams,
no HTTP library) to other cores. Each row runs a closed loop of N keep-alive
connections for a fixed window that all clients start at the same instant; only
requests completed and chunks received inside the window count. The engine's CPU
use over the window says whether it was the bottleneck (~100 %) or not.

    .venv/bin/python bench/sim_throughput.py [--seconds 3] [--server-cpu 0] [--client-cpus 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from servesweep.sim.testing import free_port, http_request


@dataclass(frozen=True)
class Row:
    name: str
    stream: bool
    concurrency: int
    max_tokens: int
    step_ms: float


ROWS = (
    Row("non-streaming, 1 token", False, 1, 1, 0.0),
    Row("non-streaming, 1 token", False, 64, 1, 0.0),
    Row("streaming, 64 tokens, step 0", True, 16, 64, 0.0),
    Row("streaming, 64 tokens, step 0", True, 64, 64, 0.0),
    Row("streaming, 64 tokens, step 10 ms", True, 128, 64, 10.0),
    Row("streaming, 64 tokens, step 10 ms", True, 256, 64, 10.0),
)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _one(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes, stop: float
) -> tuple[bool, int]:
    """One request on a keep-alive connection: (completed in the window, chunks in it)."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        chunks = 0
        while True:
            size = int((await reader.readline()).strip(), 16)
            data = await reader.readexactly(size + 2)
            in_window = time.time() < stop
            if size == 0:
                return in_window, chunks
            if in_window:
                chunks += data.count(b'"choices":[{')
    length = int(lower.split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return time.time() < stop, 0


async def _run_row(
    port: int, row: Row, start: float, stop: float, concurrency: int
) -> tuple[int, int]:
    body = json.dumps(
        {
            "model": "sim-model",
            "prompt": "benchmark the simulated engine",
            "max_tokens": row.max_tokens,
            "ignore_eos": True,
            "stream": row.stream,
        }
    ).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    totals = [0, 0]
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(concurrency)]
    await asyncio.sleep(max(start - time.time(), 0.0))

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while time.time() < stop:
            done, chunks = await _one(reader, writer, request, stop)
            totals[0] += done
            totals[1] += chunks
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    await asyncio.gather(*(worker(r, w) for r, w in conns))
    return totals[0], totals[1]


def _client(argv: list[str]) -> int:
    """Client mode: ``--client PORT ROW START STOP CONCURRENCY`` prints JSON totals."""
    port, row, start, stop, conc = int(argv[0]), int(argv[1]), *map(float, argv[2:4]), argv[4]
    cpu0 = time.process_time()
    requests, chunks = asyncio.run(_run_row(port, ROWS[row], start, stop, int(conc)))
    cpu = time.process_time() - cpu0
    print(json.dumps({"requests": requests, "chunks": chunks, "cpu_s": cpu}))
    return 0


def _clients(
    port: int, row: int, start: float, stop: float, cpus: list[int]
) -> list[subprocess.Popen[bytes]]:
    """One client process per CPU, the row's concurrency split among them."""
    share = [ROWS[row].concurrency // len(cpus)] * len(cpus)
    for i in range(ROWS[row].concurrency % len(cpus)):
        share[i] += 1
    procs = []
    for cpu, conc in zip(cpus, share, strict=True):
        if conc == 0:
            continue
        argv = [sys.executable, __file__, "--client", str(port), str(row)]
        argv += [repr(start), repr(stop), str(conc)]
        procs.append(
            subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                preexec_fn=functools.partial(os.sched_setaffinity, 0, {cpu}),
            )
        )
    return procs


def _start_engine(port: int, row: Row, cpu: int, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "servesweep.sim", "--port", str(port), "--load-time", "0"]
    argv += ["--ttft-ms", "0", "--step-ms", str(row.step_ms), "--batch-slowdown", "0"]
    argv += ["--max-num-seqs", "1024"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if http_request(port, "/health", timeout=1).status == 200:
                return proc
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"the simulated engine did not start; see {log}")


def main() -> int:
    if sys.argv[1:2] == ["--client"]:
        return _client(sys.argv[2:])
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--seconds", type=float, default=3.0, help="window per row (default 3)")
    p.add_argument("--server-cpu", type=int, default=0, help="the engine's core (default 0)")
    p.add_argument("--client-cpus", default="1", help="client cores, one process each (1)")
    p.add_argument("--log", default="/tmp/sim_throughput.log", help="the engines' log")
    args = p.parse_args()
    cpus = [int(c) for c in args.client_cpus.split(",")]
    print(
        f"engine on CPU {args.server_cpu}, client processes on CPUs {cpus}, "
        f"{args.seconds:g} s per row; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    header = (
        f"| {'workload':34} | {'conc':>4} | {'req/s':>8} | {'chunks/s':>9} "
        f"| {'engine CPU':>10} | {'client CPU':>10} |"
    )
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    for index, row in enumerate(ROWS):
        port = free_port()
        engine = _start_engine(port, row, args.server_cpu, Path(args.log))
        try:
            start = time.time() + 1.5  # time for the clients to start and connect
            stop = start + args.seconds
            clients = _clients(port, index, start, stop, cpus)
            time.sleep(max(start - time.time(), 0.0))
            cpu0 = _cpu_seconds(engine.pid)
            time.sleep(max(stop - time.time(), 0.0))
            engine_cpu = (_cpu_seconds(engine.pid) - cpu0) / args.seconds
            results = [json.loads(c.communicate(timeout=120)[0]) for c in clients]
        finally:
            engine.kill()
            engine.wait()
        requests = sum(r["requests"] for r in results) / args.seconds
        chunks = sum(r["chunks"] for r in results) / args.seconds
        client_cpu = sum(r["cpu_s"] for r in results) / args.seconds / len(results)
        chunk_rate = f"{chunks:9.0f}" if row.stream else f"{'-':>9}"
        print(
            f"| {row.name:34} | {row.concurrency:4d} | {requests:8.0f} | {chunk_rate} "
            f"| {engine_cpu:10.0%} | {client_cpu:10.0%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
