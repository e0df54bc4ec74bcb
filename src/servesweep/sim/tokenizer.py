"""The simulated engine's tokenizer: deterministic, simple, documented.

A token is a run of word characters (``\\w+``) or one other non-space character;
whitespace belongs to the token it precedes when text is split into pieces for
streaming. Token ids are CRC-32 of the token text modulo the vocabulary size.
The same count is used by ``/tokenize`` and ``usage.prompt_tokens``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["VOCAB_SIZE", "chat_prompt_text", "count_tokens", "split_pieces", "token_ids", "tokens"]

VOCAB_SIZE = 50_000
_TOKEN = re.compile(r"\w+|[^\w\s]")
_PIECE = re.compile(r"\s*(?:\w+|[^\w\s])")


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def token_ids(text: str) -> list[int]:
    return [zlib.crc32(t.encode()) % VOCAB_SIZE for t in _TOKEN.findall(text)]


def split_pieces(text: str) -> list[str]:
    """``text`` cut into one piece per token; ``"".join(pieces) == text``.

    Leading whitespace goes with the following token, trailing whitespace with the
    last piece.
    """
    pieces = _PIECE.findall(text)
    consumed = sum(len(p) for p in pieces)
    if consumed < len(text):
        tail = text[consumed:]
        if pieces:
            pieces[-1] += tail
        else:
            pieces = [tail]
    return pieces


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Iterable):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return ""


def chat_prompt_text(messages: Any) -> str:
    """The text the sim "sees" for chat messages: ``role: content`` per line."""
    if not isinstance(messages, list):
        return ""
    lines = []
    for m in messages:
        if isinstance(m, Mapping):
            lines.append(f"{m.get('role', 'user')}: {_content_text(m.get('content'))}")
    return "\n".join(lines)
