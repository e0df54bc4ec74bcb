"""One HTTP exchange with a server under test, bounded as a whole, and what it proved.

The gates ask a server few questions (health, model list, one short generation), but
each must end by a deadline that counts the whole exchange: connecting, sending,
and every read of the answer. A per-read socket timeout does not: a server that
sends one byte every two seconds never trips it. Here every read is given only the
time left until the deadline, so an exchange never outlasts it.

A generation is asked for as a stream (``"stream": true``) and read only until the
first token, so a large or endless answer costs nothing; a server that ignores
``stream`` answers with one JSON document, read whole (up to ``_MAX_BODY``).

Every socket or HTTP error is an observation (:class:`HttpError`), never an
exception: ``kind`` says whether the server could not be reached (``connect``), did
not answer in time (``timeout``), or accepted the connection and then broke it
(``broken``: reset, closed without an answer, a malformed answer).
"""

from __future__ import annotations

import http.client
import io
import ipaddress
import json
import socket
import time
from dataclasses import dataclass
from typing import Any, Literal

from servesweep.servers import ports

__all__ = [
    "HttpAnswer",
    "HttpError",
    "connect_host",
    "count_tokens",
    "exchange",
    "first_model",
    "http_call",
    "is_local",
]

_ACCEPT_WAIT = 0.5
_MAX_BODY = 64 * 2**20
"""A JSON answer larger than this is not read further."""
_MAX_STREAM = 16 * 2**20
"""Bytes of a stream read while waiting for its first token."""

ErrorKind = Literal["connect", "timeout", "broken"]


@dataclass(frozen=True)
class HttpError:
    """Why an exchange produced no answer; ``str()`` is the one-line description."""

    kind: ErrorKind
    text: str

    def __str__(self) -> str:
        return self.text


class HttpAnswer:
    """A status and the body bytes read. For a streamed generation, ``tokens`` is the
    number of tokens seen before reading stopped and ``note`` says how the stream went;
    both are None for a plain answer (``count_tokens`` reads its JSON)."""

    def __init__(
        self,
        status: int,
        body: bytes,
        served_by_other: set[int],
        *,
        tokens: int | None = None,
        note: str | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.served_by_other = served_by_other
        self.tokens = tokens
        self.note = note

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def is_local(host: str) -> bool:
    if host in ("", "localhost", "0.0.0.0", "::"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def connect_host(host: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


class _DeadlineReader(io.RawIOBase):
    """The receiving side of a socket; each read waits only until the deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(_left(self._deadline))
        return self._sock.recv_into(buffer)


class _DeadlineSocket:
    """A connected socket whose sends and reads all end by one deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(_left(self._deadline))
        self._sock.sendall(data)

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _Connection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, deadline: float) -> None:
        super().__init__(host, port, timeout=_left(deadline))
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self._deadline)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


def exchange(
    host: str,
    port: int,
    method: str,
    path: str,
    *,
    deadline: float,
    body: dict[str, Any] | None = None,
    api_key: str | None = None,
    ours: set[int] | None = None,
    until_token: bool = False,
) -> HttpAnswer | HttpError:
    """One request, finished (or abandoned) by ``deadline`` (``time.monotonic()``).

    ``ours``: PIDs of the instance; the answer's ``served_by_other`` names the process
    that accepted the connection when it is not one of them. ``until_token``: the
    request asks for a stream; a 200 answer is read until its first token.
    """
    what = f"{method} {path}"
    try:
        conn = _Connection(connect_host(host), port, deadline)
    except TimeoutError:
        return HttpError("timeout", f"{what}: no time left before the deadline")
    headers = {"Accept": "text/event-stream" if until_token else "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    sent = False
    try:
        conn.connect()
        client = conn.sock.getsockname() if conn.sock is not None else None
        known, other = False, set[int]()
        if ours and client is not None:
            # Who accepted the connection, asked before the request: a server that
            # answers and closes at once (an old one draining) leaves nothing to see
            # afterwards.
            known, other = _accepted_by(port, client, ours, deadline)
        conn.request(method, path, body=data, headers=headers)
        sent = True
        resp = conn.getresponse()
        if until_token and resp.status == 200 and _is_stream(resp):
            answer = _read_stream(resp, what, deadline)
        else:
            payload, complete = _read_body(resp)
            note = None if complete else f"the answer exceeds {_MAX_BODY} bytes; not read further"
            answer = HttpAnswer(resp.status, payload, set(), note=note)
        if ours and client is not None and not known:
            known, other = _accepted_by(port, client, ours, deadline, wait=0.0)
        answer.served_by_other = other
        return answer
    except TimeoutError:
        if not sent:
            return HttpError("timeout", f"{what}: not connected before the deadline")
        return HttpError("timeout", f"{what}: no complete answer before the deadline")
    except ConnectionRefusedError as exc:
        return HttpError("connect", f"{what}: {type(exc).__name__}: {exc}".strip())
    except (OSError, http.client.HTTPException) as exc:
        kind: ErrorKind = "broken" if sent or _is_broken(exc) else "connect"
        return HttpError(kind, f"{what}: {type(exc).__name__}: {exc}".strip())
    finally:
        conn.close()


def _is_broken(exc: BaseException) -> bool:
    return isinstance(exc, (ConnectionResetError, BrokenPipeError, http.client.HTTPException))


def http_call(
    host: str,
    port: int,
    method: str,
    path: str,
    *,
    body: dict[str, Any] | None = None,
    api_key: str | None,
    timeout: float,
    ours: set[int] | None = None,
) -> HttpAnswer | str:
    """One request that ends within ``timeout`` seconds in all; an ``HttpAnswer`` or a
    short description of what went wrong."""
    answer = exchange(
        host,
        port,
        method,
        path,
        deadline=time.monotonic() + timeout,
        body=body,
        api_key=api_key,
        ours=ours,
    )
    return str(answer) if isinstance(answer, HttpError) else answer


def _is_stream(resp: http.client.HTTPResponse) -> bool:
    return "text/event-stream" in (resp.getheader("Content-Type") or "")


def _read_body(resp: http.client.HTTPResponse) -> tuple[bytes, bool]:
    """The whole body (and True), or its first ``_MAX_BODY`` bytes (and False)."""
    chunks: list[bytes] = []
    size = 0
    while size <= _MAX_BODY:
        chunk = resp.read1(1 << 16)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), False


def _read_stream(resp: http.client.HTTPResponse, what: str, deadline: float) -> HttpAnswer:
    """Server-sent events until the first token, the end of the stream, an error event
    or ``_MAX_STREAM`` bytes; the answer's ``note`` says which."""
    events = 0
    size = 0
    pending = b""
    seen: list[bytes] = []
    while size < _MAX_STREAM:
        try:
            chunk = resp.read1(1 << 16)
        except TimeoutError:
            note = f"no token before the deadline ({events} events, {size} bytes received)"
            return HttpAnswer(200, b"".join(seen), set(), tokens=0, note=note)
        if not chunk:
            note = f"the stream closed without [DONE] after {events} events and no token"
            return HttpAnswer(200, b"".join(seen), set(), tokens=0, note=note)
        size += len(chunk)
        if len(seen) < 4:
            seen.append(chunk[:512])
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for raw in lines:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            events += 1
            if payload == b"[DONE]":
                note = f"the stream ended ([DONE]) after {events} events without a token"
                return HttpAnswer(200, b"".join(seen), set(), tokens=0, note=note)
            event = _json(payload)
            error = event.get("error") if isinstance(event, dict) else None
            if error:
                note = f"the stream reported an error: {str(error)[:300]}"
                return HttpAnswer(200, b"".join(seen), set(), tokens=0, note=note)
            tokens = _event_tokens(event)
            if tokens:
                return HttpAnswer(200, b"".join(seen), set(), tokens=tokens, note="first token")
    note = f"{size} bytes of stream without a token; stopped reading"
    return HttpAnswer(200, b"".join(seen), set(), tokens=0, note=note)


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _choice_text(choice: Any) -> str:
    """The generated text of one choice: completion ``text``, a chat ``message`` or a
    streamed ``delta`` (its content, or reasoning a reasoning model emits first)."""
    if not isinstance(choice, dict):
        return ""
    for holder in (choice, choice.get("message"), choice.get("delta")):
        if not isinstance(holder, dict):
            continue
        for key in ("text", "content", "reasoning_content", "reasoning"):
            value = holder.get(key)
            if isinstance(value, str) and value:
                return value
    return ""


def _event_tokens(data: Any) -> int:
    if not isinstance(data, dict):
        return 0
    usage = data.get("usage")
    completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(completion, int) and completion > 0:
        return completion
    choices = data.get("choices")
    if isinstance(choices, list) and any(_choice_text(c) for c in choices):
        return 1
    return 0


def count_tokens(answer: HttpAnswer) -> int:
    """Tokens an answer proves were generated: those seen in a stream, else the
    ``usage`` of a JSON answer, else 1 when it carries text."""
    if answer.tokens is not None:
        return answer.tokens
    data = answer.json()
    if not isinstance(data, dict):
        return 0
    usage = data.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    choices = data.get("choices")
    if isinstance(choices, list) and choices:
        return 1 if _choice_text(choices[0]) else 0
    return 0


def first_model(answer: HttpAnswer) -> str | None:
    data = answer.json()
    if isinstance(data, dict) and isinstance(data.get("data"), list) and data["data"]:
        first = data["data"][0]
        if isinstance(first, dict) and isinstance(first.get("id"), str):
            return str(first["id"])
    return None


def _accepted_by(
    port: int,
    client: tuple[Any, ...],
    ours: set[int],
    deadline: float,
    wait: float = _ACCEPT_WAIT,
) -> tuple[bool, set[int]]:
    """(owner known, other PIDs) for the server side of the connection from ``client``:
    ``(True, set())`` when one of ``ours`` holds it, ``(True, {pid})`` for another
    process, ``(False, set())`` while nobody has accepted it yet (after ``wait``)."""
    until = min(time.monotonic() + wait, deadline)
    while True:
        if ports.connection_owner(port, client, ours):
            return True, set()
        other = ports.connection_owner(port, client) - ours
        if other:
            return True, other
        if time.monotonic() >= until:
            return False, set()
        time.sleep(0.005)
