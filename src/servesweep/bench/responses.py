"""What one request received, and how an OpenAI-compatible answer is read.

While a response streams, the client only stores each network read as
``(monotonic_ns, bytes)``; the SSE events are split and parsed here once the
stream has ended (:func:`parse_stream`), so parsing never delays the timestamp of
a later chunk. An event that completes inside a read is stamped with that read's
arrival time.

An answer is believed only as far as it can be true: a stream that ends with
neither ``data: [DONE]`` nor a ``finish_reason`` was cut short (``incomplete``);
a ``usage`` whose token counts cannot be right (not whole numbers, negative, a
running count that goes down, fewer completion tokens than token-carrying chunks
were streamed) is not used: the token counts are then the client's own
(``usage_problem`` says why).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RawResult", "error_message", "parse_into", "parse_stream"]

_DONE = b"[DONE]"


@dataclass(slots=True)
class RawResult:
    """One request as received; times are absolute ``monotonic_ns``."""

    index: int
    sent_ns: int
    scheduled_ns: int | None = None
    ok: bool = False
    error: str | None = None
    """The failure's type (``timeout``, ``connection``, ``http_500``...)."""
    message: str = ""
    """The failure's text (the exception's, the server's error message...)."""
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
    resent: str | None = None
    """The first attempt's error when the request was sent a second time (it failed on
    a reused connection the server had closed, before any byte of its response)."""
    usage_problem: str | None = None
    """Why the server's usage was not believed (the token counts are then the client's)."""
    finish_reason: str | None = None
    """The answer's ``finish_reason`` (``length``: it reached ``max_tokens``; ``stop``:
    the model ended its turn, or a stop string); None when the server sent none."""


def error_message(body: bytes) -> str:
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


def parse_into(result: RawResult, reads: list[tuple[int, bytes]], stream: bool) -> None:
    """Fill ``result`` from the reads of a streamed or a whole answer."""
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


class _Unbelievable(ValueError):
    """A usage whose token counts cannot be true."""


def _count(usage: dict[str, Any], key: str) -> int | None:
    """A token count of ``usage``: a whole non-negative number, or absent."""
    value = usage.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Unbelievable(f"{key} {value!r} is not a whole number")
    if value < 0:
        raise _Unbelievable(f"{key} {value} is negative")
    return value


_NO_OBJECT = object()


def _running_problem(usage: Any, last_ct: int) -> str:
    """Why a running usage cannot be true (it failed the inline check)."""
    try:
        if not isinstance(usage, dict):
            raise _Unbelievable(f"usage {usage!r} is not an object")
        _count(usage, "prompt_tokens")
        ct = _count(usage, "completion_tokens")
    except _Unbelievable as exc:
        return str(exc)
    return f"completion_tokens went down from {last_ct} to {ct}"


def _finish_reason(objs: list[Any]) -> str | None:
    """The last ``finish_reason`` the chunks carry (read once the stream has ended)."""
    for obj in reversed(objs):
        choices = obj.get("choices") if isinstance(obj, dict) else None
        if choices and isinstance(choices[0], dict):
            reason = choices[0].get("finish_reason")
            if reason:
                return str(reason)[:40]
    return None


def parse_stream(result: RawResult, reads: list[tuple[int, bytes]]) -> None:
    """Fill ``result`` from a streamed response's reads (see module docstring)."""
    chunk_ns = result.chunk_ns
    tokens: list[int] = []
    continuous = False
    last_ct = 0
    usage: Any = None
    problem: str | None = None
    events = _events(reads)
    # [DONE] is the last event of a whole stream: look there first
    done = (bool(events) and events[-1][1] == _DONE) or any(p == _DONE for _, p in events)
    events = [(t, p) for t, p in events if p and p != _DONE]
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
        if u and problem is None:
            # the common case checked inline (this runs for every chunk); the final
            # usage is checked in full by _take_usage
            ct = u.get("completion_tokens") if u.__class__ is dict else _NO_OBJECT
            if ct is None:
                usage = u
            elif ct.__class__ is int and ct >= last_ct:
                usage = u
                # usage on the closing chunk only (llama-server) is the answer's
                # usage, not continuous stats: that chunk carries no token itself,
                # unless no chunk before it did: an answer of only the model's end of
                # turn (a token without text) ends in the chunk that counts it
                if choices and (
                    continuous or answer or not choice.get("finish_reason") or not chunk_ns
                ):
                    continuous = True
                    new_tokens = ct - last_ct
                    last_ct = ct
                    if new_tokens > 0:
                        carries = True
            else:
                problem = _running_problem(u, last_ct)
        if carries:
            chunk_ns.append(t)
            tokens.append(new_tokens)
            if result.first_ns is None:
                result.first_ns = t
            if answer and result.first_answer_ns is None:
                result.first_answer_ns = t
    if problem is None:
        if continuous:
            result.chunk_tokens = tokens
        problem = _take_usage(result, usage, streamed_chunks=len(chunk_ns))
    if problem is not None:
        _distrust_usage(result, problem)
    result.finish_reason = _finish_reason(objs)
    if result.error is not None:
        return
    if not done and result.finish_reason is None:
        result.error = "incomplete"
        result.message = (
            f"the stream ended without data: [DONE] and without a finish_reason, after "
            f"{len(chunk_ns)} token-carrying chunks: the answer was cut short"
        )
    elif not chunk_ns:
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
        reason = choice.get("finish_reason")
        result.finish_reason = str(reason)[:40] if reason else None
    problem = _take_usage(result, obj.get("usage"), streamed_chunks=0)
    if problem is None and text and result.completion_tokens == 0:
        problem = "completion_tokens is 0 but the answer has text"
    if problem is not None:
        _distrust_usage(result, problem)
    if text or (result.completion_tokens or 0) > 0:
        result.ok = True
    else:
        result.error = "empty"
        result.message = "the response carried no generated token"


def _take_usage(result: RawResult, usage: Any, *, streamed_chunks: int) -> str | None:
    """Take the token counts of the final ``usage``; why not, when they cannot be true."""
    if usage is None:
        return None
    try:
        if not isinstance(usage, dict):
            raise _Unbelievable(f"usage {usage!r} is not an object")
        pt = _count(usage, "prompt_tokens")
        ct = _count(usage, "completion_tokens")
        if ct is not None and ct < streamed_chunks:
            raise _Unbelievable(
                f"completion_tokens {ct} is less than the {streamed_chunks} token-carrying "
                "chunks streamed"
            )
        rt = None
        details = usage.get("completion_tokens_details")
        if isinstance(details, dict):
            rt = _count(details, "reasoning_tokens")
            if rt is not None and ct is not None and rt > ct:
                raise _Unbelievable(f"reasoning_tokens {rt} exceed completion_tokens {ct}")
    except _Unbelievable as exc:
        return str(exc)
    result.prompt_tokens = pt
    result.completion_tokens = ct
    result.reasoning_tokens = rt
    return None


def _distrust_usage(result: RawResult, problem: str) -> None:
    """Forget the server's counts: the metrics then count the streamed chunks."""
    result.usage_problem = problem[:300]
    result.prompt_tokens = result.completion_tokens = result.reasoning_tokens = None
    result.chunk_tokens = None
