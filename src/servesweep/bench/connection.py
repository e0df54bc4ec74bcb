"""Keep-alive connections of the load generator, without handing a request a
connection the server has already closed.

A server may close a kept-alive connection right after a response although its
headers promise keep-alive. llama.cpp's llama-server does it after every streamed
answer (``Keep-Alive: timeout=5, max=100``, then a close: its chunked content
provider reports "no more data" after the terminating chunk, which cpp-httplib
reads as a cancelled response, ending the connection's keep-alive loop). A client
that has read the whole answer returns the connection to its pool before the
server's FIN has arrived; the next request is written into the closed socket and
fails within a millisecond (``Server disconnected``, ``Connection reset by peer``,
``Can not write request body``): every second request, in a closed loop.

Two defences, cheap enough for the hot path:

- :class:`KeepAliveConnector` polls a pooled connection's socket before it is
  reused: an idle HTTP/1.1 connection has nothing to read, so a readable one was
  closed by the server (or broke the protocol) and is dropped for another one;
- a FIN still on its way is not seen by the poll: a request that fails on a
  reused connection before its response began is sent once more, on a new
  connection (:func:`open_response`); the caller records that it was resent.
"""

from __future__ import annotations

import select
import weakref
from contextvars import ContextVar
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

__all__ = ["Attempt", "KeepAliveConnector", "describe", "open_response"]


class Attempt:
    """One request's dealings with the connection pool (see :func:`open_response`)."""

    __slots__ = ("first_error", "fresh", "reused")

    def __init__(self) -> None:
        self.reused = False
        """The connection the request went out on had served a request before."""
        self.fresh = False
        """Ask for a new connection: pooled ones are closed instead of reused."""
        self.first_error: str | None = None
        """The first attempt's error when the request was sent a second time."""


_ATTEMPT: ContextVar[Attempt | None] = ContextVar("servesweep_http_attempt", default=None)

_RESENDABLE = (
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    aiohttp.ClientConnectionResetError,
)
"""What a stale connection fails with; a failed connect (ClientConnectorError, a
ClientOSError too) is never resent: nothing is listening."""


def _peer_closed(proto: ResponseHandler) -> bool:
    """Whether an idle connection's socket is readable (EOF or stray bytes)."""
    transport = proto.transport
    if transport is None or transport.is_closing():
        return True
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    poller = select.poll()  # not select(): descriptors above 1023 are common at high concurrency
    try:
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


class KeepAliveConnector(aiohttp.TCPConnector):
    """A ``TCPConnector`` that never reuses a connection whose server has closed it
    (as far as the socket shows) and that can be asked for a new connection."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # weak references to every connection handed out (a WeakSet without its
        # Python-level wrapper, which costs more than the rest of the check)
        self._handed_out: set[weakref.ref[ResponseHandler]] = set()

    async def connect(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        attempt = _ATTEMPT.get()
        while True:  # each turn closes one pooled connection: bounded by the pool
            conn = await super().connect(req, traces, timeout)
            proto = conn.protocol
            if proto is None or weakref.ref(proto) not in self._handed_out:
                if proto is not None:
                    self._handed_out.add(weakref.ref(proto, self._handed_out.discard))
                if attempt is not None:
                    attempt.reused = False
                return conn
            if (attempt is not None and attempt.fresh) or _peer_closed(proto):
                conn.close()
                continue
            if attempt is not None:
                attempt.reused = True
            return conn


def describe(exc: BaseException) -> str:
    """``Type: text`` of an exception, for a failed request's record."""
    text = " ".join(str(exc).split()) or repr(exc)
    return f"{type(exc).__name__}: {text}"[:300]


def _nothing_received(exc: BaseException) -> bool:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        # aiohttp passes the partial response message when bytes had arrived
        return isinstance(exc.message, str)
    return True


async def open_response(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: Any, attempt: Attempt
) -> aiohttp.ClientResponse:
    """POST and return the response once its status line and headers arrived.

    A request that fails on a reused connection before any byte of its response
    arrived (the server had closed that connection) is sent once more, on a new
    connection; ``attempt.first_error`` then holds the first attempt's error. A
    second failure raises, like any other."""
    token = _ATTEMPT.set(attempt)
    try:
        try:
            return await session.post(url, data=body, headers=headers)
        except _RESENDABLE as exc:
            if not attempt.reused or not _nothing_received(exc):
                raise
            attempt.first_error = describe(exc)
        attempt.fresh = True
        return await session.post(url, data=body, headers=headers)
    finally:
        _ATTEMPT.reset(token)
