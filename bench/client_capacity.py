"""How much load one servesweep generator process can produce, and how much timing
error it adds — measured side by side with bare aiohttp and httpx loops.

A minimal raw-asyncio streaming server (OpenAI chat chunks, a role-only first chunk,
then ``--chunks`` content chunks one ``--gap-ms`` apart, continuous usage, a final
usage chunk) runs in its own process(es), pinned to ``--server-cores``; every
client runs pinned to ``--client-cores``. The server records when it sent each
request's first content chunk, so the client's TTFT error is measured directly.

    .venv/bin/python bench/client_capacity.py            # 2-core machine defaults
    .venv/bin/python bench/client_capacity.py --client-cores 0-7 --server-cores 8-15 \
        --server-procs 4 --workers 1,2,4

Results are printed as a Markdown table (see docs/benchmarks.md). Besides requests per
second, each client's own CPU time per request is measured (the CPU time of its
process and worker processes over the whole run, setup and metrics included): on a
busy machine it moves less than the request rate does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import socket
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

# --------------------------------------------------------------------------- server


class _Server(asyncio.Protocol):
    chunks = 16
    gap_s = 0.001
    first_sent: list[int] = []  # noqa: RUF012 - shared by every connection of the process

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.t = transport
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            length = 0
            pos = head.find(b"content-length:")
            if pos >= 0:
                length = int(
                    head[
                        pos + 15 : head.find(b"\r\n", pos) if head.find(b"\r\n", pos) > 0 else None
                    ]
                )
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            path = head.split(b" ", 2)[1]
            if path == b"/stats":
                payload = json.dumps(_Server.first_sent).encode()
                _Server.first_sent = []
                self.t.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(payload)).encode()
                    + b"\r\n\r\n"
                    + payload
                )
            else:
                self._stream(b'"continuous_usage_stats":true' in body)

    def _stream(self, continuous: bool) -> None:
        t = self.t
        loop = asyncio.get_running_loop()
        t.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + _frame(_ROLE)
        )
        frames = _CONT if continuous else _PLAIN
        now = loop.time()
        last = self.chunks - 1
        for k in range(self.chunks):
            frame = frames[k] + _TAIL if k == last else frames[k]
            loop.call_at(now + k * self.gap_s, self._send, frame, k == 0)

    def _send(self, frame: bytes, first: bool) -> None:
        if self.t.is_closing():  # the client went away (end of a timed run)
            return
        if first:
            _Server.first_sent.append(time.monotonic_ns())
        self.t.write(frame)


def _frame(payload: bytes) -> bytes:
    data = b"data: " + payload + b"\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _chunk(k: int, usage: bool) -> bytes:
    obj: dict[str, Any] = {
        "id": "chatcmpl-capacity",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": f" word{k}"}, "finish_reason": None}],
    }
    if usage:
        obj["usage"] = {"prompt_tokens": 12, "completion_tokens": k + 1, "total_tokens": 13 + k}
    return json.dumps(obj, separators=(",", ":")).encode()


_ROLE = json.dumps(
    {
        "id": "chatcmpl-capacity",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
    },
    separators=(",", ":"),
).encode()
_CONT: list[bytes] = []
_PLAIN: list[bytes] = []
_TAIL = b""


def _build_frames(chunks: int) -> None:
    global _TAIL
    _CONT[:] = [_frame(_chunk(k, True)) for k in range(chunks)]
    _PLAIN[:] = [_frame(_chunk(k, False)) for k in range(chunks)]
    usage = {"prompt_tokens": 12, "completion_tokens": chunks, "total_tokens": 12 + chunks}
    final = json.dumps({"id": "chatcmpl-capacity", "choices": [], "usage": usage}).encode()
    _TAIL = _frame(final) + _frame(b"[DONE]") + b"0\r\n\r\n"


def _serve(port: int, cores: list[int], chunks: int, gap_s: float, ready: Any) -> None:
    os.sched_setaffinity(0, cores)
    _Server.chunks, _Server.gap_s = chunks, gap_s
    _build_frames(chunks)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Server, "127.0.0.1", port, reuse_port=True, backlog=4096)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# --------------------------------------------------------------------------- clients

BODY = json.dumps(
    {
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
).encode()
HEADERS = {"Content-Type": "application/json"}


async def _bare_aiohttp(url: str, conc: int, seconds: float, n: int | None) -> dict[str, Any]:
    import aiohttp

    done = chunks = 0
    firsts: list[int] = []
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            nonlocal done, chunks
            while time.monotonic() < deadline and (n is None or done < n):
                first = 0
                async with session.post(url, data=BODY, headers=HEADERS) as resp:
                    async for line in resp.content:
                        if (
                            line.startswith(b"data: {")
                            and b'"content":"' in line
                            and b'"content":""' not in line
                        ):
                            chunks += 1
                            if not first:
                                first = time.monotonic_ns()
                firsts.append(first)
                done += 1

        t0 = time.monotonic()
        await asyncio.gather(*(one() for _ in range(conc)))
        wall = time.monotonic() - t0
    return {"req_s": done / wall, "chunks_s": chunks / wall, "firsts": firsts, "requests": done}


async def _bare_httpx(url: str, conc: int, seconds: float, n: int | None) -> dict[str, Any]:
    import httpx

    done = chunks = 0
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def one() -> None:
            nonlocal done, chunks
            while time.monotonic() < deadline and (n is None or done < n):
                async with client.stream("POST", url, content=BODY, headers=HEADERS) as resp:
                    async for line in resp.aiter_lines():
                        if (
                            line.startswith("data: {")
                            and '"content":"' in line
                            and '"content":""' not in line
                        ):
                            chunks += 1
                done += 1

        t0 = time.monotonic()
        await asyncio.gather(*(one() for _ in range(conc)))
        wall = time.monotonic() - t0
    return {"req_s": done / wall, "chunks_s": chunks / wall, "requests": done}


def _servesweep_open(base: str, rate: float, seconds: float) -> dict[str, Any]:
    from servesweep.bench.load import run_workload_sync
    from servesweep.bench.target import Target
    from servesweep.spec.schema import workload_spec

    spec = workload_spec(
        name="capacity", rate=[rate], arrival="poisson", duration=seconds, max_tokens=16
    )
    target = Target(base_url=base, model="m", metrics_path=None)
    (res,) = run_workload_sync(target, spec)
    m = res.metrics
    return {
        "achieved": m.get("achieved_rate", 0.0),
        "sched_p99": m.get("schedule_lag_p99_ms"),
        "sched_median": res.info.get("schedule_lag_ms", {}).get("median"),
        "loop_p99": m.get("loop_lag_p99_ms"),
        "in_flight": m.get("concurrency_mean"),
        "failed": m["failed"],
        "warnings": list(res.warnings),
    }


def _servesweep(
    base: str, conc: int, seconds: float, n: int | None, workers: int
) -> dict[str, Any]:
    from servesweep.bench.load import LoadOptions, run_workload_sync
    from servesweep.bench.target import Target
    from servesweep.spec.schema import workload_spec

    spec: dict[str, Any] = {"name": "capacity", "concurrency": [conc], "max_tokens": 16}
    if n is not None:
        spec["requests"] = n
    else:
        spec["duration"] = seconds
    target = Target(base_url=base, model="m", metrics_path=None)
    (res,) = run_workload_sync(target, workload_spec(**spec), LoadOptions(workers=workers))
    m = res.metrics
    t0 = int(res.info["t0_monotonic_ns"])
    chunks = sum(len(s.chunk_tokens) for s in res.samples if s.ok)
    firsts = [
        t0 + round(s.first_token_at * 1e9) if s.first_token_at is not None else 0
        for s in sorted(res.samples, key=lambda s: s.sent_at)
    ]
    return {
        "req_s": m["request_throughput"],
        "chunks_s": chunks / m["duration_s"],
        "in_flight": m.get("concurrency_mean", 0.0),
        "loop_lag_p99_ms": m.get("loop_lag_p99_ms"),
        "failed": m["failed"],
        "requests": m["completed"] + m["failed"],
        "firsts": firsts,
        "warnings": list(res.warnings),
    }


def _cpu_s() -> float:
    """CPU time of this process and of its children that have ended (worker processes)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _client_proc(cores: list[int], fn: Callable[..., Any], args: tuple[Any, ...], q: Any) -> None:
    os.sched_setaffinity(0, cores)
    import aiohttp  # noqa: F401 - imported before the CPU clock starts

    import servesweep.bench.load  # noqa: F401

    cpu = _cpu_s()
    result = fn(*args)
    cpu = _cpu_s() - cpu
    if result.get("requests"):
        # the client's own CPU time per request, its worker processes included: a
        # figure that a busy machine moves less than the request rate (setup, the
        # workers' start and the metrics included)
        result["cpu_us_per_req"] = cpu / result["requests"] * 1e6
    q.put(result)


def _in_client(cores: list[int], fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_client_proc, args=(cores, fn, args, q))
    p.start()
    out: dict[str, Any] = q.get(timeout=600)
    p.join(timeout=30)
    return out


def _run_async(
    coro_fn: Callable[..., Coroutine[Any, Any, dict[str, Any]]], *args: Any
) -> dict[str, Any]:
    return asyncio.run(coro_fn(*args))


def _stats(base: str) -> list[int]:
    import urllib.request

    with urllib.request.urlopen(base + "/stats", timeout=10) as resp:
        return list(json.loads(resp.read()))


def _ttft_error(client_firsts: list[int], server_firsts: list[int]) -> tuple[float, float]:
    pairs = list(zip(client_firsts, server_firsts, strict=False))
    errs = sorted((c - s) / 1e6 for c, s in pairs if c)
    if not errs:
        return float("nan"), float("nan")
    return statistics.median(errs), errs[min(len(errs) - 1, int(len(errs) * 0.99))]


def _cores(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client-cores", default="0")
    ap.add_argument("--server-cores", default="1")
    ap.add_argument("--server-procs", type=int, default=1)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--gap-ms", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of every client")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--ttft-requests", type=int, default=200)
    ap.add_argument("--skip-httpx", action="store_true")
    ap.add_argument("--rate", type=float, default=500.0, help="open-loop rate (Poisson)")
    ap.add_argument("--open-seconds", type=float, default=10.0)
    args = ap.parse_args()
    client, server = _cores(args.client_cores), _cores(args.server_cores)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    url = base + "/v1/chat/completions"
    ctx = mp.get_context("spawn")
    procs = []
    for k in range(args.server_procs):
        ready = ctx.Event()
        core = [server[k % len(server)]] if args.server_procs > 1 else server
        p = ctx.Process(target=_serve, args=(port, core, args.chunks, args.gap_ms / 1000, ready))
        p.start()
        procs.append(p)
        ready.wait(30)
    c, sec, n = args.concurrency, args.seconds, args.ttft_requests
    runs: dict[str, list[dict[str, Any]]] = {}

    def record(name: str, r: dict[str, Any]) -> None:
        runs.setdefault(name, []).append(r)
        extra = f" in flight {r['in_flight']:.1f}" if "in_flight" in r else ""
        if "ttft_err" in r:
            extra += f" TTFT error median/p99 {r['ttft_err'][0]:.3f}/{r['ttft_err'][1]:.3f} ms"
        rate = f"{r['req_s']:.0f} req/s {r['chunks_s']:.0f} chunks/s"
        print(f"  {name}: {rate}{extra}", file=sys.stderr)
        for warning in r.get("warnings", []):
            print(f"    warning: {warning}", file=sys.stderr)

    workers = [int(x) for x in args.workers.split(",")]
    try:
        print(f"server {base} on cores {server}, clients on {client}", file=sys.stderr)
        if not args.skip_httpx:
            r = _in_client(client, _run_async, _bare_httpx, url, c, sec, None)
            record(f"bare httpx loop, c={c}", r)
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}/{args.rounds}", file=sys.stderr)
            r = _in_client(client, _run_async, _bare_aiohttp, url, c, sec, None)
            record(f"bare aiohttp loop, c={c}", r)
            for w in workers:
                r = _in_client(client, _servesweep, base, c, sec, None, w)
                record(f"servesweep, {w} worker process(es), c={c}", r)
            _stats(base)
            r = _in_client(client, _run_async, _bare_aiohttp, url, 1, 120.0, n)
            r["ttft_err"] = _ttft_error(r["firsts"], _stats(base))
            record("bare aiohttp loop, c=1", r)
            r = _in_client(client, _servesweep, base, 1, 0.0, n, 1)
            r["ttft_err"] = _ttft_error(r["firsts"], _stats(base))
            record("servesweep, c=1", r)
        opened = _in_client(client, _servesweep_open, base, args.rate, args.open_seconds)
        print(f"  open loop: {opened}", file=sys.stderr)
    finally:
        for p in procs:
            p.kill()
            p.join(timeout=10)
    print(
        f"\n{args.chunks}-chunk streamed responses, {args.gap_ms} ms between chunks, closed loop "
        f"{sec:g} s per run, {args.rounds} alternating rounds (medians; ranges in brackets); "
        f"clients on cores {client}, server on {server}\n"
    )
    print(
        "| client | req/s | chunks/s | client CPU µs/req | in flight | loop lag p99 ms "
        "| added TTFT ms (p50 / p99) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, rs in runs.items():
        req = [r["req_s"] for r in rs]
        held = "-"
        if "in_flight" in rs[0]:
            held = f"{_median([r['in_flight'] for r in rs]):.1f}/{1 if name.endswith('c=1') else c}"
        lag = "-"
        if rs[0].get("loop_lag_p99_ms") is not None:
            lag = f"{_median([r['loop_lag_p99_ms'] for r in rs]):.2f}"
        err = "-"
        if "ttft_err" in rs[0]:
            p50 = _median([r["ttft_err"][0] for r in rs])
            err = f"{p50:.3f} / {_median([r['ttft_err'][1] for r in rs]):.3f}"
        chunks = _median([r["chunks_s"] for r in rs])
        spread = f"{_median(req):.0f} [{min(req):.0f}-{max(req):.0f}]"
        cpus = [r["cpu_us_per_req"] for r in rs if "cpu_us_per_req" in r]
        cpu = f"{_median(cpus):.0f} [{min(cpus):.0f}-{max(cpus):.0f}]" if cpus else "-"
        cols = [spread, f"{chunks:.0f}", cpu, held, lag, err]
        print(f"| {name} | " + " | ".join(cols) + " |")
    print(
        f"\nservesweep open loop, Poisson {args.rate:g} req/s for {args.open_seconds:g} s: "
        f"achieved {opened['achieved']:.1f} req/s "
        f"({(opened['achieved'] / args.rate - 1) * 100:+.2f}%), schedule lag median "
        f"{opened['sched_median']:.3f} ms, p99 {opened['sched_p99']:.3f} ms, loop lag p99 "
        f"{opened['loop_p99']:.3f} ms, {opened['in_flight']:.1f} in flight, "
        f"{opened['failed']:.0f} failed, warnings: {opened['warnings'] or 'none'}"
    )
    bare = runs.get(f"bare aiohttp loop, c={c}", [])
    for w in workers:
        ours = runs.get(f"servesweep, {w} worker process(es), c={c}", [])
        ratios = [o["req_s"] / b["req_s"] for o, b in zip(ours, bare, strict=False)]
        if ratios:
            print(
                f"\nservesweep ({w} worker process(es)) / bare aiohttp, same round: median "
                f"{_median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}"
            )


if __name__ == "__main__":
    main()
