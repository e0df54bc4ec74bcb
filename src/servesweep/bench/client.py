"""The streaming OpenAI-compatible HTTP client of the load generator.

One request is one :func:`send` call. The hot path does the least possible work:
while a response streams, each network read is stored as ``(monotonic_ns, bytes)``;
the SSE events are split and parsed once the stream has ended
(:func:`~servesweep.bench.responses.parse_stream`), so parsing never delays the
timestamp of a later chunk. Connections are kept alive, never reused once the
server has closed them (:mod:`servesweep.bench.connection`).

Timestamps come from ``time.monotonic_ns`` (CLOCK_MONOTONIC on Linux, shared by
all processes of the machine, so samples of several worker processes merge).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from time import monotonic_ns
from typing import Any

import aiohttp

from servesweep.bench.connection import Attempt, KeepAliveConnector, describe, open_response
from servesweep.bench.responses import RawResult, error_message, parse_into, parse_stream
from servesweep.errors import BenchError

__all__ = ["Cutoff", "RawResult", "make_session", "parse_stream", "send"]

_MAX_ERROR_BODY = 2048


@dataclass(slots=True)
class Cutoff:
    """Shared by the requests of one level: the plan runner sets ``reason`` before it
    cancels the requests still in flight when the level's time is up, so that
    :func:`send` records each of them as a ``timeout`` instead of raising."""

    reason: str | None = None
    count: int = 0
    """How many requests were cancelled and recorded as timeouts."""


def make_session(timeout_s: float, connections: int = 0) -> aiohttp.ClientSession:
    """A session tuned for load generation: keep-alive (never on a connection the
    server has closed, see :mod:`servesweep.bench.connection`), no connection limit
    unless given, no cookie jar, one total timeout per request. A gzip- or
    deflate-encoded answer (a proxy may compress JSON) is decoded as it arrives."""
    connector = KeepAliveConnector(limit=connections, limit_per_host=0, force_close=False)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=True,
        raise_for_status=False,
    )


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    index: int,
    *,
    stream: bool = True,
    scheduled_ns: int | None = None,
    cutoff: Cutoff | None = None,
) -> RawResult:
    """Send one request and return what arrived. Never raises for a failed request:
    the failure is data (``ok=False``, ``error`` type, ``message`` with the text).
    Cancelled after ``cutoff`` was given its reason, the request is a ``timeout``."""
    sent = monotonic_ns()
    result = RawResult(index=index, sent_ns=sent, scheduled_ns=scheduled_ns)
    reads: list[tuple[int, bytes]] = []
    attempt = Attempt()
    streamed = stream
    try:
        async with await open_response(session, url, body, headers, attempt) as resp:
            if resp.status != 200:
                text = await resp.content.read(_MAX_ERROR_BODY)
                result.error = f"http_{resp.status}"
                result.message = error_message(text)
            elif stream and "application/json" in resp.headers.get("Content-Type", ""):
                # a server that ignores "stream" answers with one JSON document
                streamed = False
                data = await resp.read()
                reads.append((monotonic_ns(), data))
            elif stream:
                content = resp.content
                append = reads.append
                while True:
                    data = await content.readany()
                    if not data:
                        break
                    append((monotonic_ns(), data))
            else:
                data = await resp.read()
                reads.append((monotonic_ns(), data))
    except asyncio.TimeoutError:
        result.error = "timeout"
        limit = session.timeout.total
        result.message = "no complete response within the request timeout" + (
            f" ({limit:g} s)" if limit else ""
        )
    except asyncio.CancelledError:
        if cutoff is None or cutoff.reason is None:
            raise
        result.error = "timeout"
        result.message = cutoff.reason
        cutoff.count += 1
    except aiohttp.ClientPayloadError as exc:
        result.error = "incomplete"
        result.message = describe(exc)
    except aiohttp.ClientResponseError as exc:
        # raise_for_status is off: only an answer that is not HTTP (a garbage status
        # line, malformed headers) raises this
        result.error = "bad_response"
        result.message = describe(exc)
    except (aiohttp.ClientConnectionError, OSError) as exc:
        result.error = "connection"
        result.message = describe(exc)
    except Exception as exc:  # any other failure is data too, with its text
        result.error = "client_error"
        result.message = describe(exc)
    if attempt.first_error is not None:
        result.resent = attempt.first_error
        if result.error is not None:
            result.message += f" (sent a second time, after: {attempt.first_error})"
    if result.error is not None and result.error.startswith("http_"):
        result.end_ns = monotonic_ns()
        return result
    result.end_ns = reads[-1][0] if reads else monotonic_ns()
    if reads:
        result.first_byte_ns = reads[0][0]
    if reads or result.error is None:
        # keep what arrived even when the stream broke: its chunks are still facts
        parse_into(result, reads, streamed)
    if result.error is not None:
        result.ok = False
    return result


def build_headers(api_key: str | None) -> dict[str, str]:
    """Request headers; the API key goes only here, never into a log or a record."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


async def get_text(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> str:
    """GET a small text document (e.g. Prometheus ``/metrics``)."""
    try:
        async with session.get(url, headers=headers) as resp:
            if resp.status != 200:
                raise BenchError(f"GET {url} answered HTTP {resp.status}")
            return await resp.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise BenchError(f"GET {url} failed: {type(exc).__name__}: {exc}") from exc


async def post_json(
    session: aiohttp.ClientSession, url: str, payload: Mapping[str, Any], headers: Mapping[str, str]
) -> Any:
    """POST a JSON body and return the decoded JSON answer (e.g. ``/tokenize``)."""
    try:
        async with session.post(url, data=json.dumps(payload), headers=headers) as resp:
            if resp.status != 200:
                raise BenchError(f"POST {url} answered HTTP {resp.status}")
            return json.loads(await resp.read())
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
        raise BenchError(f"POST {url} failed: {type(exc).__name__}: {exc}") from exc
