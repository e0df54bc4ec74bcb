"""One HTTP exchange with a server under test, bounded as a whole, and what it proved.

The gates and ``doctor`` ask a server few questions (health, model list, one short
generation), but each must end by a deadline that counts the whole exchange:
connecting, sending, and every read of the answer. A per-read socket timeout does
not: a server that sends one byte every two seconds never trips it. The exchange is
made with aiohttp inside one ``asyncio.wait_for``, so it never outlasts its deadline,
whatever the framing of the answer: Content-Length, chunked, or a body that ends
when the server closes the connection (HTTP/1.0, ``Connection: close``), gzip- or
deflate-encoded.

A generation is asked for as a stream (``"stream": true``) and read only until the
first token, so a large or endless answer costs nothing; a server that ignores
``stream`` answers with one JSON document, read whole (up to ``_MAX_BODY``).

Who accepted the connection is looked up once it is made and before the request is
written (:class:`_OwnerConnector`): the server side of the connection from its local
address (netlink ``sock_diag``, else ``/proc/net/tcp``), then whether one of the
instance's processes holds that socket; every process's descriptors are read only
when none of the instance's does (to name the other one).

Every socket or HTTP error is an observation (:class:`HttpError`), never an
exception: ``kind`` says whether the server could not be reached (``connect``), did
not answer in time (``timeout``), or accepted the connection and then broke it
(``broken``: reset, closed without an answer, a malformed answer).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import json
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import aiohttp
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

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
_READ = 1 << 16

ErrorKind = Literal["connect", "timeout", "broken"]
_T = TypeVar("_T")


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


@dataclass
class _Owner:
    """What the connection showed of the process that accepted it."""

    port: int
    ours: set[int] | None
    deadline: float
    client: tuple[Any, ...] | None = None
    """The connection's local address (None until connected)."""
    known: bool = False
    other: set[int] = field(default_factory=set)


class _OwnerConnector(aiohttp.TCPConnector):
    """One connection, closed after its answer; once it is made (before the request
    is written) the process on the server side is looked up among ``ours``."""

    def __init__(self, owner: _Owner) -> None:
        super().__init__(force_close=True, limit=1, use_dns_cache=False)
        self._owner = owner

    async def connect(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        conn = await super().connect(req, traces, timeout)
        owner = self._owner
        transport = conn.transport
        owner.client = transport.get_extra_info("sockname") if transport is not None else None
        if owner.ours and owner.client is not None:
            # Asked before the request: a server that answers and closes at once (an
            # old one draining) leaves nothing to see afterwards.
            owner.known, owner.other = await _accepted_by(owner, _ACCEPT_WAIT)
        return conn


@dataclass
class _Stream:
    """What a stream showed before reading stopped (kept when the deadline ends it)."""

    events: int = 0
    size: int = 0
    seen: list[bytes] = field(default_factory=list)

    def answer(self, note: str, tokens: int = 0) -> HttpAnswer:
        return HttpAnswer(200, b"".join(self.seen), set(), tokens=tokens, note=note)


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
    if deadline - time.monotonic() <= 0:
        return HttpError("timeout", f"{what}: no time left before the deadline")
    owner = _Owner(port, ours, deadline)
    stream = _Stream() if until_token else None
    call = _exchange(host, port, method, path, body, api_key, owner, stream)
    try:
        answer = _run(asyncio.wait_for(call, deadline - time.monotonic()))
    except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
        if owner.client is None:
            return HttpError("timeout", f"{what}: not connected before the deadline")
        if stream is not None and stream.size:
            return stream.answer(
                f"no token before the deadline ({stream.events} events, "
                f"{stream.size} bytes received)"
            )
        return HttpError("timeout", f"{what}: no complete answer before the deadline")
    except aiohttp.ClientConnectorError as exc:
        return HttpError("connect", f"{what}: {_describe(exc.os_error)}")
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        # ValueError: a URL or header aiohttp refuses (InvalidURL is one)
        kind: ErrorKind = "broken" if owner.client is not None else "connect"
        return HttpError(kind, f"{what}: {_describe(exc)}")
    if ours and owner.client is not None and not owner.known:
        owner.known, owner.other = _run(_accepted_by(owner, 0.0))
    answer.served_by_other = owner.other
    return answer


def _describe(exc: BaseException) -> str:
    """``Type: text`` of an HTTP client error, in one line."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "ServerDisconnectedError: the server closed the connection without a complete answer"
    if isinstance(exc, aiohttp.ClientResponseError):
        text = " ".join(str(exc.message).split())
        return f"{type(exc).__name__}: not a valid HTTP answer: {text}"[:300]
    text = " ".join(str(exc).split()) or repr(exc)
    return f"{type(exc).__name__}: {text}"[:300]


def _run(call: Coroutine[Any, Any, _T]) -> _T:
    """Run ``call`` in an event loop of its own (in a worker thread when this thread
    already runs one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(call)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, call).result()


async def _exchange(
    host: str,
    port: int,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    api_key: str | None,
    owner: _Owner,
    stream: _Stream | None,
) -> HttpAnswer:
    headers = {"Accept": "text/event-stream" if stream is not None else "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    address = connect_host(host)
    if ":" in address:
        address = f"[{address}]"
    url = f"http://{address}:{port}{path}"
    async with (
        aiohttp.ClientSession(
            connector=_OwnerConnector(owner),
            timeout=aiohttp.ClientTimeout(total=None),
            cookie_jar=aiohttp.DummyCookieJar(),
            raise_for_status=False,
        ) as session,
        session.request(method, url, data=data, headers=headers) as resp,
    ):
        if stream is not None and resp.status == 200 and _is_stream(resp):
            answer = await _read_stream(resp, stream)
            resp.close()  # the rest of the stream is not read
            return answer
        payload, complete = await _read_body(resp)
        note = None if complete else f"the answer exceeds {_MAX_BODY} bytes; not read further"
        return HttpAnswer(resp.status, payload, set(), note=note)


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


def _is_stream(resp: aiohttp.ClientResponse) -> bool:
    return "text/event-stream" in resp.headers.get("Content-Type", "")


async def _read_body(resp: aiohttp.ClientResponse) -> tuple[bytes, bool]:
    """The whole body (and True), or its first ``_MAX_BODY`` bytes (and False)."""
    chunks: list[bytes] = []
    size = 0
    while size <= _MAX_BODY:
        chunk = await resp.content.read(_READ)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    resp.close()
    return b"".join(chunks), False


async def _read_stream(resp: aiohttp.ClientResponse, stream: _Stream) -> HttpAnswer:
    """Server-sent events until the first token, the end of the stream, an error event
    or ``_MAX_STREAM`` bytes; the answer's ``note`` says which."""
    pending = b""
    while stream.size < _MAX_STREAM:
        chunk = await resp.content.readany()
        if not chunk:
            return stream.answer(
                f"the stream closed without [DONE] after {stream.events} events and no token"
            )
        stream.size += len(chunk)
        if len(stream.seen) < 4:
            stream.seen.append(chunk[:512])
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for raw in lines:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            stream.events += 1
            if payload == b"[DONE]":
                return stream.answer(
                    f"the stream ended ([DONE]) after {stream.events} events without a token"
                )
            event = _json(payload)
            error = event.get("error") if isinstance(event, dict) else None
            if error:
                return stream.answer(f"the stream reported an error: {str(error)[:300]}")
            tokens = _event_tokens(event)
            if tokens:
                return stream.answer("first token", tokens)
    return stream.answer(f"{stream.size} bytes of stream without a token; stopped reading")


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


async def _accepted_by(owner: _Owner, wait: float) -> tuple[bool, set[int]]:
    """(owner known, other PIDs) for the server side of the connection from
    ``owner.client``: ``(True, set())`` when one of ``owner.ours`` holds it,
    ``(True, {pid})`` for another process, ``(False, set())`` while nobody has
    accepted it yet (after ``wait``). Until the connection is accepted only the TCP
    tables are read; every process's descriptors only when it is not ours."""
    ours = owner.ours or set()
    assert owner.client is not None
    until = min(time.monotonic() + wait, owner.deadline)
    while True:
        inodes = ports.connection_inodes(owner.port, owner.client)
        if inodes:
            if ports.socket_owners(inodes, ours):
                return True, set()
            found = ports.socket_owners(inodes)
            other = set().union(*found.values()) - ours if found else set()
            if other:
                return True, other
        if time.monotonic() >= until:
            return False, set()
        await asyncio.sleep(0.002)
