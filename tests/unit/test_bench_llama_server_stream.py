"""A streamed completion as llama-server (llama.cpp build 164) sends it: one chunk per
token without usage, then a final chunk with empty text, finish_reason and the usage
of the whole answer. That last chunk carries no token: the answer is 16 tokens, as
the usage says, not 17 chunks (the final usage is not continuous usage stats)."""

from __future__ import annotations

import json

from servesweep.bench.client import RawResult, parse_stream

_BASE = {"created": 1796142497, "model": "m.gguf", "object": "text_completion", "id": "c1"}


def _event(choice: dict[str, object], **extra: object) -> bytes:
    obj = {"choices": [{"index": 0, "logprobs": None, **choice}], **_BASE, **extra}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_llama_server_final_usage_chunk_is_not_a_token() -> None:
    words = ["self", "Ti", "who", " peo", " Their", " When", " His", " max"]
    words += [" sug", " Id", " wou", " long", "if", "should", " fro", "when"]
    reads = [(i + 1, _event({"text": w, "finish_reason": None})) for i, w in enumerate(words)]
    usage = {"completion_tokens": 16, "prompt_tokens": 4, "total_tokens": 20}
    reads.append((17, _event({"text": "", "finish_reason": "length"}, usage=usage)))
    reads.append((18, b"data: [DONE]\n\n"))
    r = RawResult(index=0, sent_ns=0)
    parse_stream(r, reads)
    assert r.ok, r.message
    assert r.completion_tokens == 16
    assert len(r.chunk_ns) == 16 and r.chunk_ns[-1] == 16
