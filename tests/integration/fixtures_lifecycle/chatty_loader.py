"""A server that listens at once, answers 503 while it "loads", and logs every request
(an access log, like uvicorn's or llama-server's), for the readiness poll tests.

At the end of the load it prints ``ready after N requests while loading`` and from
then on serves a streamed completion (stdlib only).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--load-time", type=float, default=2.0)
    args = p.parse_args()
    ready = threading.Event()
    lock = threading.Lock()
    counts = {"loading": 0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *a: object) -> None:
            print(f'INFO:     127.0.0.1 - "{self.command} {self.path} HTTP/1.1"', flush=True)

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _loading(self) -> bool:
            if ready.is_set():
                return False
            with lock:
                counts["loading"] += 1
            self._send(503, b'{"error": "loading"}')
            return True

        def do_GET(self) -> None:
            if self._loading():
                return
            if self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": "chatty"}]}).encode())
            else:
                self._send(200, b"{}")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self._loading():
                return
            event = {"choices": [{"index": 0, "text": "hi", "finish_reason": "length"}]}
            body = b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n"
            self._send(200, body, "text/event-stream")

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on {args.port}, loading for {args.load_time:g}s", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(args.load_time)
    with lock:
        ready.set()
        print(f"ready after {counts['loading']} requests while loading", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
