"""A level's requests gathered into columns as they complete: :class:`RawColumns`.

The load generator appends each finished request (:meth:`RawColumns.append`, a few
array appends while the level runs) instead of keeping its
:class:`~servesweep.bench.responses.RawResult`; after the level the statistics read
the columns as numpy arrays without a pass over the requests
(:func:`servesweep.bench.metrics.compute_columns`). The gaps between a request's
chunks and its chunks' token counts join two level-wide arrays; what only some
requests have (an error, a resend, a usage not believed) is kept by row. The columns
of several worker processes are joined in order (:func:`joined`): the same rows as
the requests of every process one after the other.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import sub

import numpy as np
import numpy.typing as npt

from servesweep.bench.responses import RawResult

__all__ = ["RawArrays", "RawColumns", "joined"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

_NS = 1e-9
_NONE = -1
"""A missing time or count in an integer column (times are monotonic ns, > 0)."""


def _spread(total: int, n: int) -> list[int]:
    base, rem = divmod(total, n)
    return [base + (1 if i < rem else 0) for i in range(n)]


@dataclass
class RawColumns:
    """The requests of a level (or of one worker process's part of it), one column
    per field, in the order they completed."""

    index: array[int] = field(default_factory=lambda: array("q"))
    sent: array[int] = field(default_factory=lambda: array("q"))
    scheduled: array[int] = field(default_factory=lambda: array("q"))
    ok: array[int] = field(default_factory=lambda: array("b"))
    first_byte: array[int] = field(default_factory=lambda: array("q"))
    first: array[int] = field(default_factory=lambda: array("q"))
    first_answer: array[int] = field(default_factory=lambda: array("q"))
    end: array[int] = field(default_factory=lambda: array("q"))
    prompt_tokens: array[int] = field(default_factory=lambda: array("q"))
    completion_tokens: array[int] = field(default_factory=lambda: array("q"))
    reasoning_tokens: array[int] = field(default_factory=lambda: array("q"))
    chunk_count: array[int] = field(default_factory=lambda: array("q"))
    gap_ns: array[int] = field(default_factory=lambda: array("q"))
    """The gaps between each request's chunks, after its first (ns)."""
    gap_s: array[float] = field(default_factory=lambda: array("d"))
    """The same gaps in seconds, as the samples keep them."""
    chunk_tokens: array[int] = field(default_factory=lambda: array("q"))
    """Tokens of each chunk: the server's continuous usage, else its total usage
    spread over the chunks, else one a chunk (:attr:`token_source` counts which)."""
    token_sum: array[int] = field(default_factory=lambda: array("q"))
    """Each request's tokens over its chunks (its ``chunk_tokens`` summed)."""
    edge_tokens: array[int] = field(default_factory=lambda: array("q"))
    """Each request's tokens in its first and its last chunk (one chunk: its tokens)."""
    other_chunks: int = 0
    """Chunks that do not carry exactly one token."""
    token_source: Counter[str] = field(default_factory=Counter)
    errors: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Row -> (error type, message) of each request that has an error type."""
    resent: dict[int, str] = field(default_factory=dict)
    usage_problem: dict[int, str] = field(default_factory=dict)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    """Of the requests that succeeded (``none``: the server sent none)."""
    slowest_ok_ns: int = 0
    """The longest time a successful request took."""

    def __len__(self) -> int:
        return len(self.index)

    def append(self, r: RawResult) -> None:
        """Add one finished request."""
        row = len(self.index)
        self.index.append(r.index)
        self.sent.append(r.sent_ns)
        self.scheduled.append(_NONE if r.scheduled_ns is None else r.scheduled_ns)
        self.ok.append(1 if r.ok else 0)
        self.first_byte.append(_NONE if r.first_byte_ns is None else r.first_byte_ns)
        self.first.append(_NONE if r.first_ns is None else r.first_ns)
        self.first_answer.append(_NONE if r.first_answer_ns is None else r.first_answer_ns)
        self.end.append(_NONE if r.end_ns is None else r.end_ns)
        self.prompt_tokens.append(_NONE if r.prompt_tokens is None else r.prompt_tokens)
        self.completion_tokens.append(_NONE if r.completion_tokens is None else r.completion_tokens)
        self.reasoning_tokens.append(_NONE if r.reasoning_tokens is None else r.reasoning_tokens)
        chunks = r.chunk_ns
        n = len(chunks)
        self.chunk_count.append(n)
        if n > 1:
            gaps = list(map(sub, chunks[1:], chunks[:-1]))
            self.gap_ns.extend(gaps)
            self.gap_s.extend([gap * _NS for gap in gaps])
        if r.chunk_tokens is not None and len(r.chunk_tokens) == n:
            self.token_source["continuous_usage"] += 1
            self._tokens(r.chunk_tokens)
        elif r.completion_tokens is not None and n:
            self.token_source["usage_spread"] += 1
            self._tokens(_spread(r.completion_tokens, n))
        else:
            if n:
                self.token_source["chunk_count"] += 1
            self.chunk_tokens.extend([1] * n)
            self.token_sum.append(n)
            self.edge_tokens.append(min(n, 2))
        if r.ok:
            self.finish_reasons[r.finish_reason or "none"] += 1
            if r.end_ns is not None:
                self.slowest_ok_ns = max(self.slowest_ok_ns, r.end_ns - r.sent_ns)
        if r.error:
            self.errors[row] = (r.error, r.message)
        if r.resent:
            self.resent[row] = r.resent
        if r.usage_problem:
            self.usage_problem[row] = r.usage_problem

    def _tokens(self, tokens: list[int]) -> None:
        """One request's chunks' tokens."""
        self.chunk_tokens.extend(tokens)
        self.token_sum.append(sum(tokens))
        n = len(tokens)
        self.edge_tokens.append(tokens[0] + tokens[-1] if n > 1 else tokens[0] if n else 0)
        self.other_chunks += len(tokens) - tokens.count(1)

    def extend(self, raws: Iterable[RawResult]) -> None:
        for r in raws:
            self.append(r)

    def tokens_per_s(self) -> list[float]:
        """Each successful request's tokens (the server's count, else its chunks) over
        its time, in the order they completed."""
        return [
            (tokens if tokens > 0 else n) / ((end - sent) * 1e-9)
            for ok, sent, end, tokens, n in zip(
                self.ok, self.sent, self.end, self.completion_tokens, self.chunk_count, strict=True
            )
            if ok and end != _NONE and end > sent and n
        ]

    def arrays(self) -> RawArrays:
        """The columns as numpy arrays (no copy of the data)."""

        def ints(a: array[int]) -> IntArray:
            return np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0, np.int64)

        return RawArrays(
            index=ints(self.index),
            sent=ints(self.sent),
            scheduled=ints(self.scheduled),
            ok=np.frombuffer(self.ok, dtype=np.int8).astype(np.bool_),
            first_byte=ints(self.first_byte),
            first=ints(self.first),
            first_answer=ints(self.first_answer),
            end=ints(self.end),
            prompt_tokens=ints(self.prompt_tokens),
            completion_tokens=ints(self.completion_tokens),
            reasoning_tokens=ints(self.reasoning_tokens),
            chunk_count=ints(self.chunk_count),
            gap_ns=ints(self.gap_ns),
            gap_s=np.frombuffer(self.gap_s, dtype=np.float64)
            if len(self.gap_s)
            else np.zeros(0, np.float64),
            chunk_tokens=ints(self.chunk_tokens),
            token_sum=ints(self.token_sum),
            edge_tokens=ints(self.edge_tokens),
        )


@dataclass(frozen=True)
class RawArrays:
    """:class:`RawColumns` as numpy arrays (``-1``: missing)."""

    index: IntArray
    sent: IntArray
    scheduled: IntArray
    ok: BoolArray
    first_byte: IntArray
    first: IntArray
    first_answer: IntArray
    end: IntArray
    prompt_tokens: IntArray
    completion_tokens: IntArray
    reasoning_tokens: IntArray
    chunk_count: IntArray
    gap_ns: IntArray
    gap_s: FloatArray
    chunk_tokens: IntArray
    token_sum: IntArray
    edge_tokens: IntArray


def joined(parts: Sequence[RawColumns]) -> RawColumns:
    """The columns of ``parts`` one after the other (rows renumbered)."""
    if len(parts) == 1:
        return parts[0]
    out = RawColumns()
    for part in parts:
        offset = len(out)
        for name in (
            "index",
            "sent",
            "scheduled",
            "ok",
            "first_byte",
            "first",
            "first_answer",
            "end",
            "prompt_tokens",
            "completion_tokens",
            "reasoning_tokens",
            "chunk_count",
            "gap_ns",
            "gap_s",
            "chunk_tokens",
            "token_sum",
            "edge_tokens",
        ):
            getattr(out, name).extend(getattr(part, name))
        out.other_chunks += part.other_chunks
        out.token_source.update(part.token_source)
        out.finish_reasons.update(part.finish_reasons)
        out.errors.update({offset + k: v for k, v in part.errors.items()})
        out.resent.update({offset + k: v for k, v in part.resent.items()})
        out.usage_problem.update({offset + k: v for k, v in part.usage_problem.items()})
        out.slowest_ok_ns = max(out.slowest_ok_ns, part.slowest_ok_ns)
    return out
