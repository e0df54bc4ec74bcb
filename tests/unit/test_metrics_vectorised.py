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

from servesweep.bench.client import RawResult
from servesweep.bench.metrics import LevelContext, compute_level, percentile, summary_stats

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


def _level(seed: int) -> tuple[list[RawResult], LevelContext]:
    """A random level: failures, requests without an end or a first token, chunk
    tokens from the stream, from the usage or none, multi-token and empty chunks,
    ties (whole milliseconds), schedule lags, reasoning."""
    rng = random.Random(seed)
    ms = 1_000_000
    t0 = rng.randint(0, 10**12)
    raws: list[RawResult] = []
    for i in range(rng.choice([1, 2, 3, 10, 60, 300])):
        sent = t0 + rng.randint(0, 2000) * ms
        kind = rng.random()
        if kind < 0.1:
            raws.append(
                RawResult(
                    index=i,
                    sent_ns=sent,
                    scheduled_ns=sent - rng.randint(0, 3) * ms,
                    error=rng.choice(["http_500", "timeout"]),
                    message=rng.choice(["", "boom"]),
                    end_ns=None if rng.random() < 0.5 else sent + 5 * ms,
                )
            )
            continue
        n_chunks = rng.choice([0, 1, 2, 5, 32])
        at = sent + rng.randint(1, 50) * ms
        chunks = []
        for _ in range(n_chunks):
            chunks.append(at)
            at += rng.choice([0, 1, 1, 2, 3, 8]) * ms + rng.randint(0, 999)
        tokens: list[int] | None = [rng.choice([0, 1, 1, 1, 2, 4]) for _ in chunks]
        usage: int | None = sum(tokens or []) + rng.choice([0, 0, 1])
        which = rng.random()
        if which < 0.2:
            tokens = None
        elif which < 0.3:
            tokens, usage = None, None
        elif which < 0.35 and tokens:
            tokens = tokens[:-1]  # a stream whose token counts do not match its chunks
        first = chunks[0] if chunks and rng.random() < 0.95 else None
        raws.append(
            RawResult(
                index=i,
                sent_ns=sent,
                scheduled_ns=None if rng.random() < 0.3 else sent - rng.randint(0, 5) * ms,
                ok=True,
                first_byte_ns=None if first is None else first - ms,
                first_ns=first,
                first_answer_ns=None if first is None else first + rng.choice([0, 0, 7]) * ms,
                end_ns=None if rng.random() < 0.03 else at,
                chunk_ns=chunks,
                chunk_tokens=tokens,
                prompt_tokens=None if rng.random() < 0.1 else rng.randint(1, 500),
                completion_tokens=usage,
                reasoning_tokens=rng.choice([None, 0, 3]),
                finish_reason=rng.choice([None, "stop", "length"]),
            )
        )
    rng.shuffle(raws)
    ends = [r.end_ns for r in raws if r.end_ns is not None]
    steady = None
    if ends and seed % 2:
        steady = (t0 + 10 * ms, max(ends) - rng.randint(0, 20) * ms)
    ctx = LevelContext(
        t0_ns=t0,
        concurrency=None if seed % 4 == 3 else 8,
        rate=2.5 if seed % 4 == 3 else None,
        slo={"ttft_ms": 30.0, "tpot_ms": 3.0} if seed % 3 == 0 else {},
        steady=steady,
        loop_lags_ns=[rng.randint(0, 10**6) for _ in range(rng.choice([0, 5]))],
        stream=seed % 5 != 4,
        ignore_eos=(seed % 2 == 0, seed % 4 == 0),
    )
    return raws, ctx


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
    raws, ctx = _level(seed)
    m, info, samples, warnings = compute_level(raws, ctx)
    m0, info0, samples0, warnings0 = before.compute_level(raws, ctx)
    _same_stats(m, m0)
    _info_close(info, info0)
    assert samples == samples0
    assert warnings == warnings0


def test_a_large_level_gives_the_figures_it_gave() -> None:
    raws, ctx = _level(7)
    many = [
        replace(r, index=r.index + k * 1000, chunk_ns=list(r.chunk_ns))
        for k in range(20)
        for r in raws
    ]
    m, _, samples, _ = compute_level(many, ctx)
    m0, _, samples0, _ = before.compute_level(many, ctx)
    _same_stats(m, m0)
    assert samples == samples0
