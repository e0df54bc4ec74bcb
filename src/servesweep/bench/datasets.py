"""Prompt sets of the load generator and the request bodies made from them.

Sources (``WorkloadSpec.dataset``):

- ``builtin:chat`` (101 prompts), ``builtin:coding`` (40 prompts) and
  ``builtin:math`` (40 prompts): written for servesweep, shipped as
  ``bench/data/*.jsonl``; one category each, so speculative decoding's acceptance
  can be compared per category.
- ``synthetic``: prompts of ``input_tokens`` tokens as the server counts them (its
  ``usage.prompt_tokens``: for chat, the model's chat template included), built from a
  fixed word list. The length is calibrated through the server's tokenizer
  (``Target.tokenize_path``) when it has one; otherwise the documented fallback is 1.3
  tokens per word (and the chat template's tokens come on top).
- a JSONL file: one object a line with ``prompt`` (text) or ``messages`` (chat
  messages), optional ``max_tokens``.
- a ShareGPT JSON file: a list of ``{"conversations": [{"from": "human", "value": ...}]}``;
  the first human turn is the prompt.

The order of requests is deterministic for a given seed (:func:`request_order`), and
drawn as the requests are sent: a level of ten million requests shuffles only the
prompts it reaches.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, overload

from servesweep.errors import DatasetError

__all__ = [
    "FALLBACK_TOKENS_PER_WORD",
    "Prompt",
    "RequestOrder",
    "build_body",
    "load_prompts",
    "request_order",
    "synthetic_prompts",
]

FALLBACK_TOKENS_PER_WORD = 1.3
"""Tokens per word of English text assumed when the server has no ``/tokenize``."""

_BUILTIN = {
    "builtin:chat": "chat.jsonl",
    "builtin:coding": "coding.jsonl",
    "builtin:math": "math.jsonl",
}
_WORD_TEXT = (
    "river stone window garden morning letter travel market winter signal yellow engine"
    " harbor pocket silver number memory bridge candle forest question table paper orange"
    " valley music planet corner station simple careful quiet bright narrow gentle honest"
    " sudden distant ancient modern useful certain common follow answer gather borrow"
    " measure wonder repair listen arrive remember"
)
_WORDS = tuple(_WORD_TEXT.split(" "))


@dataclass(frozen=True)
class Prompt:
    """One request's input: ``text`` or chat ``messages``; optional ``max_tokens``."""

    text: str | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None
    max_tokens: int | None = None

    def as_messages(self) -> list[dict[str, Any]]:
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.text or ""}]

    def as_text(self) -> str:
        if self.text is not None:
            return self.text
        return "\n".join(str(m.get("content", "")) for m in self.messages or ())


def load_prompts(dataset: str, *, base_dir: str | Path | None = None) -> list[Prompt]:
    """The prompts of a builtin set or a file (``synthetic`` is built by
    :func:`synthetic_prompts`). Raises :class:`DatasetError` naming file and line."""
    if dataset in _BUILTIN:
        text = (
            resources.files("servesweep.bench")
            .joinpath("data")
            .joinpath(_BUILTIN[dataset])
            .read_text()
        )
        return _parse_jsonl(text, dataset)
    if dataset.startswith("builtin:"):
        names = ", ".join([*_BUILTIN, "synthetic"])
        raise DatasetError(f"unknown builtin dataset {dataset!r}; builtin sets: {names}")
    path = Path(dataset)
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read the dataset: {exc}") from exc
    if path.suffix == ".json" or text.lstrip().startswith("["):
        return _parse_sharegpt(text, str(path))
    return _parse_jsonl(text, str(path))


def _parse_jsonl(text: str, name: str) -> list[Prompt]:
    prompts: list[Prompt] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise DatasetError(f"{name}:{lineno}: not valid JSON: {exc}") from exc
        prompts.append(_prompt_of(obj, f"{name}:{lineno}"))
    if not prompts:
        raise DatasetError(f"{name}: the dataset holds no prompt")
    return prompts


def _prompt_of(obj: Any, where: str) -> Prompt:
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: expected an object with 'prompt' or 'messages'")
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise DatasetError(f"{where}: 'max_tokens' must be a positive integer")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise DatasetError(f"{where}: 'prompt' must be a non-empty string")
        return Prompt(text=obj["prompt"], max_tokens=max_tokens)
    messages = obj.get("messages")
    if messages is None:
        raise DatasetError(f"{where}: expected 'prompt' (a string) or 'messages' (a list)")
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: 'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise DatasetError(f"{where}: messages[{i}] needs 'role' and 'content'")
    return Prompt(messages=tuple(messages), max_tokens=max_tokens)


def _parse_sharegpt(text: str, name: str) -> list[Prompt]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        where = f"{name}:{line}" if line else name
        raise DatasetError(f"{where}: not valid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise DatasetError(f"{name}: a ShareGPT file is a JSON list of conversations")
    prompts: list[Prompt] = []
    for i, item in enumerate(data):
        convs = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(convs, list):
            raise DatasetError(f"{name}: entry {i} has no 'conversations' list")
        for turn in convs:
            if (
                isinstance(turn, dict)
                and turn.get("from") in ("human", "user")
                and isinstance(turn.get("value"), str)
                and turn["value"]
            ):
                prompts.append(Prompt(text=turn["value"]))
                break
    if not prompts:
        raise DatasetError(f"{name}: no conversation has a human turn")
    return prompts


class RequestOrder(Sequence[int]):
    """Which prompt each request uses: the prompts in a seeded shuffle, reshuffled
    each pass, drawn lazily. Pass ``b`` is its own seeded shuffle (pass 0 from
    ``seed``, the next ones from ``seed`` and their number), so request ``i`` costs a
    shuffle of the prompts once per pass it reaches, wherever it lies: nothing is drawn
    before the level starts, and a deep index (the warm-up's, at the end of the
    order) costs one pass."""

    def __init__(self, n_prompts: int, n_requests: int, seed: int) -> None:
        if n_prompts < 1 and n_requests > 0:
            raise ValueError("a request order needs at least one prompt")
        self.n_prompts = n_prompts
        self.n_requests = n_requests
        self.seed = seed
        self._pass: tuple[int, list[int]] | None = None

    def _block(self, number: int) -> list[int]:
        if self._pass is not None and self._pass[0] == number:
            return self._pass[1]
        rng = random.Random(self.seed if number == 0 else f"{self.seed}:{number}")
        block = list(range(self.n_prompts))
        rng.shuffle(block)
        self._pass = (number, block)
        return block

    def __len__(self) -> int:
        return self.n_requests

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> list[int]: ...

    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n_requests))]
        if i < 0:
            i += self.n_requests
        if not 0 <= i < self.n_requests:
            raise IndexError("request index out of range")
        number, pos = divmod(i, self.n_prompts)
        return self._block(number)[pos]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RequestOrder):
            return (self.n_prompts, self.n_requests, self.seed) == (
                other.n_prompts,
                other.n_requests,
                other.seed,
            )
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pass": None}  # a worker process draws its own


def request_order(n_prompts: int, n_requests: int, seed: int) -> RequestOrder:
    """Which prompt each request uses: a seeded shuffle, reshuffled each pass, drawn
    as the requests are sent (:class:`RequestOrder`)."""
    return RequestOrder(n_prompts, n_requests, seed)


def _words(n: int, rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, n)))


async def synthetic_prompts(
    count: int,
    input_tokens: int,
    *,
    seed: int = 0,
    count_tokens: Callable[[str], Awaitable[int]] | None = None,
    count_prompt: Callable[[str], Awaitable[int]] | None = None,
) -> tuple[list[Prompt], dict[str, Any]]:
    """``count`` prompts of about ``input_tokens`` tokens each, as the server counts a
    request's prompt, and how the length was calibrated.

    With ``count_tokens`` (the server's tokenizer on plain text) the words-per-token
    ratio is measured; with ``count_prompt`` too (the server's count of a request's
    whole prompt: for chat, the user message inside the model's chat template, whose
    system turn and role markers are tokens as well) the template's tokens are measured
    and left out of the words, and the first prompt is checked with it. Without a
    tokenizer: 1.3 tokens per word, the template unknown."""
    rng = random.Random(seed)
    ratio = FALLBACK_TOKENS_PER_WORD
    info: dict[str, Any] = {"source": "fallback", "tokens_per_word": ratio}
    overhead = 0
    count_first = count_prompt or count_tokens
    if count_tokens is not None:
        probe_words = max(32, int(input_tokens / ratio))
        probe = _words(probe_words, random.Random(seed + 1))
        measured = await count_tokens(probe)
        if measured > 0:
            ratio = measured / probe_words
            info = {"source": "tokenize", "tokens_per_word": round(ratio, 4)}
            if count_prompt is not None:
                overhead = max(0, await count_prompt(probe) - measured)
                info["template_tokens"] = overhead
    n_words = max(1, round(max(1, input_tokens - overhead) / ratio))
    prompts = [Prompt(text=_words(n_words, rng)) for _ in range(count)]
    if count_first is not None and prompts:
        info["first_prompt_tokens"] = await count_first(prompts[0].as_text())
    info["words_per_prompt"] = n_words
    return prompts, info


def build_body(
    prompt: Prompt,
    *,
    model: str,
    endpoint: str,
    stream: bool,
    max_tokens: int,
    temperature: float,
    ignore_eos: bool,
    extras: Sequence[Mapping[str, Any]] = (),
) -> bytes:
    """The JSON body of one request. ``extras`` (the engine preset's fields, then
    the workload's ``extra_body``) are merged last, so they can replace a default
    such as ``stream_options``."""
    body: dict[str, Any] = {"model": model}
    if endpoint == "chat":
        body["messages"] = prompt.as_messages()
    else:
        body["prompt"] = prompt.as_text()
    body["max_tokens"] = prompt.max_tokens or max_tokens
    body["temperature"] = temperature
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if ignore_eos:
        body["ignore_eos"] = True
    for extra in extras:
        body.update(extra)
    return json.dumps(body, separators=(",", ":")).encode()
