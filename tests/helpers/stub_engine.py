"""A stub OpenAI-compatible engine that streams the way llama.cpp's llama-server does,
with switches for the faults the load generator must survive.

Like llama-server (cpp-httplib), it is a blocking server with one thread per
connection and a keep-alive loop; a streamed answer has ``Transfer-Encoding:
chunked``, ``Keep-Alive: timeout=5, max=100``, SSE chunks, a last chunk with
``finish_reason``, a usage chunk and ``data: [DONE]``. And like llama-server it
closes the connection right after every streamed answer although its headers
promised keep-alive (its chunked content provider reports "no more data", which
cpp-httplib reads as a cancelled response, ending the connection's keep-alive
loop); a non-streamed answer keeps the connection.

    python -m tests.helpers.stub_engine [--close-after-stream now|keep|MS] [faults...]

prints ``port N`` once it listens on 127.0.0.1 (``--port 0``: a free port) and
serves until killed. Faults: ``--truncate-after K`` (the body ends cleanly after
K token chunks, with neither ``finish_reason`` nor ``[DONE]``), ``--usage`` (what
the usage says: ``ok``, ``none`` (no usage sent), ``negative``, ``float``,
``short``: fewer completion tokens than chunks were streamed, ``decreasing``: a
running count that goes down),
``--stall-after K`` (after K token chunks send nothing more, keep the connection
open), ``--stall-every N`` (only every N-th generation stalls).
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import sys
import threading
import time
from typing import Any

__all__ = ["main"]

_KEEP_ALIVE_S = 5.0
_MAX_BODY = 1 << 20


class _Closed(Exception):
    """The client went away."""


def _read_request(conn: socket.socket, buf: bytearray) -> tuple[str, str, bytes] | None:
    """One request (method, path, body); None when the client closed between requests."""
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            if buf:
                raise _Closed
            return None
        buf += data
    end = buf.index(b"\r\n\r\n")
    head = bytes(buf[:end]).decode("latin-1")
    del buf[: end + 4]
    lines = head.split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = min(int(value.strip()), _MAX_BODY)
    while len(buf) < length:
        data = conn.recv(65536)
        if not data:
            raise _Closed
        buf += data
    body = bytes(buf[:length])
    del buf[:length]
    return method, path, body


def _send(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError as exc:
        raise _Closed from exc


def _chunk(payload: bytes) -> bytes:
    data = b"data: " + payload + b"\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class _Engine:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.generations = itertools.count(1)
        self.lock = threading.Lock()

    def handle(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(_KEEP_ALIVE_S)
        buf = bytearray()
        try:
            while True:
                try:
                    request = _read_request(conn, buf)
                except TimeoutError:
                    return  # the keep-alive timeout: close, as cpp-httplib does
                if request is None:
                    return
                method, path, body = request
                if not self.answer(conn, method, path, body):
                    return
        except (_Closed, OSError):
            return
        finally:
            conn.close()

    def answer(self, conn: socket.socket, method: str, path: str, body: bytes) -> bool:
        """Answer one request; False closes the connection."""
        if method == "GET" and path == "/v1/models":
            payload = json.dumps({"object": "list", "data": [{"id": "stub", "object": "model"}]})
            self.plain(conn, 200, payload.encode())
            return True
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            self.plain(conn, 404, b'{"error": {"message": "not found", "code": 404}}')
            return True
        request = json.loads(body or b"{}")
        chat = path.endswith("chat/completions")
        n = max(1, int(request.get("max_tokens") or 16))
        with self.lock:
            generation = next(self.generations)
        if not request.get("stream"):
            self.plain(conn, 200, json.dumps(self.whole(chat, n)).encode())
            return True
        self.stream(conn, chat, n, generation)
        close = self.args.close_after_stream
        if close == "keep":
            return True
        if close != "now":
            time.sleep(float(close) / 1000)
        return False

    def plain(self, conn: socket.socket, status: int, payload: bytes) -> None:
        reason = {200: "OK", 404: "Not Found"}[status]
        _send(
            conn,
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Keep-Alive: timeout={_KEEP_ALIVE_S:g}, max=100\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload,
        )

    def whole(self, chat: bool, n: int) -> dict[str, Any]:
        text = "".join(f" w{k}" for k in range(n))
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {"choices": [choice], "usage": self.usage(n, n, final=True)}

    def usage(self, k: int, n: int, *, final: bool) -> dict[str, Any] | None:
        """The usage after ``k`` of ``n`` tokens, spoiled as ``--usage`` says."""
        kind = self.args.usage
        if kind == "none":
            return None
        completion: Any = k
        prompt: Any = 7
        if kind == "negative":
            prompt, completion = -7, -k
        elif kind == "float":
            completion = k + 0.5
        elif kind == "short" and final:
            completion = max(0, n // 2)
        elif kind == "decreasing" and not final and k > 2:
            completion = k - 2  # 1, 2, 1, 2, 3...
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": 7 + k}

    def stream(self, conn: socket.socket, chat: bool, n: int, generation: int) -> None:
        a = self.args
        _send(
            conn,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Keep-Alive: timeout=5, max=100\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        base = {"id": "cmpl-stub", "object": "chat.completion.chunk", "model": "stub"}

        def event(choice: dict[str, Any] | None, usage: dict[str, Any] | None) -> bytes:
            obj: dict[str, Any] = dict(base, choices=[] if choice is None else [choice])
            if usage is not None:
                obj["usage"] = usage
            return _chunk(json.dumps(obj, separators=(",", ":")).encode())

        if chat:
            _send(conn, event({"index": 0, "delta": {"role": "assistant", "content": ""}}, None))
        stall = a.stall_after is not None and generation % a.stall_every == 0
        for k in range(1, n + 1):
            if a.gap_ms:
                time.sleep(a.gap_ms / 1000)
            if stall and k > a.stall_after:
                self.hold(conn)
                return
            if a.truncate_after is not None and k > a.truncate_after:
                _send(conn, b"0\r\n\r\n")  # a clean end of the body, the answer cut short
                return
            piece = f" w{k}"
            choice: dict[str, Any] = {"index": 0, "finish_reason": None}
            if chat:
                choice["delta"] = {"content": piece}
            else:
                choice["text"] = piece
            _send(conn, event(choice, self.usage(k, n, final=False)))
        end: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        end["delta" if chat else "text"] = {} if chat else ""
        tail = event(end, None) + event(None, self.usage(n, n, final=True))
        _send(conn, tail + _chunk(b"[DONE]") + b"0\r\n\r\n")

    @staticmethod
    def hold(conn: socket.socket) -> None:
        """Send nothing more; return when the client goes away."""
        conn.settimeout(0.2)
        while True:
            try:
                if not conn.recv(4096):
                    return
            except TimeoutError:
                continue


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="stub_engine", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--gap-ms", type=float, default=1.0, help="between token chunks")
    p.add_argument(
        "--close-after-stream",
        default="now",
        help="now (llama-server), keep, or a delay in ms before closing",
    )
    p.add_argument("--truncate-after", type=int, default=None, metavar="K")
    p.add_argument(
        "--usage", choices=("ok", "none", "negative", "float", "short", "decreasing"), default="ok"
    )
    p.add_argument("--stall-after", type=int, default=None, metavar="K")
    p.add_argument("--stall-every", type=int, default=1, metavar="N")
    args = p.parse_args(argv)
    engine = _Engine(args)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", args.port))
    srv.listen(512)
    print(f"port {srv.getsockname()[1]}", flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=engine.handle, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
