"""The streaming OpenAI-compatible HTTP client of the load generator.

One request is one :func:`send` call. The hot path does the least possible work:
while a response streams, each network read is stored as ``(monotonic_ns, bytes)``;
the SSE events are split and parsed once the stream has ended
(:func:`parse_stream`), so parsing never delays the timestamp of a later chunk.
An event that completes inside a read is stamped with that read's arrival time.

Timestamps come from ``time.monotonic_ns`` (CLOCK_MONOTONIC on Linux, shared by
all processes of the machine, so samples of several worker processes merge).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from time import monotonic_ns
from typing import Any

import aiohttp

from servesweep.errors import BenchError

__all__ = ["RawResult", "make_session", "parse_stream", "send"]

_DONE = b"[DONE]"
_MAX_ERROR_BODY = 2048


@dataclass(slots=True)
class RawResult:
    """One request as received; times are absolute ``monotonic_ns``."""

    index: int
    sent_ns: int
    scheduled_ns: int | None = None
    ok: bool = False
    error: str | None = None
    message: str = ""
    first_byte_ns: int | None = None
    """First bytes of the response body (for chat: usually the role-only chunk)."""
    first_ns: int | None = None
    """First chunk carrying generated tokens (content, reasoning, tool calls)."""
    first_answer_ns: int | None = None
    """First chunk carrying answer content (not reasoning)."""
    end_ns: int | None = None
    chunk_ns: list[int] = field(default_factory=list)
    """Arrival of every token-carrying chunk, first included."""
    chunk_tokens: list[int] | None = None
    """Tokens per chunk from continuous usage stats; None when the server sent none."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None


def make_session(timeout_s: float, connections: int = 0) -> aiohttp.ClientSession:
    """A session tuned for load generation: keep-alive, no connection limit unless
    given, no cookie jar, no decompression, one total timeout per request."""
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0, force_close=False)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
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
) -> RawResult:
    """Send one request and return what arrived. Never raises for a failed request:
    the failure is data (``ok=False``, ``error`` type, short ``message``)."""
    sent = monotonic_ns()
    result = RawResult(index=index, sent_ns=sent, scheduled_ns=scheduled_ns)
    reads: list[tuple[int, bytes]] = []
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                text = await resp.content.read(_MAX_ERROR_BODY)
                result.error = f"http_{resp.status}"
                result.message = _error_message(text)
                result.end_ns = monotonic_ns()
                return result
            content = resp.content
            if stream:
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
        result.message = "no complete response within the request timeout"
    except aiohttp.ClientPayloadError as exc:
        result.error = "incomplete"
        result.message = str(exc)[:300]
    except (aiohttp.ClientConnectionError, OSError) as exc:
        result.error = "connection"
        result.message = f"{type(exc).__name__}: {exc}"[:300]
    except aiohttp.ClientError as exc:
        result.error = "client_error"
        result.message = f"{type(exc).__name__}: {exc}"[:300]
    result.end_ns = reads[-1][0] if reads else monotonic_ns()
    if reads:
        result.first_byte_ns = reads[0][0]
    if result.error is not None:
        if reads:  # keep what arrived: the chunks before a broken stream are still facts
            _parse_into(result, reads, stream)
            result.ok = False
        return result
    _parse_into(result, reads, stream)
    return result


def _error_message(body: bytes) -> str:
    """The ``message`` of an OpenAI-style error body, else the body's start."""
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error")
        msg = err.get("message") if isinstance(err, dict) else obj.get("message", err)
        if isinstance(msg, str) and msg:
            return msg[:300]
    return body.decode("utf-8", "replace").strip()[:300]


def _parse_into(result: RawResult, reads: list[tuple[int, bytes]], stream: bool) -> None:
    try:
        if stream:
            parse_stream(result, reads)
        else:
            _parse_whole(result, reads[-1][1] if reads else b"")
    except (ValueError, TypeError, AttributeError) as exc:
        result.ok = False
        result.error = result.error or "bad_response"
        result.message = result.message or f"unparsable response: {exc}"[:300]


def _events(reads: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """Split the raw reads into SSE ``data:`` payloads, each stamped with the
    arrival time of the read that completed it."""
    out: list[tuple[int, bytes]] = []
    append = out.append
    buf = b""
    for t, data in reads:
        if buf:
            data = buf + data
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        parts = data.split(b"\n\n")
        buf = parts.pop()  # an incomplete event, or b""
        for event in parts:
            if event.startswith(b"data:") and b"\n" not in event:
                append((t, event[5:].strip()))
                continue
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    append((t, line[5:].strip()))
    if buf.strip():  # a last event without its blank line
        for line in buf.split(b"\n"):
            if line.startswith(b"data:"):
                append((reads[-1][0], line[5:].strip()))
    return out


def _decode_all(payloads: list[bytes]) -> list[Any]:
    """All payloads with one ``json.loads`` (per-call overhead dominates small
    chunks); a payload that breaks the batch is found by decoding one by one."""
    try:
        out = json.loads(b"[" + b",".join(payloads) + b"]")
    except ValueError:
        out = None
    if not isinstance(out, list) or len(out) != len(payloads):
        out = [json.loads(p) for p in payloads]  # raises ValueError on the bad one
    return out


def parse_stream(result: RawResult, reads: list[tuple[int, bytes]]) -> None:
    """Fill ``result`` from a streamed response's reads (see module docstring)."""
    chunk_ns = result.chunk_ns
    tokens: list[int] = []
    continuous = False
    last_ct = 0
    usage: Any = None
    events = [(t, p) for t, p in _events(reads) if p and p != _DONE]
    objs = _decode_all([p for _, p in events])
    for (t, _), obj in zip(events, objs, strict=True):
        if not isinstance(obj, dict):
            continue
        choices = obj.get("choices")
        if "error" in obj and not choices:
            err = obj["error"]
            result.error = "stream_error"
            result.message = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
            break
        carries = False
        answer = False
        if choices:
            choice = choices[0]
            delta = choice.get("delta")
            if delta is not None:
                if delta.get("content"):
                    carries = answer = True
                elif (
                    delta.get("reasoning_content")
                    or delta.get("reasoning")
                    or delta.get("tool_calls")
                ):
                    carries = True
            elif choice.get("text"):
                carries = answer = True
        new_tokens = 0
        u = obj.get("usage")
        if u:
            usage = u
            ct = u.get("completion_tokens")
            if choices and ct is not None:
                continuous = True
                new_tokens = ct - last_ct
                last_ct = ct
                if new_tokens > 0:
                    carries = True
        if carries:
            chunk_ns.append(t)
            tokens.append(new_tokens)
            if result.first_ns is None:
                result.first_ns = t
            if answer and result.first_answer_ns is None:
                result.first_answer_ns = t
    if continuous:
        result.chunk_tokens = tokens
    _take_usage(result, usage)
    if result.error is None:
        if not chunk_ns:
            result.error = "empty"
            result.message = "the stream ended without any generated token"
        else:
            result.ok = True


def _parse_whole(result: RawResult, body: bytes) -> None:
    obj = json.loads(body)
    if not isinstance(obj, dict):
        raise ValueError("the response is not a JSON object")
    choices = obj.get("choices") or []
    text = ""
    if choices:
        choice = choices[0]
        msg = choice.get("message")
        if isinstance(msg, dict):
            text = (msg.get("content") or "") + (
                msg.get("reasoning_content") or msg.get("reasoning") or ""
            )
        else:
            text = choice.get("text") or ""
    _take_usage(result, obj.get("usage"))
    if text or (result.completion_tokens or 0) > 0:
        result.ok = True
    else:
        result.error = "empty"
        result.message = "the response carried no generated token"


def _take_usage(result: RawResult, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    pt = usage.get("prompt_tokens")
    ct = usage.get("completion_tokens")
    result.prompt_tokens = int(pt) if isinstance(pt, (int, float)) else None
    result.completion_tokens = int(ct) if isinstance(ct, (int, float)) else None
    details = usage.get("completion_tokens_details")
    if isinstance(details, dict):
        rt = details.get("reasoning_tokens")
        if isinstance(rt, (int, float)):
            result.reasoning_tokens = int(rt)


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
