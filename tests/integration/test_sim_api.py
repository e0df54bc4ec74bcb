"""The simulated engine's OpenAI-compatible API, observed from outside over loopback."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servesweep.sim.testing import SimRun, start_sim
from servesweep.sim.tokenizer import count_tokens


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimRun]:
    work = tmp_path_factory.mktemp("sim-api")
    args = ["--load-time", "0.2", "--ttft-ms", "5", "--step-ms", "2", "--model", "m1"]
    args += ["--budget", "8", "--topk", "2", "--window", "1024", "--seed", "3"]
    run = start_sim(args, work)
    try:
        run.wait_ready()
        yield run
    finally:
        run.close()


def test_models_and_health(sim: SimRun) -> None:
    reply = sim.request("/v1/models")
    assert reply.status == 200
    assert [m["id"] for m in reply.json()["data"]] == ["m1"]
    assert reply.instance.startswith(f"{sim.pid}-")
    assert sim.request("/health").status == 200


def test_completion_usage_matches_tokenizer(sim: SimRun) -> None:
    prompt = "Hello, world! How are you today?"
    reply = sim.request(
        "/v1/completions", {"model": "m1", "prompt": prompt, "max_tokens": 7, "ignore_eos": True}
    )
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["usage"] == {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}
    assert body["choices"][0]["finish_reason"] == "length"
    assert count_tokens(body["choices"][0]["text"]) == 7
    assert body["system_fingerprint"] == reply.instance
    tok = sim.request("/tokenize", {"prompt": prompt}).json()
    assert tok["count"] == 9 and len(tok["tokens"]) == 9


def test_chat_tokenize_counts_messages(sim: SimRun) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    tok = sim.request("/tokenize", {"model": "m1", "messages": messages}).json()
    reply = sim.request("/v1/chat/completions", {"messages": messages, "max_tokens": 3})
    body = reply.json()
    assert body["usage"]["prompt_tokens"] == tok["count"]
    assert body["choices"][0]["message"]["role"] == "assistant"


def test_chat_stream_like_vllm(sim: SimRun) -> None:
    reply = sim.request(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Count to ten."}],
            "max_tokens": 40,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = reply.events()
    assert events[-1] == "[DONE]"
    first, *content, usage_chunk, _ = events
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"]["content"] for c in content)
    assert count_tokens(text) == 40
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
    # Speculative decoding: several tokens per chunk, so fewer chunks than tokens.
    assert len(content) < 40
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 40
    assert all("usage" not in c for c in content)


def test_completion_stream_continuous_usage(sim: SimRun) -> None:
    reply = sim.request(
        "/v1/completions",
        {
            "prompt": "a b c",
            "max_tokens": 12,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    events = reply.events()
    chunks = [e for e in events[:-1] if e["choices"]]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 12
    assert all(c["usage"]["prompt_tokens"] == 3 for c in chunks)
    assert sum(count_tokens(c["choices"][0]["text"]) for c in chunks) == 12


def test_eos_is_deterministic_without_ignore_eos(sim: SimRun) -> None:
    body = {"prompt": "tell me a story", "max_tokens": 4000}
    first = sim.request("/v1/completions", body).json()
    second = sim.request("/v1/completions", body).json()
    n = first["usage"]["completion_tokens"]
    assert 16 <= n <= 256
    assert second["usage"]["completion_tokens"] == n
    assert first["choices"][0]["finish_reason"] == "stop"


def test_metrics_count_spec_decode(sim: SimRun) -> None:
    sim.request("/v1/completions", {"prompt": "x", "max_tokens": 30, "ignore_eos": True})
    text = sim.request("/metrics").body.decode()
    values = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^(vllm:[a-z_]+)\{[^}]*\} ([0-9.]+)$", text, re.M)
    }
    drafts = values["vllm:spec_decode_num_drafts_total"]
    assert drafts > 0
    assert values["vllm:spec_decode_num_draft_tokens_total"] == 8 * drafts
    assert 0 < values["vllm:spec_decode_num_accepted_tokens_total"] <= 8 * drafts
    assert values["vllm:generation_tokens_total"] >= 30
    assert values["vllm:num_requests_running"] == 0


def test_bad_requests(sim: SimRun) -> None:
    assert sim.request("/v1/completions", {"model": "other", "prompt": "x"}).status == 404
    assert sim.request("/v1/chat/completions", {"messages": "nope"}).status == 400
    assert sim.request("/v1/completions", {"prompt": "x", "max_tokens": -1}).status == 400
    assert sim.request("/tokenize", {"nothing": 1}).status == 400


def test_seed_makes_output_deterministic(sim: SimRun, tmp_path: Path) -> None:
    body = {"prompt": "same", "max_tokens": 20, "ignore_eos": True}
    text = sim.request("/v1/completions", body).json()["choices"][0]["text"]
    args = ["--load-time", "0", "--model", "m1", "--seed", "3", "--budget", "8", "--topk", "2"]
    args += ["--ttft-ms", "1", "--step-ms", "1"]
    other = start_sim(args, tmp_path)
    try:
        other.wait_ready()
        # Same seed, same arrival index of the request -> same text.
        for _ in range(sim_requests_before(sim)):
            other.request("/v1/completions", {"prompt": "warm", "max_tokens": 1})
        again = other.request("/v1/completions", body).json()["choices"][0]["text"]
    finally:
        other.close()
    assert again == text


def sim_requests_before(sim: SimRun) -> int:
    """Generation requests the module's sim had served before the last one."""
    text = sim.request("/metrics").body.decode()
    total = sum(
        float(m.group(1))
        for m in re.finditer(r"^vllm:request_success_total\{[^}]*\} ([0-9.]+)$", text, re.M)
    )
    return int(total) - 1


def test_client_disconnect_frees_the_slot(sim: SimRun) -> None:
    body = json.dumps({"prompt": "x", "max_tokens": 500, "ignore_eos": True, "stream": True})
    with socket.create_connection(("127.0.0.1", sim.port), timeout=5) as s:
        s.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        text = sim.request("/metrics").body.decode()
        if re.search(r"^vllm:num_requests_running\{[^}]*\} 0\.0$", text, re.M):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the aborted stream still counts as running")
    assert sim.request("/health").status == 200
