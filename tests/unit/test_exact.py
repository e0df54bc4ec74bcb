"""The exact statistics of large arrays give the numbers of the slower way, to the last
bit: ``math.fsum``'s sums, ``numpy.partition``'s order statistics, ``random.choices``'
draws (``servesweep.decide.exact``)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from servesweep.decide import exact
from servesweep.decide.exact import (
    exact_row_sums,
    exact_segment_sums,
    exact_sum,
    order_stats,
    python_choices,
)
from servesweep.decide.intervals import bootstrap_stats, summary_of

pytestmark = pytest.mark.unit


def _values(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3000))
    kind = seed % 6
    if kind == 0:  # latencies in ms
        return rng.uniform(20, 40, n)
    if kind == 1:  # every magnitude, both signs
        return rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n).astype(np.float64)
    if kind == 2:  # cancellation, subnormals, signed zeros
        extra = [1e16, -1e16, 1.0, 1e-300, 5e-324, -0.0, 0.0]
        return np.concatenate([rng.uniform(-1, 1, n), extra])
    if kind == 3:
        return rng.exponential(1.0, n) * 1e-3
    if kind == 4:  # one value many times: the float sum drifts, fsum does not
        return np.full(n, 0.1)
    return rng.integers(-(2**40), 2**40, n).astype(np.float64)


@pytest.mark.parametrize("seed", range(60))
def test_exact_sum_is_fsum(seed: int) -> None:
    values = _values(seed)
    assert exact_sum(values) == math.fsum(values.tolist())
    assert exact_sum(values.tolist()) == math.fsum(values.tolist())


def test_exact_sum_of_nothing_and_of_non_finite_values_is_fsum() -> None:
    assert exact_sum(np.zeros(0)) == 0.0
    assert exact_sum([-0.0]) == math.fsum([-0.0])
    assert exact_sum([1.0, math.inf]) == math.inf
    assert math.isnan(exact_sum([1.0, math.nan]))
    with pytest.raises(OverflowError):
        exact_sum([1e308, 1e308])


def test_exact_sum_batch_by_batch_is_fsum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exact, "_EXACT_COUNT", 7)
    values = _values(1)[:200]
    assert exact_sum(values) == math.fsum(values.tolist())


def test_exact_row_sums_are_each_rows_fsum() -> None:
    rng = np.random.default_rng(3)
    rows = rng.uniform(0, 1e4, (50, 300)) * 10.0 ** rng.integers(-5, 5, (50, 300))
    assert exact_row_sums(rows) == [math.fsum(r) for r in rows.tolist()]
    rows[3, 4] = math.inf
    assert exact_row_sums(rows)[3] == math.inf
    with pytest.raises(ValueError, match="2-D"):
        exact_row_sums(rows[0])


def test_a_float_sum_is_not_exact_where_fsum_is() -> None:
    """The test above can fail: numpy's sum of these values differs from fsum's."""
    values = np.full(1001, 0.1)
    assert float(values.sum()) != math.fsum(values.tolist())
    assert exact_sum(values) == math.fsum(values.tolist())


def _ranks(n: int) -> list[int]:
    ranks = {n - 1, 0}
    for q in (0.5, 0.9, 0.99):
        lo = math.floor((n - 1) * q)
        ranks |= {lo, min(lo + 1, n - 1)}
    return sorted(ranks)


@pytest.mark.parametrize(
    "kind", ["uniform", "ties", "sorted", "reversed", "constant", "floats", "two values"]
)
def test_order_stats_are_partitions_over_many_values(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exact, "_SELECT_FROM", 1000)
    monkeypatch.setattr(exact, "_SAMPLE", 512)
    monkeypatch.setattr(exact, "_CHUNK", 4096)
    rng = np.random.default_rng(7)
    n = 50_001
    values = {
        "uniform": rng.integers(3_000_000, 6_000_000, n),
        "ties": rng.integers(0, 20, n),
        "sorted": np.arange(n, dtype=np.int64),
        "reversed": np.arange(n, dtype=np.int64)[::-1].copy(),
        "constant": np.full(n, 5, dtype=np.int64),
        "floats": rng.exponential(1.0, n),
        "two values": np.where(rng.random(n) < 0.995, 1.0, 1e9),
    }[kind]
    before = values.copy()
    ranks = _ranks(n)
    assert order_stats(values, ranks).tolist() == np.partition(values, ranks)[ranks].tolist()
    assert (values == before).all()  # not changed
    shuffled = [ranks[3], ranks[0], ranks[3]]
    assert order_stats(values, shuffled).tolist() == np.sort(values)[shuffled].tolist()


def test_a_rank_outside_its_bracket_is_still_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sample that misses the values near a rank: the brackets do not hold it, and
    the rank is selected among every value."""
    monkeypatch.setattr(exact, "_SELECT_FROM", 1000)
    values = np.concatenate([np.zeros(5000), np.arange(5000, dtype=np.float64)])
    ranks = _ranks(len(values))
    assert exact._bracketed(values, [ranks[1]]) is not None
    monkeypatch.setattr(exact, "_bracketed", lambda a, ks: None)
    assert order_stats(values, ranks).tolist() == np.partition(values, ranks)[ranks].tolist()


def test_order_stats_of_few_values_and_of_nan() -> None:
    values = np.array([3.0, 1.0, 2.0])
    assert order_stats(values, [0, 2]).tolist() == [1.0, 3.0]
    assert order_stats(values, []).tolist() == []
    with pytest.raises(IndexError):
        order_stats(values, [3])
    big = np.arange(exact._SELECT_FROM + 10, dtype=np.float64)
    big[5] = math.nan
    got = order_stats(big, [0, len(big) - 2, len(big) - 1])
    assert got[:2].tolist() == [0.0, float(len(big) - 1)] and math.isnan(got[2])


@pytest.mark.parametrize(("seed", "n", "times"), [(26, 2, 3), (26, 1000, 200), (1, 7, 50)])
def test_python_choices_are_random_choices(seed: int, n: int, times: int) -> None:
    rng = random.Random(seed)
    want = [rng.choices(range(n), k=n) for _ in range(times)]
    got = [row.tolist() for block in python_choices(seed, n, n, times) for row in block]
    assert got == want


def test_python_choices_in_blocks_go_on_from_one_generator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(exact, "_BLOCK", 25)
    rng = random.Random(5)
    want = [rng.choices(range(10), k=10) for _ in range(9)]
    blocks = list(python_choices(5, 10, 10, 9))
    assert len(blocks) == 5
    assert [row.tolist() for block in blocks for row in block] == want


def test_exact_segment_sums_are_each_runs_fsum() -> None:
    rng = np.random.default_rng(4)
    lengths = [0, 1, 5, 300, 2, 0, 41]
    values = rng.standard_normal(sum(lengths)) * 10.0 ** rng.integers(-8, 8, sum(lengths))
    runs = np.split(values, np.cumsum(lengths)[:-1])
    assert exact_segment_sums(values, lengths) == [math.fsum(r.tolist()) for r in runs]
    with pytest.raises(ValueError, match="add up"):
        exact_segment_sums(values, [1])


def test_the_bootstraps_summaries_at_once_are_those_one_by_one() -> None:
    """``bootstrap_stats`` computes :func:`summary_of` of every resample at once; a
    statistic it does not know (the same function, wrapped) is computed one by one."""
    rng = random.Random(2)
    groups = [
        [[rng.expovariate(1.0)] for _ in range(300)],
        [[rng.uniform(1, 9) for _ in range(rng.randrange(0, 40))] for _ in range(300)],
    ]
    at_once = bootstrap_stats(groups, resamples=120)
    one_by_one = bootstrap_stats(groups, resamples=120, statistic=lambda v: summary_of(v))
    assert at_once == one_by_one
    assert set(at_once[1]) == {"mean", "median", "p90", "p99"}
