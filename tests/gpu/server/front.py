"""The OpenAI-compatible front process of the GPU test servers.

It starts one worker per GPU (``worker.py``), waits until every worker has
loaded, then listens and serves ``/health``, ``/v1/models``, ``/v1/completions``
and ``/v1/chat/completions`` (SSE streaming with a final ``usage`` chunk when
asked). A scheduler batches the requests in flight (at most ``batch``) and runs
one decode step per iteration on all workers at once; every token is a real
forward pass on the GPU(s).

It prints ``Uvicorn running on http://HOST:PORT`` once it listens, like the
engines. If a worker dies the front exits with code 1; SIGTERM shuts the workers
down and exits 0. ``crash_after_requests`` makes the front SIGKILL itself when
the request after that many generations arrives (the orphan test's crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from aiohttp import web
from tinylm import EOS, ModelDims, decode, encode, window

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""NVLink multicast stays off in every process (the device machines require it)."""

_WORKER = Path(__file__).with_name("worker.py")

STOPPING = threading.Event()
"""Set once shutdown began: a worker that stops answering then is no crash."""


def log(message: str) -> None:
    """One ``write`` per line, so the front's and the workers' lines never interleave."""
    sys.stdout.flush()
    os.write(1, f"[front pid {os.getpid()}] {message}\n".encode())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerConfig:
    host: str
    port: int
    model: str
    world: int
    dims: ModelDims
    batch: int
    hold_gib: float
    pinned_gib: float
    orphan: bool = False
    crash_after_requests: int = 0
    max_tokens_default: int = 16


class WorkerPool:
    """The worker processes and their sockets; ``step`` runs one batch on all."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self._dir = tempfile.mkdtemp(prefix="gpu-test-server-")
        self._authkey = secrets.token_bytes(16)
        self._listener = Listener(
            os.path.join(self._dir, "sock"), family="AF_UNIX", authkey=self._authkey
        )
        self.procs: list[subprocess.Popen[bytes]] = []
        self.conns: dict[int, Connection] = {}
        self.load_times: dict[int, dict[str, float]] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        env = {**os.environ, **MULTICAST_OFF}
        env["MASTER_ADDR"] = "127.0.0.1"
        env["MASTER_PORT"] = str(_free_port())
        env["PYTHONUNBUFFERED"] = "1"
        for rank in range(self.cfg.world):
            config = {
                "rank": rank,
                "world": self.cfg.world,
                "orphan": self.cfg.orphan,
                "hold_gib": self.cfg.hold_gib,
                "pinned_gib": self.cfg.pinned_gib,
                "batch": self.cfg.batch,
                "dims": self.cfg.dims.__dict__,
            }
            argv = [
                sys.executable,
                str(_WORKER),
                self._listener.address,
                self._authkey.hex(),
                json.dumps(config),
            ]
            proc = subprocess.Popen(argv, env=env, start_new_session=self.cfg.orphan)
            self.procs.append(proc)
            log(
                f"started worker {rank}: pid {proc.pid}"
                + (" (own session)" if self.cfg.orphan else "")
            )

    def wait_loaded(self, timeout: float = 600.0) -> None:
        """Accept every worker's connection and wait for its ``ready``."""
        accepted: list[Connection] = []

        def accept() -> None:
            for _ in range(self.cfg.world):
                accepted.append(self._listener.accept())

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while thread.is_alive():
            self.check_workers()
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not connect in time")
            thread.join(0.2)
        pending = set()
        for conn in accepted:
            kind, rank, _pid = conn.recv()
            assert kind == "hello"
            self.conns[int(rank)] = conn
            pending.add(int(rank))
        while pending:
            self.check_workers()
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers {sorted(pending)} did not load in time")
            for rank in sorted(pending):
                conn = self.conns[rank]
                if conn.poll(0.1):
                    kind, _, times = conn.recv()
                    assert kind == "ready"
                    self.load_times[rank] = dict(times)
                    pending.discard(rank)
                    log(f"worker {rank} ready")

    def check_workers(self) -> None:
        for rank, proc in enumerate(self.procs):
            code = proc.poll()
            if code is not None:
                raise WorkerDied(rank, proc.pid, code)

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def step(self, windows: list[list[int]]) -> list[int]:
        with self._lock:
            for conn in self.conns.values():
                conn.send(("step", windows))
            kind, tokens = self.conns[0].recv()
            assert kind == "tokens"
            return list(tokens)

    def shutdown(self, timeout: float = 20.0) -> None:
        STOPPING.set()
        self._lock.acquire(timeout=5.0)  # let a step in flight finish
        for conn in self.conns.values():
            with contextlib.suppress(OSError):
                conn.send(("shutdown",))
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log(f"worker pid {proc.pid} did not exit in {timeout:g}s: SIGKILL")
                proc.kill()
                proc.wait()
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)


class WorkerDied(RuntimeError):
    def __init__(self, rank: int, pid: int, code: int) -> None:
        super().__init__(f"worker {rank} (pid {pid}) exited with code {code}")


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool
    generated: list[int] = field(default_factory=list)
    queue: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)


class Scheduler:
    """Continuous batching over the pool: one decode step of up to ``batch`` requests."""

    def __init__(self, pool: WorkerPool, cfg: ServerConfig) -> None:
        self.pool = pool
        self.cfg = cfg
        self.waiting: asyncio.Queue[Request] = asyncio.Queue()
        self.active: list[Request] = []
        self.steps = 0

    async def run(self) -> None:
        while True:
            if not self.active:
                self.active.append(await self.waiting.get())
            while len(self.active) < self.cfg.batch and not self.waiting.empty():
                self.active.append(self.waiting.get_nowait())
            context = self.cfg.dims.context
            windows = [window(r.prompt + r.generated, context) for r in self.active]
            try:
                tokens = await asyncio.to_thread(self.pool.step, windows)
            except (OSError, EOFError) as exc:
                if STOPPING.is_set():
                    await asyncio.sleep(3600)
                log(f"a worker stopped answering: {exc!r}")
                os._exit(1)
            self.steps += 1
            still: list[Request] = []
            for req, token in zip(self.active, tokens, strict=True):
                done = token == EOS and not req.ignore_eos
                if not done:
                    req.generated.append(token)
                    req.queue.put_nowait(token)
                if done or len(req.generated) >= req.max_tokens:
                    req.queue.put_nowait(None)
                else:
                    still.append(req)
            self.active = still


class Api:
    def __init__(self, cfg: ServerConfig, pool: WorkerPool, scheduler: Scheduler) -> None:
        self.cfg = cfg
        self.pool = pool
        self.scheduler = scheduler
        self.served = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, request: web.Request) -> web.Response:
        if not self.pool.alive():
            return web.Response(status=503, text="a worker died")
        return web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        data = {"id": self.cfg.model, "object": "model", "owned_by": "servesweep-tests"}
        return web.json_response({"object": "list", "data": [data]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    def _maybe_crash(self) -> None:
        limit = self.cfg.crash_after_requests
        if limit and self.served >= limit:
            log(f"crash_after_requests={limit} reached: SIGKILL to the front process itself")
            os.kill(os.getpid(), signal.SIGKILL)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        self._maybe_crash()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list):
                return _error(400, "'messages' must be a list")
            text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        else:
            prompt = body.get("prompt", "")
            text = " ".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        max_tokens = int(max_tokens) if max_tokens else self.cfg.max_tokens_default
        if max_tokens < 1:
            return _error(400, "'max_tokens' must be at least 1")
        req = Request(
            prompt=encode(text, self.cfg.dims.vocab),
            max_tokens=max_tokens,
            ignore_eos=bool(body.get("ignore_eos", False)),
        )
        self.scheduler.waiting.put_nowait(req)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            tokens = []
            while (token := await req.queue.get()) is not None:
                tokens.append(token)
            self.served += 1
            content = "".join(decode(t) for t in tokens)
            choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(req)}
            if chat:
                choice["message"] = {"role": "assistant", "content": content}
            else:
                choice["text"] = content
            return web.json_response(
                {
                    "id": rid,
                    "object": kind,
                    "created": created,
                    "model": self.cfg.model,
                    "choices": [choice],
                    "usage": _usage(req),
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        kind += ".chunk" if chat else ""

        async def send(obj: dict[str, Any]) -> None:
            await response.write(f"data: {json.dumps(obj)}\n\n".encode())

        def chunk(text: str | None, finish: str | None) -> dict[str, Any]:
            c: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                c["delta"] = {} if text is None else {"content": text}
            else:
                c["text"] = text or ""
            return {
                "id": rid,
                "object": kind,
                "created": created,
                "model": self.cfg.model,
                "choices": [c],
            }

        if chat:
            first = chunk(None, None)
            first["choices"][0]["delta"] = {"role": "assistant"}
            await send(first)
        while (token := await req.queue.get()) is not None:
            await send(chunk(decode(token), None))
        await send(chunk(None if chat else "", _finish(req)))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            usage = chunk(None, None)
            usage["choices"] = []
            usage["usage"] = _usage(req)
            await send(usage)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        self.served += 1
        return response


def _finish(req: Request) -> str:
    return "length" if len(req.generated) >= req.max_tokens else "stop"


def _usage(req: Request) -> dict[str, int]:
    return {
        "prompt_tokens": len(req.prompt),
        "completion_tokens": len(req.generated),
        "total_tokens": len(req.prompt) + len(req.generated),
    }


def _error(status: int, message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "invalid_request_error"}}, status=status
    )


def serve(cfg: ServerConfig, *, front_hold: Any = None) -> int:
    """Start the workers, wait for them, serve until SIGTERM; the exit code."""
    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)
    t0 = time.monotonic()
    pool = WorkerPool(cfg)
    stopping = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        log(f"signal {signum}: shutting down the workers")
        t = time.monotonic()
        pool.shutdown()
        log(f"workers exited in {time.monotonic() - t:.3f}s")
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    pool.start()
    try:
        pool.wait_loaded()
    except WorkerDied as exc:
        log(f"load failed: {exc}")
        pool.shutdown(5.0)
        return 1
    log(f"loaded in {time.monotonic() - t0:.3f}s: " + json.dumps(pool.load_times))
    return asyncio.run(_serve_http(cfg, pool, front_hold))


async def _serve_http(cfg: ServerConfig, pool: WorkerPool, front_hold: Any) -> int:
    scheduler = Scheduler(pool, cfg)
    api = Api(cfg, pool, scheduler)
    runner = web.AppRunner(api.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port)
    await site.start()
    print(f"INFO:     Uvicorn running on http://{cfg.host}:{cfg.port} (Press CTRL+C to quit)")
    sys.stdout.flush()
    task = asyncio.create_task(scheduler.run())
    try:
        while True:
            await asyncio.sleep(0.5)
            for rank, proc in enumerate(pool.procs):
                code = proc.poll()
                if code is not None and not STOPPING.is_set():
                    log(f"worker {rank} (pid {proc.pid}) exited with code {code}: exiting")
                    return 1
            if task.done():
                log(f"the scheduler stopped: {task.exception()!r}")
                return 1
    finally:
        del front_hold
        await runner.cleanup()


def add_common_args(parser: Any) -> None:
    """Flags both servers take (every one is a sweepable param)."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="tiny-random-lm")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8, help="Requests per decode step.")
    parser.add_argument("--pinned-gib", type=float, default=0.0, help="Pinned host memory.")
    parser.add_argument(
        "--crash-after-requests",
        type=int,
        default=0,
        help="SIGKILL the front process when a request arrives after N were served.",
    )


def dims_of(args: Any) -> ModelDims:
    return ModelDims(
        vocab=args.vocab,
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        context=args.context,
    )


def check_positive(names: Sequence[str], args: Any) -> str | None:
    for name in names:
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1"
    return None
