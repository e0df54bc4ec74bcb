"""Exact statistics of large arrays, at numpy's speed: the numbers the slower way gave.

The statistics after a level read arrays of a million requests and tens of millions
of chunk gaps; what they compute must stay what it was, to the last bit, only
faster (docs/benchmarks.md, "Between levels"):

- :func:`exact_sum` and :func:`exact_row_sums`: ``math.fsum``'s sum (the correctly
  rounded sum of the values) from numpy, without a Python float per value: each
  value split into integer parts, summed exactly as whole numbers by exponent;
- :func:`order_stats`: the values at given ranks of the sorted values, as
  ``numpy.partition`` finds them, from a pass that counts and keeps only the values
  near each rank (bracketed by a seeded sample), not a selection over every value;
- :func:`python_choices`: the draws of ``random.Random(seed).choices(range(n), k=n)``
  repeated, from numpy's Mersenne Twister in the same state (the same generator and
  the same arithmetic): the bootstrap's resamples, without a Python call per draw.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["exact_row_sums", "exact_segment_sums", "exact_sum", "order_stats", "python_choices"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_HALF = float(1 << 26)
"""A 53-bit significand is cut into its top 26 bits and the 27 below them: whole
numbers under 2**27, so 2**26 of them sum exactly in a float64 (2**53)."""
_EXACT_COUNT = 1 << 26
"""Values summed in one exact batch (more are summed batch by batch)."""


def exact_sum(values: npt.ArrayLike) -> float:
    """``math.fsum(values)``: the correctly rounded sum of finite float values
    (``math.fsum`` itself for non-finite ones, or a sum that overflows)."""
    a = np.asarray(values, dtype=np.float64).ravel()
    parts: list[tuple[int, int]] = []
    for start in range(0, len(a), _EXACT_COUNT):
        chunk = a[start : start + _EXACT_COUNT]
        found = _exact(chunk, None)
        if found is None:
            return math.fsum(a.tolist())
        parts.append((found[0][0], found[1]))
    if not parts:
        return 0.0
    scale = min(s for _, s in parts)
    total = sum(t << (s - scale) for t, s in parts)
    return _rounded(total, scale, a)


def exact_row_sums(values: npt.ArrayLike) -> list[float]:
    """``math.fsum`` of each row of a 2-D array of finite floats (rows of fewer than
    2**26 values)."""
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError("exact_row_sums needs a 2-D array")
    rows, n = a.shape
    if n > _EXACT_COUNT:
        return [exact_sum(row) for row in a]
    found = _exact(a.ravel(), np.repeat(np.arange(rows, dtype=np.int64), n), rows)
    if found is None:
        return [math.fsum(row) for row in a.tolist()]
    totals, scale = found
    return [_rounded(t, scale, row) for t, row in zip(totals, a, strict=True)]


def exact_segment_sums(values: npt.ArrayLike, lengths: Sequence[int] | IntArray) -> list[float]:
    """``math.fsum`` of each of the runs of ``lengths`` values that ``values`` holds
    one after another (finite floats, fewer than 2**26 in all)."""
    a = np.asarray(values, dtype=np.float64).ravel()
    counts = np.asarray(lengths, dtype=np.int64)
    if int(counts.sum()) != len(a):
        raise ValueError("the runs' lengths must add up to the values")
    ends = np.cumsum(counts).tolist()
    runs = [a[e - c : e] for e, c in zip(ends, counts.tolist(), strict=True)]
    if len(a) > _EXACT_COUNT:
        return [exact_sum(run) for run in runs]
    found = _exact(a, np.repeat(np.arange(len(counts), dtype=np.int64), counts), len(counts))
    if found is None:
        return [math.fsum(run.tolist()) for run in runs]
    totals, scale = found
    return [_rounded(t, scale, run) for t, run in zip(totals, runs, strict=True)]


def _exact(
    a: FloatArray, segment: IntArray | None, segments: int = 1
) -> tuple[list[int], int] | None:
    """The exact sum of each segment of ``a`` (``segment[i]``: the segment of value
    ``i``; None: one segment) as ``(integer, scale)`` (the sum is ``integer *
    2**scale``); None when some value is not finite. The values of one exponent
    are whole multiples of one power of two: their two halves (:data:`_HALF`) are
    summed by segment and exponent as whole numbers, exactly, then joined as
    Python integers."""
    if not len(a):
        return [0] * segments, 0
    if not bool(np.isfinite(a).all()):
        return None
    mant, exp = np.frexp(a)
    low = int(exp.min())
    width = int(exp.max()) - low + 1
    where = exp.astype(np.int64) - low
    if segment is not None:
        where += segment * width
    top = mant * _HALF
    high = np.trunc(top)
    below = (top - high) * (2.0 * _HALF)  # exact: the 27 bits under the top 26
    size = segments * width
    tops = np.bincount(where, high, minlength=size).reshape(segments, width)
    bottoms = np.bincount(where, below, minlength=size).reshape(segments, width)
    totals = [0] * segments
    for r, e in zip(*np.nonzero((tops != 0.0) | (bottoms != 0.0)), strict=True):
        totals[r] += ((int(tops[r, e]) << 27) + int(bottoms[r, e])) << int(e)
    return totals, low - 53


def _rounded(total: int, scale: int, values: Any) -> float:
    """``total * 2**scale`` rounded to the nearest float (``math.fsum`` of
    ``values`` when it overflows)."""
    if total == 0:
        return 0.0
    try:
        if scale >= 0:
            return float(total << scale)
        return total / (1 << -scale)  # int / int: correctly rounded
    except OverflowError:
        return math.fsum(np.asarray(values, dtype=np.float64).ravel().tolist())


_SELECT_FROM = 1 << 18
"""Values from which :func:`order_stats` brackets its ranks instead of selecting
among every value."""
_SAMPLE = 1 << 16
"""Values of the seeded sample the brackets are read from."""
_CHUNK = 1 << 18
"""Values counted at a time (a chunk stays in the cache while each bracket reads it)."""


def order_stats(values: npt.NDArray[Any], ranks: Sequence[int]) -> npt.NDArray[Any]:
    """The values at ``ranks`` (0-based) of ``values`` sorted: ``np.partition(values,
    ranks)[ranks]``, the same numbers. ``values`` is not changed.

    Under :data:`_SELECT_FROM` values, ``numpy.partition``. Above, the smallest and
    largest by ``min``/``max``, and each other rank from a bracket of values read
    off a seeded sample of the values (about six standard deviations of the
    sample's rank either side: the rank falls outside it a few times in a billion
    at most): one pass counts the values under each bracket and
    keeps those inside it, and the rank is selected among those; a rank that still
    falls outside its bracket is selected among every value (the same answer,
    slower)."""
    a = np.asarray(values)
    n = len(a)
    ks = sorted(set(int(k) for k in ranks))
    if ks and not 0 <= ks[0] <= ks[-1] < n:
        raise IndexError(f"ranks {ks[0]}..{ks[-1]} of {n} values")
    if n < _SELECT_FROM or a.dtype.kind not in "iuf":
        return _partitioned(a, ks, ranks)
    if a.dtype.kind == "f" and bool(np.isnan(a).any()):
        return _partitioned(a, ks, ranks)
    found: dict[int, Any] = {}
    inner = [k for k in ks if 0 < k < n - 1]
    if ks and ks[0] == 0:
        found[0] = a.min()
    if ks and ks[-1] == n - 1:
        found[n - 1] = a.max()
    if inner:
        got = _bracketed(a, inner)
        if got is None:
            return _partitioned(a, ks, ranks)
        found.update(got)
    return np.array([found[int(k)] for k in ranks], dtype=a.dtype)


def _partitioned(a: npt.NDArray[Any], ks: list[int], ranks: Sequence[int]) -> npt.NDArray[Any]:
    if not ks:
        return a[:0]
    part = np.partition(a, ks)
    return part[np.asarray(ranks, dtype=np.int64)]


def _bracketed(a: npt.NDArray[Any], ks: list[int]) -> dict[int, Any] | None:
    """The values at ranks ``ks`` (none the smallest or the largest) from brackets;
    None when a rank falls outside its bracket."""
    n = len(a)
    rng = np.random.default_rng(n)
    sample = np.sort(a[rng.integers(0, n, _SAMPLE)])
    m = len(sample)
    spans: list[tuple[Any, Any, list[int]]] = []
    for k in ks:
        f = k / n
        centre = f * m
        margin = 6.0 * math.sqrt(m * f * (1.0 - f)) + 8.0
        lo = math.floor(centre - margin)
        hi = math.ceil(centre + margin)
        low = sample[lo] if lo > 0 else None
        high = sample[hi] if hi < m - 1 else None
        if spans and (spans[-1][1] is None or low is None or low <= spans[-1][1]):
            spans[-1] = (spans[-1][0], high, spans[-1][2] + [k])
        else:
            spans.append((low, high, [k]))
    below = [0] * len(spans)
    inside: list[list[npt.NDArray[Any]]] = [[] for _ in spans]
    under = np.empty(min(n, _CHUNK), dtype=np.bool_)  # buffers reused chunk after chunk
    keep = np.empty(min(n, _CHUNK), dtype=np.bool_)
    for start in range(0, n, _CHUNK):
        chunk = a[start : start + _CHUNK]
        size = len(chunk)
        for i, (low, high, _) in enumerate(spans):
            if low is None and high is None:
                inside[i].append(chunk)
                continue
            if low is not None:
                np.less(chunk, low, out=under[:size])
                below[i] += int(np.count_nonzero(under[:size]))
            if high is None:
                np.logical_not(under[:size], out=keep[:size])
            elif low is None:
                np.less_equal(chunk, high, out=keep[:size])
            else:
                np.less_equal(chunk, high, out=keep[:size])
                np.greater(keep[:size], under[:size], out=keep[:size])  # and not under
            inside[i].append(chunk[keep[:size]])
    found: dict[int, Any] = {}
    for (_, _, group), count, parts in zip(spans, below, inside, strict=True):
        values = np.concatenate(parts)
        if not count <= group[0] or not group[-1] < count + len(values):
            return None
        local = [k - count for k in group]
        part = np.partition(values, local)
        for k, at in zip(group, local, strict=True):
            found[k] = part[at]
    return found


_BLOCK = 1 << 20
"""Draws :func:`python_choices` makes at a time (a block of resamples)."""


def python_choices(seed: int, n: int, k: int, times: int) -> Iterator[IntArray]:
    """``times`` lists of ``random.Random(seed).choices(range(n), k=k)``, drawn one
    after another from one generator, as the rows of 2-D blocks (of about
    :data:`_BLOCK` draws each): the same draws (numpy's legacy Mersenne Twister set
    to Python's state, each draw ``floor(random() * n)`` of the same 53-bit
    ``random()``)."""
    state = random.Random(seed).getstate()[1]
    mt = np.random.RandomState()
    mt.set_state(("MT19937", np.array(state[:-1], dtype=np.uint32), int(state[-1]), 0, 0.0))
    rows = max(1, _BLOCK // max(1, k))
    for start in range(0, times, rows):
        count = min(rows, times - start)
        draws = np.floor(mt.random_sample(count * k) * float(n)).astype(np.int64)
        yield draws.reshape(count, k)
