"""The vectorised metrics of a level are the figures they were: the percentiles and
maxima to the last bit, the means to rounding (a sum's order), the samples, info and
warnings equal; against the module as it was (``tests.helpers.metrics_before``)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from tests.helpers import metrics_before as before
from tests.helpers.raw_levels import random_level

from servesweep.bench.metrics import compute_level, percentile, summary_stats

MEAN_REL = 1e-12
"""A mean's sum may be taken in another order (numpy's pairwise sum)."""


def _same_stats(new: dict[str, float], old: dict[str, float]) -> None:
    assert new.keys() == old.keys()
    for key, value in old.items():
        if key == "mean" or key.endswith(("_mean_ms", "mean")):
            assert new[key] == pytest.approx(value, rel=MEAN_REL, abs=1e-300), key
        else:
            assert new[key] == value, key


@pytest.mark.parametrize("seed", range(40))
def test_summary_stats_are_the_sorted_lists(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 4, 5, 7, 10, 11, 99, 100, 101, 1000, rng.randint(1, 5000)])
    if seed % 3 == 0:  # ties: few distinct values
        values = [float(rng.randint(0, 5)) for _ in range(n)]
    elif seed % 3 == 1:
        values = [rng.expovariate(0.1) for _ in range(n)]
    else:
        values = [rng.uniform(-1e6, 1e6) for _ in range(n)]
    _same_stats(summary_stats(values), before.summary_stats(values))
    _same_stats(summary_stats(np.array(values)), before.summary_stats(values))
    ordered = sorted(values)
    for q in (0, 1, 25, 50, 90, 99, 99.9, 100):
        assert percentile(ordered, q) == before.percentile(ordered, q)


def test_summary_stats_of_nothing_is_empty() -> None:
    assert summary_stats([]) == {} == before.summary_stats([])
    assert summary_stats(np.zeros(0)) == {}


def _info_close(new: Any, old: Any) -> None:
    if isinstance(old, dict):
        assert isinstance(new, dict) and new.keys() == old.keys()
        for key in old:
            if key == "mean" and isinstance(old[key], float):
                assert new[key] == pytest.approx(old[key], rel=MEAN_REL)
            else:
                _info_close(new[key], old[key])
    else:
        assert new == old


@pytest.mark.parametrize("seed", range(60))
def test_compute_level_gives_the_figures_it_gave(seed: int) -> None:
    raws, ctx = random_level(seed)
    m, info, samples, warnings = compute_level(raws, ctx)
    m0, info0, samples0, warnings0 = before.compute_level(raws, ctx)
    _same_stats(m, m0)
    _info_close(info, info0)
    assert samples == samples0
    assert warnings == warnings0


def test_a_large_level_gives_the_figures_it_gave() -> None:
    raws, ctx = random_level(7)
    many = [
        replace(r, index=r.index + k * 1000, chunk_ns=list(r.chunk_ns))
        for k in range(20)
        for r in raws
    ]
    m, _, samples, _ = compute_level(many, ctx)
    m0, _, samples0, _ = before.compute_level(many, ctx)
    _same_stats(m, m0)
    assert samples == samples0
