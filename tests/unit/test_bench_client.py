"""Parsing of streamed responses: which chunk is the first token, tokens per chunk."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servesweep.bench.client import RawResult, build_headers, parse_stream
from servesweep.bench.responses import parse_into


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chat(delta: dict[str, Any], usage: dict[str, int] | None = None) -> bytes:
    obj: dict[str, Any] = {"choices": [{"index": 0, "delta": delta}]}
    if usage is not None:
        obj["usage"] = usage
    return _event(obj)


DONE = b"data: [DONE]\n\n"


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
        (4, _chat({"content": "e f"}, u(6)) + _event({"choices": [], "usage": u(6)}) + DONE),
    ]
    r = _parse(reads)
    assert r.ok and r.first_ns == 2
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
        + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    )
    r = _parse([(5, body)])
    assert r.ok and r.first_ns == 5


def test_reasoning_counts_as_first_token_and_answer_is_tracked() -> None:
    reads = [
        (1, _chat({"role": "assistant", "content": ""})),
        (2, _chat({"reasoning_content": "think"})),
        (3, _chat({"content": "answer"}) + DONE),
    ]
    r = _parse(reads)
    assert r.ok and r.first_ns == 2 and r.first_answer_ns == 3


def test_token_without_text_still_counts_with_continuous_usage() -> None:
    reads = [
        (1, _chat({"content": ""}, {"prompt_tokens": 1, "completion_tokens": 1})),
        (2, _chat({"content": "é"}, {"prompt_tokens": 1, "completion_tokens": 2}) + DONE),
    ]
    r = _parse(reads)
    assert r.ok and r.first_ns == 1 and r.chunk_tokens == [1, 1]


def test_error_event_and_empty_stream_are_failures() -> None:
    r = _parse([(1, _event({"error": {"message": "engine dead", "code": 500}}))])
    assert not r.ok and r.error == "stream_error" and "engine dead" in r.message
    r = _parse([(1, _chat({"role": "assistant", "content": ""}) + b"data: [DONE]\n\n")])
    assert not r.ok and r.error == "empty"


def test_api_key_only_in_the_authorization_header() -> None:
    assert build_headers("sk-secret")["Authorization"] == "Bearer sk-secret"
    assert "Authorization" not in build_headers(None)


def _stream(n: int, usage: dict[str, Any] | None, *, finish: bool = True, done: bool = True) -> Any:
    """A chat stream of ``n`` one-token chunks, then (optionally) a last chunk with
    ``finish_reason``, a usage chunk and ``[DONE]``."""
    reads = [(1, _chat({"role": "assistant", "content": ""}))]
    reads += [(2 + k, _chat({"content": f" w{k}"})) for k in range(n)]
    tail = b""
    if finish:
        tail += _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if usage is not None:
        tail += _event({"choices": [], "usage": usage})
    if done:
        tail += DONE
    if tail:
        reads.append((2 + n, tail))
    return reads


def test_a_stream_without_done_and_finish_reason_was_cut_short() -> None:
    r = _parse(_stream(3, None, finish=False, done=False))
    assert not r.ok and r.error == "incomplete"
    assert "[DONE]" in r.message and "3 token-carrying chunks" in r.message
    assert len(r.chunk_ns) == 3  # what arrived is kept
    # either end marker is enough: some servers send no [DONE]
    assert _parse(_stream(3, None, finish=True, done=False)).ok
    assert _parse(_stream(3, None, finish=False, done=True)).ok


@pytest.mark.parametrize(
    ("usage", "why"),
    [
        ({"prompt_tokens": -7, "completion_tokens": -3}, "prompt_tokens -7 is negative"),
        ({"prompt_tokens": 7, "completion_tokens": 3.5}, "completion_tokens 3.5 is not a whole"),
        ({"prompt_tokens": 7, "completion_tokens": "3"}, "completion_tokens '3' is not a whole"),
        ({"prompt_tokens": 7, "completion_tokens": True}, "completion_tokens True is not a whole"),
        ({"prompt_tokens": 7, "completion_tokens": 2}, "completion_tokens 2 is less than the 3"),
        (
            {
                "prompt_tokens": 7,
                "completion_tokens": 3,
                "completion_tokens_details": {"reasoning_tokens": 9},
            },
            "reasoning_tokens 9 exceed completion_tokens 3",
        ),
        ([7, 3], "is not an object"),
    ],
)
def test_a_usage_that_cannot_be_true_is_not_a_measurement(usage: Any, why: str) -> None:
    r = _parse(_stream(3, usage))
    assert r.ok  # the answer itself is fine
    assert r.usage_problem is not None and why in r.usage_problem
    assert (r.prompt_tokens, r.completion_tokens, r.reasoning_tokens) == (None, None, None)
    assert r.chunk_tokens is None  # the client's own count: one token per chunk


def test_a_running_usage_that_goes_down_is_not_believed() -> None:
    def u(n: int) -> dict[str, int]:
        return {"prompt_tokens": 4, "completion_tokens": n}

    reads = [
        (1, _chat({"content": "a"}, u(1))),
        (2, _chat({"content": "b c"}, u(3))),
        (3, _chat({"content": "d"}, u(2)) + DONE),
    ]
    r = _parse(reads)
    assert r.ok and r.usage_problem == "completion_tokens went down from 3 to 2"
    assert r.chunk_tokens is None and r.completion_tokens is None
    assert r.chunk_ns == [1, 2, 3]


def test_a_believable_usage_is_taken_as_is() -> None:
    r = _parse(_stream(3, {"prompt_tokens": 7, "completion_tokens": 5}))
    assert r.ok and r.usage_problem is None
    assert (r.prompt_tokens, r.completion_tokens) == (7, 5)


def test_a_whole_answer_with_an_impossible_usage() -> None:
    r = RawResult(index=0, sent_ns=0)
    body = {
        "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 0},
    }
    parse_into(r, [(1, json.dumps(body).encode())], stream=False)
    assert r.ok and r.usage_problem == "completion_tokens is 0 but the answer has text"
    assert r.completion_tokens is None and r.prompt_tokens is None


def test_the_finish_reason_is_kept_streamed_and_whole() -> None:
    # the model ended its turn: vLLM's last content chunk says "stop", a usage follows
    reads = [
        (1, _chat({"content": "a"})),
        (
            2,
            _event({"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}]})
            + _event({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}})
            + DONE,
        ),
    ]
    assert _parse(reads).finish_reason == "stop"
    assert _parse(_stream(3, None, finish=True, done=False)).finish_reason == "stop"
    assert _parse([(1, _chat({"content": "a"}) + DONE)]).finish_reason is None
    r = RawResult(index=0, sent_ns=0)
    body = {
        "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1},
    }
    parse_into(r, [(1, json.dumps(body).encode())], stream=False)
    assert r.ok and r.finish_reason == "length"


def test_an_answer_of_only_the_end_of_turn_token_is_an_answer() -> None:
    # a real model (SmolLM2 on vLLM, a raw completion prompt) may end its turn at once:
    # one token without text, counted by the closing chunk's usage
    def u(n: int) -> dict[str, int]:
        return {"prompt_tokens": 22, "completion_tokens": n, "total_tokens": 22 + n}

    closing = {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}], "usage": u(1)}
    reads = [
        (1, _event({"choices": [{"index": 0, "text": ""}], "usage": u(0)})),
        (2, _event(closing) + _event({"choices": [], "usage": u(1)}) + DONE),
    ]
    r = _parse(reads)
    assert r.ok and r.error is None, r.message
    assert (r.completion_tokens, r.finish_reason, r.chunk_ns, r.first_ns) == (1, "stop", [2], 2)
    # the same without continuous usage (the usage only on the closing chunk)
    r = _parse([(1, _event(closing) + DONE)])
    assert r.ok and r.completion_tokens == 1 and r.chunk_ns == [1]
    # a stream that ends with no token at all is still empty
    none = {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}], "usage": u(0)}
    r = _parse([(1, _event(none) + DONE)])
    assert not r.ok and r.error == "empty"
