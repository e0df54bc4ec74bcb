"""A level's requests as columns: :class:`SampleColumns`.

The load generator measures a level of many requests (hundreds of thousands at a
high rate); one :class:`~servesweep.models.RequestSample` and one float object per
token each would cost more to build, store and read back than every statistic of
the level (docs/benchmarks.md, "Between levels"). :class:`SampleColumns` keeps the
same facts in numpy arrays, one per field, the chunks of every request in two flat
arrays, and is still a sequence of :class:`~servesweep.models.RequestSample`: a
record is made when one is asked for, equal to the one that was measured, so a
reader that iterates the samples reads what it always read. Statistics read the
columns (:mod:`servesweep.decide.level_intervals`), the store writes them as one
blob per level (:meth:`SampleColumns.to_bytes`).

A missing value (a request with no first token, a server that sent no usage) is
NaN in a float column and -1 in an integer one; an error's text is kept by row.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from servesweep.models import RequestSample

__all__ = ["SampleColumns", "columns_of"]

FloatArray = npt.NDArray[np.floating[Any]]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_FORMAT = 1
"""The layout of :meth:`SampleColumns.to_bytes` (the store keeps it beside the blob)."""


@dataclass(frozen=True, eq=False)
class SampleColumns(Sequence[RequestSample]):
    """The requests of one level, one array per field (row ``i`` is request ``i`` in
    the order the level sent them). Request ``i``'s chunks are
    ``chunk_start[i] : chunk_start[i] + chunk_count[i]`` of ``chunk_tokens`` (tokens
    in each chunk), its gaps between chunks after the first (seconds)
    ``gap_start[i] : gap_start[i] + gap_count[i]`` of ``chunk_gaps``."""

    indices: IntArray
    """Each request's ``index``."""
    ok: BoolArray
    sent_at: FloatArray
    scheduled_at: FloatArray
    first_token_at: FloatArray
    finished_at: FloatArray
    prompt_tokens: IntArray
    completion_tokens: IntArray
    reasoning_tokens: IntArray
    chunk_count: IntArray
    chunk_tokens: IntArray
    gap_count: IntArray
    chunk_gaps: FloatArray
    errors: Mapping[int, str] = field(default_factory=dict)
    """The error of each request that has one, by row."""
    chunk_start: IntArray | None = None
    """Where each request's chunks start (None: one request's after another's, in
    the rows' order)."""
    gap_start: IntArray | None = None
    """Where each request's gaps start (None: one request's after another's)."""

    def __post_init__(self) -> None:
        if self.chunk_start is None:
            object.__setattr__(self, "chunk_start", _starts(self.chunk_count))
        if self.gap_start is None:
            object.__setattr__(self, "gap_start", _starts(self.gap_count))

    @property
    def starts(self) -> IntArray:
        """Where each request's chunks start in ``chunk_tokens``."""
        assert self.chunk_start is not None
        return self.chunk_start

    @property
    def gap_starts(self) -> IntArray:
        """Where each request's gaps start in ``chunk_gaps``."""
        assert self.gap_start is not None
        return self.gap_start

    # -- a sequence of records ----------------------------------------------------

    def __len__(self) -> int:
        return len(self.indices)

    @overload
    def __getitem__(self, i: int) -> RequestSample: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[RequestSample, ...]: ...

    def __getitem__(self, i: int | slice) -> RequestSample | tuple[RequestSample, ...]:
        if isinstance(i, slice):
            return tuple(self.record(j) for j in range(*i.indices(len(self))))
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} of {n}")
        return self.record(i % n if n else i)

    def __iter__(self) -> Iterator[RequestSample]:
        return (self.record(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SampleColumns({len(self)} requests, {len(self.chunk_tokens)} chunks)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_state, (self._state(),))

    def record(self, i: int) -> RequestSample:
        """Request ``i`` as a record."""
        start, count = int(self.starts[i]), int(self.chunk_count[i])
        gap, gaps = int(self.gap_starts[i]), int(self.gap_count[i])
        return RequestSample(
            index=int(self.indices[i]),
            ok=bool(self.ok[i]),
            error=self.errors.get(i),
            scheduled_at=_float(self.scheduled_at[i]),
            sent_at=float(self.sent_at[i]),
            first_token_at=_float(self.first_token_at[i]),
            finished_at=_float(self.finished_at[i]),
            prompt_tokens=_int(self.prompt_tokens[i]),
            completion_tokens=_int(self.completion_tokens[i]),
            reasoning_tokens=_int(self.reasoning_tokens[i]),
            chunk_gaps=tuple(self.chunk_gaps[gap : gap + gaps].tolist()),
            chunk_tokens=tuple(self.chunk_tokens[start : start + count].tolist()),
        )

    def rows(self, picked: Sequence[int]) -> list[RequestSample]:
        """The records of rows ``picked``."""
        return [self.record(i) for i in picked]

    # -- derived columns -------------------------------------------------------------

    @property
    def ttft(self) -> FloatArray:
        """Seconds from sending to the first token (NaN: none)."""
        return self.first_token_at - self.sent_at

    @property
    def e2e(self) -> FloatArray:
        """Seconds from sending to the last chunk (NaN: not finished)."""
        return self.finished_at - self.sent_at

    @property
    def done(self) -> BoolArray:
        """The requests that completed (ok, with an end)."""
        return self.ok & ~np.isnan(self.finished_at)

    # -- bytes for the store ---------------------------------------------------------

    def to_bytes(self) -> bytes:
        """Every column in one ``.npz`` blob (no pickles), the errors beside them."""
        out = io.BytesIO()
        state = self._state()
        errors = state.pop("errors")
        rows = np.fromiter(errors, dtype=np.int64, count=len(errors))
        texts = np.array([errors[r] for r in rows.tolist()], dtype=np.str_)
        np.savez(out, error_rows=rows, error_texts=texts, **state)
        return out.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, fmt: int = _FORMAT) -> SampleColumns:
        """The columns :meth:`to_bytes` wrote (``ValueError``: not such a blob)."""
        if fmt != _FORMAT:
            raise ValueError(f"unknown layout {fmt} of a level's samples")
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                state: dict[str, Any] = {k: z[k] for k in z.files}
            rows, texts = state.pop("error_rows"), state.pop("error_texts")
            state["errors"] = dict(zip(rows.tolist(), texts.tolist(), strict=True))
            return _from_state(state)
        except (OSError, KeyError, TypeError, zipfile.BadZipFile) as exc:
            raise ValueError(f"not a level's samples: {exc}") from exc

    FORMAT = _FORMAT

    def _state(self) -> dict[str, Any]:
        return {
            "indices": self.indices,
            "ok": self.ok,
            "sent_at": self.sent_at,
            "scheduled_at": self.scheduled_at,
            "first_token_at": self.first_token_at,
            "finished_at": self.finished_at,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "chunk_count": self.chunk_count,
            "chunk_tokens": self.chunk_tokens,
            "gap_count": self.gap_count,
            "chunk_gaps": self.chunk_gaps,
            "chunk_start": self.starts,
            "gap_start": self.gap_starts,
            "errors": dict(self.errors),
        } | {k: _narrow(v) for k, v in self._ints().items()}

    def _ints(self) -> dict[str, IntArray]:
        return {
            "indices": self.indices,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "chunk_count": self.chunk_count,
            "chunk_tokens": self.chunk_tokens,
            "gap_count": self.gap_count,
            "chunk_start": self.starts,
            "gap_start": self.gap_starts,
        }


def _from_state(state: Mapping[str, Any]) -> SampleColumns:
    return SampleColumns(
        **{
            k: v.astype(np.int64) if k in _INTS and v.dtype != np.int64 else v
            for k, v in state.items()
        }
    )


_INTS = frozenset(
    [
        "indices",
        "prompt_tokens",
        "completion_tokens",
        "reasoning_tokens",
        "chunk_count",
        "chunk_tokens",
        "gap_count",
        "chunk_start",
        "gap_start",
    ]
)
"""The integer columns: kept in the narrowest integer type that holds their values
when the columns are written (a chunk's tokens fit in a byte), int64 when read."""


def _narrow(values: IntArray) -> npt.NDArray[np.signedinteger[Any]]:
    if not len(values):
        return values
    return values.astype(
        np.result_type(
            np.min_scalar_type(int(values.min())), np.int8, np.min_scalar_type(int(values.max()))
        )
    )


def _starts(counts: IntArray) -> IntArray:
    """Where each of runs of ``counts`` starts when they follow one another."""
    start = np.zeros(len(counts), dtype=np.int64)
    if len(start) > 1:
        np.cumsum(counts[:-1], out=start[1:])
    return start


def _float(x: np.float64) -> float | None:
    v = float(x)
    return None if v != v else v


def _int(x: np.int64) -> int | None:
    v = int(x)
    return None if v < 0 else v


def columns_of(samples: Sequence[RequestSample]) -> SampleColumns:
    """``samples`` as columns (themselves when they already are)."""
    if isinstance(samples, SampleColumns):
        return samples
    nan = float("nan")
    return SampleColumns(
        indices=np.array([s.index for s in samples], dtype=np.int64),
        ok=np.array([s.ok for s in samples], dtype=np.bool_),
        sent_at=np.array([s.sent_at for s in samples], dtype=np.float64),
        scheduled_at=_floats([s.scheduled_at for s in samples], nan),
        first_token_at=_floats([s.first_token_at for s in samples], nan),
        finished_at=_floats([s.finished_at for s in samples], nan),
        prompt_tokens=_ints([s.prompt_tokens for s in samples]),
        completion_tokens=_ints([s.completion_tokens for s in samples]),
        reasoning_tokens=_ints([s.reasoning_tokens for s in samples]),
        chunk_count=np.array([len(s.chunk_tokens) for s in samples], dtype=np.int64),
        chunk_tokens=np.array([t for s in samples for t in s.chunk_tokens], dtype=np.int64),
        gap_count=np.array([len(s.chunk_gaps) for s in samples], dtype=np.int64),
        chunk_gaps=np.array([g for s in samples for g in s.chunk_gaps], dtype=np.float64),
        errors={i: s.error for i, s in enumerate(samples) if s.error is not None},
    )


def _floats(values: Sequence[float | None], missing: float) -> FloatArray:
    return np.array([missing if v is None else v for v in values], dtype=np.float64)


def _ints(values: Sequence[int | None]) -> IntArray:
    return np.array([-1 if v is None else v for v in values], dtype=np.int64)
