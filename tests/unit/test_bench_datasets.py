"""Prompt sets, dataset files and request bodies."""

from __future__ import annotations

import asyncio
import json
import pickle
import time
from pathlib import Path

import pytest

from servesweep.bench.datasets import (
    FALLBACK_TOKENS_PER_WORD,
    Prompt,
    build_body,
    load_prompts,
    request_order,
    synthetic_prompts,
)
from servesweep.errors import DatasetError


def test_builtin_sets_ship_with_the_package() -> None:
    chat = load_prompts("builtin:chat")
    coding = load_prompts("builtin:coding")
    assert len(chat) >= 100 and len(coding) >= 40
    lengths = sorted(len((p.text or "").split()) for p in chat)
    assert lengths[0] < 10 and lengths[-1] > 100  # varied lengths
    assert len({p.text for p in chat}) == len(chat)
    math = load_prompts("builtin:math")  # chat, code and math each on their own
    assert len(math) >= 40 and len({p.text for p in math}) == len(math)
    assert not {p.text for p in math} & {p.text for p in chat + coding}
    with pytest.raises(DatasetError, match="builtin sets"):
        load_prompts("builtin:nope")


def test_jsonl_prompts_messages_and_max_tokens(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    lines = [
        {"prompt": "hello"},
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
            ],
            "max_tokens": 7,
        },
    ]
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    prompts = load_prompts(str(f))
    assert prompts[0] == Prompt(text="hello")
    assert prompts[1].max_tokens == 7 and prompts[1].as_messages()[1]["content"] == "hi"
    assert load_prompts("d.jsonl", base_dir=tmp_path) == prompts


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "d.jsonl:2: not valid JSON"),
        ('{"text": "x"}', "d.jsonl:2: expected 'prompt'"),
        ('{"prompt": ""}', "d.jsonl:2: 'prompt' must be a non-empty string"),
        ('{"prompt": "x", "max_tokens": 0}', "d.jsonl:2: 'max_tokens' must be a positive"),
        ('{"messages": [{"content": "x"}]}', r"d.jsonl:2: messages\[0\] needs 'role'"),
        ("[1, 2]", "d.jsonl:2: expected an object"),
    ],
)
def test_bad_jsonl_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(DatasetError, match=message):
        load_prompts(str(f))


def test_sharegpt_first_human_turn(tmp_path: Path) -> None:
    f = tmp_path / "sg.json"
    data = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"}],
        },
        {"id": "b", "conversations": [{"from": "gpt", "value": "only an answer"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "q2"}]},
    ]
    f.write_text(json.dumps(data))
    assert [p.text for p in load_prompts(str(f))] == ["q1", "q2"]
    f.write_text('[{"id": 1}]')
    with pytest.raises(DatasetError, match="entry 0 has no 'conversations'"):
        load_prompts(str(f))
    f.write_text('[\n{"conversations": [\n}')
    with pytest.raises(DatasetError, match=r"sg.json:3: not valid JSON"):
        load_prompts(str(f))


def test_missing_file_is_a_dataset_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="cannot read"):
        load_prompts(str(tmp_path / "absent.jsonl"))


def test_request_order_is_seeded_and_covers_every_prompt() -> None:
    a = request_order(10, 25, seed=3)
    assert a == request_order(10, 25, seed=3)
    assert a != request_order(10, 25, seed=4)
    assert sorted(a[:10]) == list(range(10)) and sorted(a[10:20]) == list(range(10))


def test_synthetic_fallback_and_calibration() -> None:
    prompts, info = asyncio.run(synthetic_prompts(3, 130, seed=1))
    assert info["source"] == "fallback" and info["tokens_per_word"] == FALLBACK_TOKENS_PER_WORD
    assert all(len((p.text or "").split()) == 100 for p in prompts)

    async def two_tokens_per_word(text: str) -> int:
        return 2 * len(text.split())

    prompts, info = asyncio.run(synthetic_prompts(2, 200, seed=1, count_tokens=two_tokens_per_word))
    assert info["source"] == "tokenize" and info["first_prompt_tokens"] == 200
    assert (
        prompts
        == asyncio.run(synthetic_prompts(2, 200, seed=1, count_tokens=two_tokens_per_word))[0]
    )


def test_synthetic_chat_prompts_leave_the_chat_templates_tokens_out() -> None:
    # the server counts a chat prompt inside its template: 31 tokens of system turn and
    # role markers come on top of the text's, and the prompt is that much shorter
    async def two_tokens_per_word(text: str) -> int:
        return 2 * len(text.split())

    async def in_template(text: str) -> int:
        return 31 + 2 * len(text.split())

    prompts, info = asyncio.run(
        synthetic_prompts(
            2, 200, seed=1, count_tokens=two_tokens_per_word, count_prompt=in_template
        )
    )
    assert info["template_tokens"] == 31 and info["words_per_prompt"] == 84
    # what the server will count for the first prompt: within a word of the length asked
    assert abs(info["first_prompt_tokens"] - 200) <= 2, info
    assert all(len((p.text or "").split()) == 84 for p in prompts)


def test_body_defaults_and_extras_merged_last() -> None:
    body = json.loads(
        build_body(
            Prompt(text="hi", max_tokens=9),
            model="m",
            endpoint="chat",
            stream=True,
            max_tokens=100,
            temperature=0.5,
            ignore_eos=True,
            extras=[{"top_k": 1}, {"stream_options": {"include_usage": True}}],
        )
    )
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["max_tokens"] == 9 and body["ignore_eos"] is True and body["top_k"] == 1
    assert body["stream_options"] == {"include_usage": True}
    plain = json.loads(
        build_body(
            Prompt(messages=({"role": "user", "content": "x"},)),
            model="m",
            endpoint="completions",
            stream=False,
            max_tokens=5,
            temperature=0.0,
            ignore_eos=False,
        )
    )
    assert plain["prompt"] == "x" and "stream_options" not in plain and "ignore_eos" not in plain


def test_request_order_is_drawn_as_it_is_read() -> None:
    start = time.process_time()
    order = request_order(1000, 10_000_000_000, seed=7)
    last = order[len(order) - 1]  # the warm-up reads the end: one pass drawn, not all
    assert time.process_time() - start < 0.5
    assert 0 <= last < 1000
    # every pass is a permutation of the prompts, each pass its own shuffle
    passes = [order[k * 1000 : (k + 1) * 1000] for k in (0, 1, 5)]
    assert all(sorted(p) == list(range(1000)) for p in passes)
    assert passes[0] != passes[1] != passes[2]
    # a worker process gets the same order
    assert pickle.loads(pickle.dumps(order))[123_456] == order[123_456]
    assert order[-1] == last
    with pytest.raises(IndexError):
        order[len(order)]
