"""An OpenAI-like server that answers in one HTTP framing per port (stdlib only).

Raw asyncio, so the test controls every byte: each framing listens on a port of its
own on 127.0.0.1, and ``--ports-file`` receives ``{framing: port}`` as JSON once all
of them listen. Every answer (``/health``, ``/v1/models``, ``/v1/completions``,
``/metrics``) is sent in the port's framing; a completion asked with
``"stream": true`` is a stream of three one-word events, a usage event and
``[DONE]``, else one JSON document (``usage.completion_tokens`` 3).

Valid framings: ``length`` (Content-Length, keep-alive), ``chunked``, ``close11``
and ``close10`` (no length: the body ends when the server closes, HTTP/1.1 with
``Connection: close`` and an HTTP/1.0 answer), ``delayed`` (close-delimited, the
body 60 ms after the headers), ``gzip`` (one JSON document even for a stream,
gzip-encoded when the client accepts it), ``split`` (one event written in two
parts 40 ms apart). Invalid: ``garbage`` (no HTTP status line), ``truncated`` (the
first eighth of a chunk, before the end of the first event, then the close),
``reset`` (headers, then a TCP reset).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import socket
import struct

VALID = ("length", "chunked", "close11", "close10", "delayed", "gzip", "split")
INVALID = ("garbage", "truncated", "reset")
FRAMINGS = VALID + INVALID
TOKENS = ("Hello", " there", " friend")


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def stream_events(model: str) -> list[bytes]:
    events = [
        _event({"model": model, "choices": [{"index": 0, "text": t, "finish_reason": None}]})
        for t in TOKENS
    ]
    events[-1] = _event(
        {"model": model, "choices": [{"index": 0, "text": TOKENS[-1], "finish_reason": "length"}]}
    )
    usage = {"prompt_tokens": 1, "completion_tokens": len(TOKENS), "total_tokens": 4}
    events.append(_event({"model": model, "choices": [], "usage": usage}))
    events.append(b"data: [DONE]\n\n")
    return events


def whole_answer(path: str, model: str) -> tuple[int, bytes]:
    if path == "/health":
        return 200, b"{}"
    if path == "/v1/models":
        return 200, json.dumps({"object": "list", "data": [{"id": model}]}).encode()
    if path == "/metrics":
        return 200, b"# no metrics\n"
    if path == "/v1/completions":
        body = {
            "model": model,
            "choices": [{"index": 0, "text": "".join(TOKENS), "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": len(TOKENS), "total_tokens": 4},
        }
        return 200, json.dumps(body).encode()
    return 404, b'{"error": "not found"}'


async def read_request(
    reader: asyncio.StreamReader,
) -> tuple[str, str, dict[str, str], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length") or 0))
    return method, path, headers, body


class Framing:
    def __init__(self, name: str, model: str) -> None:
        self.name = name
        self.model = model

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await read_request(reader)
                if request is None:
                    break
                keep = await self.answer(writer, *request)
                await writer.drain()
                if not keep:
                    break
        except ConnectionError:
            pass
        finally:
            if not writer.transport.is_closing():
                writer.close()

    async def answer(
        self,
        writer: asyncio.StreamWriter,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
    ) -> bool:
        """Write one answer; whether the connection stays open for another."""
        wants_stream = False
        if method == "POST":
            try:
                wants_stream = bool(json.loads(body or b"{}").get("stream"))
            except ValueError:
                wants_stream = False
        name = self.name
        if name == "garbage":
            writer.write(b"SPAM 42 not-http\r\nwhat: ever\r\n\r\nhello")
            return False
        if wants_stream and name != "gzip":
            status, parts, ctype = 200, stream_events(self.model), "text/event-stream"
        else:
            status, data = whole_answer(path, self.model)
            parts, ctype = [data], "application/json"
        extra: list[str] = []
        if name == "gzip" and "gzip" in headers.get("accept-encoding", ""):
            parts = [gzip.compress(b"".join(parts))]
            extra.append("Content-Encoding: gzip")
        version = "HTTP/1.0" if name == "close10" else "HTTP/1.1"
        head = [f"{version} {status} {'OK' if status == 200 else 'Not Found'}"]
        head.append(f"Content-Type: {ctype}")
        head += extra
        total = sum(len(p) for p in parts)
        if name in ("length", "gzip", "reset"):
            head.append(f"Content-Length: {total}")
        elif name in ("chunked", "truncated", "split"):
            head.append("Transfer-Encoding: chunked")
        elif name in ("close11", "delayed"):
            head.append("Connection: close")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        await writer.drain()
        if name == "reset":
            await asyncio.sleep(0.02)
            sock = writer.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if name == "truncated":
            data = b"".join(parts)
            writer.write(f"{len(data):x}\r\n".encode() + data[: len(data) // 8])
            await writer.drain()
            return False
        if name == "delayed":
            await asyncio.sleep(0.06)
        chunked = name in ("chunked", "split")
        for part in parts:
            pieces = [part[:9], part[9:]] if name == "split" else [part]
            for piece in pieces:
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
                await writer.drain()
                if name == "split" and piece is pieces[0]:
                    await asyncio.sleep(0.04)
        if chunked:
            writer.write(b"0\r\n\r\n")
        return name in ("length", "chunked", "gzip", "split")


async def serve(ports_file: str, model: str) -> None:
    servers = {}
    for name in FRAMINGS:
        framing = Framing(name, model)
        servers[name] = await asyncio.start_server(framing.handle, "127.0.0.1", 0)
    ports = {name: s.sockets[0].getsockname()[1] for name, s in servers.items()}
    tmp = ports_file + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(ports, fh)
    os.replace(tmp, ports_file)
    print(f"framing server pid {os.getpid()} listening: {ports}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ports-file", required=True)
    p.add_argument("--model", default="framing-model")
    args = p.parse_args()
    asyncio.run(serve(args.ports_file, args.model))


if __name__ == "__main__":
    main()
