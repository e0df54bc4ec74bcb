"""Parsing of streamed responses: which chunk is the first token, tokens per chunk."""

from __future__ import annotations

import json
from typing import Any

from servesweep.bench.client import RawResult, build_headers, parse_stream


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chat(delta: dict[str, Any], usage: dict[str, int] | None = None) -> bytes:
    obj: dict[str, Any] = {"choices": [{"index": 0, "delta": delta}]}
    if usage is not None:
        obj["usage"] = usage
    return _event(obj)


def _parse(reads: list[tuple[int, bytes]]) -> RawResult:
    r = RawResult(index=0, sent_ns=0)
    parse_stream(r, reads)
    return r


def test_role_only_first_chunk_is_not_the_first_token() -> None:
    reads = [
        (100, _chat({"role": "assistant", "content": ""})),
        (200, _chat({"content": "Hi"})),
        (
            300,
            _chat({"content": " there"})
            + _event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
            + b"data: [DONE]\n\n",
        ),
    ]
    r = _parse(reads)
    assert r.ok and r.first_ns == 200
    assert r.chunk_ns == [200, 300]
    assert r.chunk_tokens is None  # no continuous usage: spread later
    assert (r.prompt_tokens, r.completion_tokens) == (5, 2)


def test_continuous_usage_gives_tokens_per_chunk() -> None:
    def u(n: int) -> dict[str, int]:
        return {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}

    reads = [
        (1, _chat({"role": "assistant", "content": ""}, u(0))),
        (2, _chat({"content": "a"}, u(1))),
        (3, _chat({"content": "b c d"}, u(4))),
        (4, _chat({"content": "e f"}, u(6)) + _event({"choices": [], "usage": u(6)})),
    ]
    r = _parse(reads)
    assert r.first_ns == 2
    assert r.chunk_tokens == [1, 3, 2]
    assert r.completion_tokens == 6


def test_events_split_across_reads_get_the_completing_read_time() -> None:
    whole = _chat({"content": "abc"})
    reads = [
        (10, whole[:7]),
        (20, whole[7:] + _chat({"content": "d"})[:5]),
        (30, _chat({"content": "d"})[5:]),
    ]
    r = _parse(reads)
    assert r.chunk_ns == [20, 30]


def test_crlf_separators_and_comments() -> None:
    body = (
        b": keep-alive\r\n\r\ndata: "
        + json.dumps({"choices": [{"text": "x"}]}).encode()
        + b"\r\n\r\n"
    )
    r = _parse([(5, body)])
    assert r.ok and r.first_ns == 5


def test_reasoning_counts_as_first_token_and_answer_is_tracked() -> None:
    reads = [
        (1, _chat({"role": "assistant", "content": ""})),
        (2, _chat({"reasoning_content": "think"})),
        (3, _chat({"content": "answer"})),
    ]
    r = _parse(reads)
    assert r.first_ns == 2 and r.first_answer_ns == 3


def test_token_without_text_still_counts_with_continuous_usage() -> None:
    reads = [
        (1, _chat({"content": ""}, {"prompt_tokens": 1, "completion_tokens": 1})),
        (2, _chat({"content": "é"}, {"prompt_tokens": 1, "completion_tokens": 2})),
    ]
    r = _parse(reads)
    assert r.first_ns == 1 and r.chunk_tokens == [1, 1]


def test_error_event_and_empty_stream_are_failures() -> None:
    r = _parse([(1, _event({"error": {"message": "engine dead", "code": 500}}))])
    assert not r.ok and r.error == "stream_error" and "engine dead" in r.message
    r = _parse([(1, _chat({"role": "assistant", "content": ""}) + b"data: [DONE]\n\n")])
    assert not r.ok and r.error == "empty"


def test_api_key_only_in_the_authorization_header() -> None:
    assert build_headers("sk-secret")["Authorization"] == "Bearer sk-secret"
    assert "Authorization" not in build_headers(None)
