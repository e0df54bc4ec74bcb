"""A tiny OpenAI-like server for the lifecycle tests (stdlib only).

Each flag reproduces one behaviour of a real engine that the lifecycle gates must
handle: slow load, a fatal line then an exit, SIGTERM ignored, a child that ignores
SIGTERM, a worker that escapes the process group (setsid) and outlives the parent,
SO_REUSEPORT, a slow graceful shutdown, fake GPU memory held while alive.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="fake-model")
    p.add_argument("--load-time", type=float, default=0.0)
    p.add_argument("--fatal", default=None, help="print this line while loading, then exit")
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--child-ignore-term", action="store_true")
    p.add_argument("--setsid-worker", action="store_true")
    p.add_argument("--reuse-port", action="store_true")
    p.add_argument("--shutdown-delay", type=float, default=0.0)
    p.add_argument("--hang", action="store_true", help="never listen")
    p.add_argument("--gen-status", type=int, default=200)
    p.add_argument("--reset-all", action="store_true", help="reset every connection it accepts")
    p.add_argument(
        "--trickle", type=float, default=0.0, help="answer generations one byte per N seconds"
    )
    p.add_argument("--big-answer", type=int, default=0, help="generate this many bytes of text")
    p.add_argument(
        "--crash-after",
        type=int,
        default=0,
        help="at this generation, print a CUDA error and a long traceback, then exit 1",
    )
    p.add_argument("--fake-gpus", default=None)
    p.add_argument("--mem", type=int, default=0, help="fake GPU bytes on GPU 0")
    p.add_argument("--release-delay", type=float, default=0.0)
    p.add_argument("--name", default="srv")
    return p.parse_args()


def spawn_sleeper(setsid: bool, ignore_term: bool, args: argparse.Namespace) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else ""
    code = (
        f"import signal, time, sys\n{ignore}"
        f"sys.path.insert(0, {here!r})\n"
        "import fake_server\n"
        f"fake_server.hold_gpu({args.fake_gpus!r}, {args.mem}, {args.release_delay!r}, 'worker')\n"
        "print('worker ready', flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )
    subprocess.Popen(
        [sys.executable, "-c", code],
        start_new_session=setsid,
        stdin=subprocess.DEVNULL,
    )


def hold_gpu(fake_dir: str | None, mem: int, delay: float, name: str) -> None:
    if not fake_dir or mem <= 0:
        return
    from servesweep.fakegpu import FakeGpuDir

    holder = FakeGpuDir(fake_dir).allocate({0: mem}, release_delay_s=delay, name=name)
    holder.start_heartbeat()


CRASH_LINE = "RuntimeError: CUDA error: an illegal memory access was encountered"


def crash(requests: int) -> None:
    print(f"request {requests}: engine step failed", flush=True)
    print(CRASH_LINE, flush=True)
    print("Traceback (most recent call last):", flush=True)
    for i in range(60):
        print(f'  File "engine_core.py", line {100 + i}, in step_{i}', flush=True)
    print("EngineDeadError: the engine died", flush=True)
    os._exit(1)


def main() -> None:
    args = parse()
    stopping = threading.Event()
    print(f"fake server {args.name} pid {os.getpid()} starting", flush=True)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    if args.child_ignore_term:
        spawn_sleeper(False, True, args)
    if args.setsid_worker:
        spawn_sleeper(True, False, args)
    elif not args.child_ignore_term:
        hold_gpu(args.fake_gpus, args.mem, args.release_delay, args.name)
    steps = max(1, int(args.load_time / 0.1))
    for i in range(steps):
        if args.load_time:
            print(f"loading weights {100 * (i + 1) // steps}%", flush=True)
            time.sleep(args.load_time / steps)
    if args.fatal:
        print("Traceback (most recent call last):", flush=True)
        print('  File "engine.py", line 1, in load', flush=True)
        print(args.fatal, flush=True)
        sys.exit(args.exit_code)
    if args.hang:
        while True:
            print("still loading...", flush=True)
            time.sleep(0.5)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *a: object) -> None:
            pass

        def _send(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {"name": args.name})
            elif self.path == "/v1/models":
                self._send(200, {"data": [{"id": args.model, "owner": args.name}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._send(404, {"error": "not found"})
                return
            generations[0] += 1
            if args.crash_after and generations[0] >= args.crash_after:
                crash(generations[0])
            if args.gen_status != 200:
                self._send(args.gen_status, {"error": "engine failure"})
                return
            if args.trickle:
                self.trickle()
                return
            self._send(
                200,
                {
                    "choices": [{"text": " hi" + "x" * args.big_answer, "index": 0}],
                    "usage": {"completion_tokens": 2},
                    "served_by": args.name,
                },
            )

        def trickle(self) -> None:
            """A stream that accepts the request and then sends one byte (an SSE
            comment line) every ``--trickle`` seconds, never a token."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            self.wfile.flush()
            try:
                while not stopping.is_set():
                    self.wfile.write(b":")
                    self.wfile.flush()
                    time.sleep(args.trickle)
            except OSError:
                pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def server_bind(self) -> None:
            if args.reuse_port:
                self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            super().server_bind()

        def verify_request(self, request: object, client_address: object) -> bool:
            if not args.reset_all:
                return True
            assert isinstance(request, socket.socket)
            # Linger 0: close() sends RST, the client sees "connection reset by peer".
            request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False

    generations = [0]

    server = Server((args.host, args.port), Handler)
    print(f"Uvicorn running on http://{args.host}:{args.port} ({args.name})", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while not stopping.wait(0.05):
        pass
    print(f"shutting down ({args.shutdown_delay}s)", flush=True)
    time.sleep(args.shutdown_delay)
    server.shutdown()
    print("bye", flush=True)


if __name__ == "__main__":
    main()
