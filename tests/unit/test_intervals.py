"""Intervals: the statistics (t, Wilson, bootstrap, batch means, combining repeats) and
the intervals of one level computed from its requests."""

from __future__ import annotations

import math
import random
import statistics
import time

import pytest
from tests.helpers.samples import sequential_level

from servesweep.decide.intervals import (
    bootstrap_ratio,
    bootstrap_stats,
    combine,
    quantile,
    subsample,
    summary_of,
    t_quantile,
    wilson,
)
from servesweep.decide.level_intervals import eval_intervals, level_intervals
from servesweep.models import EvalTaskResult, RequestSample

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("df", "expected"), [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)]
)
def test_t_quantile_matches_the_table(df: int, expected: float) -> None:
    assert t_quantile(0.95, df) == pytest.approx(expected, abs=2e-3)


def test_wilson_of_four_passes_in_five_is_wide() -> None:
    lo, hi = wilson(4, 5)  # type: ignore[misc]
    assert lo == pytest.approx(0.3755, abs=1e-3) and hi == pytest.approx(0.9638, abs=1e-3)
    assert wilson(0, 0) is None
    lo, hi = wilson(50, 50)  # type: ignore[misc]
    assert hi == 1.0 and 0.92 < lo < 0.94


def test_bootstrap_is_deterministic_and_covers_the_truth() -> None:
    rng = random.Random(3)
    units = [[rng.expovariate(1.0)] for _ in range(40)]
    assert bootstrap_stats([units]) == bootstrap_stats([units])
    covered = 0
    rounds = 120
    for seed in range(rounds):
        r = random.Random(1000 + seed)
        data = [[r.expovariate(1.0)] for _ in range(40)]
        lo, hi = bootstrap_stats([data], resamples=200)[0]["mean"]
        covered += lo <= 1.0 <= hi
    # a 95 % percentile bootstrap of the mean of 40 exponentials covers ~92-95 %
    assert 0.86 <= covered / rounds <= 0.99


def test_bootstrap_needs_two_units_and_keeps_units_together() -> None:
    assert bootstrap_stats([[[1.0, 2.0, 3.0]]]) == [{}]
    # two requests, one fast and one slow: the median's interval spans both
    lo, hi = bootstrap_stats([[[1.0] * 50, [9.0] * 50]])[0]["median"]
    assert lo == 1.0 and hi == 9.0


def test_bootstrap_ratio_of_sums() -> None:
    tokens = [10.0, 20.0, 30.0, 40.0]
    seconds = [1.0, 2.0, 3.0, 4.0]  # every request at 10 tokens/s: no uncertainty
    ((lo, hi),) = bootstrap_ratio([tokens], seconds)  # type: ignore[misc]
    assert lo == pytest.approx(10.0) and hi == pytest.approx(10.0)
    r = random.Random(2)
    noisy = [r.uniform(5, 15) for _ in range(50)]
    ((lo, hi),) = bootstrap_ratio([noisy], [1.0] * 50)  # type: ignore[misc]
    assert lo < sum(noisy) / 50 < hi
    assert bootstrap_ratio([[1.0]], [1.0]) == [None]


def test_combine_takes_the_wider_of_within_and_between() -> None:
    one = combine([(100.0, 98.0, 102.0)])
    assert one is not None and (one.interval.lo, one.interval.hi) == (98.0, 102.0)
    # two tight repeats far apart: the spread between them decides
    apart = combine([(100.0, 99.9, 100.1), (110.0, 109.9, 110.1)])
    assert apart is not None and apart.interval.half_width > 5
    assert apart.between_sd == pytest.approx(7.0711, abs=1e-3)
    # two equal but noisy repeats: their own intervals decide
    noisy = combine([(100.0, 90.0, 110.0), (100.0, 90.0, 110.0)])
    assert noisy is not None and noisy.interval.half_width == pytest.approx(10 / 2**0.5)
    assert combine([(5.0, None, None)]) is None


def test_level_intervals_hold_the_point_values() -> None:
    samples, duration = sequential_level(40, 64)
    iv = level_intervals(samples, duration_s=duration, slo={})
    ttfts = sorted((s.ttft or 0.0) * 1e3 for s in samples)
    for stat, q in (("median", 0.5), ("p90", 0.9)):
        lo, hi = iv[f"ttft_{stat}_ms"]
        assert lo <= quantile(ttfts, q) <= hi
    rate = 40 * 64 / duration
    lo, hi = iv["output_throughput"]
    assert lo < rate < hi and (hi - lo) / rate < 0.2
    assert iv["goodput"] == pytest.approx(iv["request_throughput"])  # no SLO: all good
    assert {"itl_p99_ms", "tpot_mean_ms", "e2e_p99_ms", "error_rate"} <= set(iv)
    assert "ttft_max_ms" not in iv  # a maximum has no interval
    assert "goodput" not in level_intervals(samples, duration_s=duration)  # SLO unknown


def test_level_intervals_shrink_with_more_requests() -> None:
    few, d_few = sequential_level(12, 32)
    many, d_many = sequential_level(120, 32)
    w_few = level_intervals(few, duration_s=d_few)["ttft_median_ms"]
    w_many = level_intervals(many, duration_s=d_many)["ttft_median_ms"]
    assert (w_many[1] - w_many[0]) < 0.6 * (w_few[1] - w_few[0])


def test_acceptance_interval_from_chunks_and_scaled_to_counters() -> None:
    rng = random.Random(5)
    samples = []
    t = 0.0
    for i in range(30):
        chunks = (1, *(rng.choice((2, 3, 4)) for _ in range(10)), 1)
        samples.append(
            RequestSample(
                index=i,
                ok=True,
                sent_at=t,
                first_token_at=t + 0.01,
                finished_at=t + 0.1,
                completion_tokens=sum(chunks),
                chunk_gaps=(0.008,) * (len(chunks) - 1),
                chunk_tokens=chunks,
            )
        )
        t += 0.1
    est = sum(sum(s.chunk_tokens[1:-1]) for s in samples) / (30 * 10)
    own = level_intervals(samples, duration_s=t, acceptance=(est, "tokens_per_chunk_estimate"))
    lo, hi = own["acceptance_length"]
    assert lo < est < hi
    counted = level_intervals(samples, duration_s=t, acceptance=(2.0, "engine_counters"))
    clo, chi = counted["acceptance_length"]
    assert clo == pytest.approx(2.0 * lo / est) and chi == pytest.approx(2.0 * hi / est)


def test_eval_intervals_are_wilson() -> None:
    results = [EvalTaskResult(f"t{i}", 0, "pass" if i < 4 else "fail") for i in range(5)]
    lo, hi = eval_intervals(results)["pass_rate"]
    assert lo == pytest.approx(0.3755, abs=1e-3) and hi == pytest.approx(0.9638, abs=1e-3)


def test_a_big_level_costs_well_under_a_second() -> None:
    samples, duration = sequential_level(256, 256)
    start = time.process_time()
    level_intervals(samples, duration_s=duration, slo={})
    # 65 k tokens: the thinned bootstrap keeps it to a fraction of a second of CPU
    assert time.process_time() - start < 2.0


def test_acceptance_is_marked_untrusted_on_synthetic_text_or_ignore_eos() -> None:
    from servesweep.decide.acceptance import acceptance_caveat

    assert acceptance_caveat("builtin:math", False) is None
    assert "ignore_eos" in (acceptance_caveat("builtin:chat", True) or "")
    assert "random-token prompts" in (acceptance_caveat("synthetic", False) or "")


def test_a_subsampled_bootstrap_covers_the_truth_of_the_whole_level() -> None:
    # 400 units bootstrapped on 100 of them, rescaled to all 400: the mean and the
    # median keep the coverage of the full bootstrap above
    covered = {"mean": 0, "median": 0}
    widths: list[float] = []
    rounds = 150
    for seed in range(rounds):
        r = random.Random(5000 + seed)
        data = [[r.expovariate(1.0)] for _ in range(400)]
        picked = subsample(len(data), 100)
        assert picked is not None and len(picked) == 100
        centers = summary_of(sorted(u[0] for u in data))
        found = bootstrap_stats(
            [[data[i] for i in picked]], resamples=200, scale_to=400, centers=[centers]
        )[0]
        for stat, truth in (("mean", 1.0), ("median", math.log(2))):
            lo, hi = found[stat]
            assert lo <= centers[stat] <= hi
            covered[stat] += lo <= truth <= hi
        widths.append(found["mean"][1] - found["mean"][0])
    assert all(0.86 <= c / rounds <= 0.99 for c in covered.values()), covered
    # the width of 400 units' interval (2 x 1.96 / sqrt(400) = 0.196), not 100 units'
    assert 0.15 < statistics.fmean(widths) < 0.25


def test_a_subsampled_ratio_covers_the_truth() -> None:
    covered = 0
    rounds = 150
    for seed in range(rounds):
        r = random.Random(9000 + seed)
        num = [r.uniform(5, 15) for _ in range(400)]
        den = [1.0] * 400
        picked = subsample(400, 100)
        assert picked is not None
        ((lo, hi),) = bootstrap_ratio(  # type: ignore[misc]
            [[num[i] for i in picked]],
            [den[i] for i in picked],
            scale_to=400,
            centers=[sum(num) / 400],
        )
        assert lo < sum(num) / 400 < hi
        covered += lo <= 10.0 <= hi
    assert 0.86 <= covered / rounds <= 0.99


def test_subsample_is_none_up_to_the_bound_and_seeded_above() -> None:
    assert subsample(1000, 1000) is None
    assert subsample(5000, 1000) == subsample(5000, 1000)
    picked = subsample(5000, 1000) or []
    assert len(set(picked)) == 1000 and picked == sorted(picked)


def test_a_level_of_many_requests_costs_what_a_thousand_do() -> None:
    small, d_small = sequential_level(1000, 4)
    big, d_big = sequential_level(20_000, 4)
    start = time.process_time()
    iv_small = level_intervals(small, duration_s=d_small, slo={})
    cost_small = time.process_time() - start
    start = time.process_time()
    iv_big = level_intervals(big, duration_s=d_big, slo={})
    cost_big = time.process_time() - start
    # bounded: the bootstrap resamples 1000 requests; the rest is one pass over all
    assert cost_big < 3 * cost_small + 0.2
    ttfts = sorted((s.ttft or 0.0) * 1e3 for s in big)
    for stat, q in (("median", 0.5), ("p90", 0.9)):
        lo, hi = iv_big[f"ttft_{stat}_ms"]
        assert lo <= quantile(ttfts, q) <= hi
    rate = 20_000 * 4 / d_big
    lo, hi = iv_big["output_throughput"]
    assert lo < rate < hi
    # the interval is that of 20 000 requests: about sqrt(20) narrower than 1000's
    w_small = iv_small["ttft_median_ms"][1] - iv_small["ttft_median_ms"][0]
    w_big = iv_big["ttft_median_ms"][1] - iv_big["ttft_median_ms"][0]
    assert 0.12 < w_big / w_small < 0.4


def test_a_subsampled_level_takes_the_inter_token_centre_from_its_metrics() -> None:
    samples, duration = sequential_level(1200, 8)
    own = level_intervals(samples, duration_s=duration, max_units=300)
    itl = sorted(
        g * 1e3 for s in samples for g in s.chunk_gaps
    )  # one token per chunk: each gap is one ITL
    lo, hi = own["itl_median_ms"]
    assert lo <= quantile(itl, 0.5) <= hi
    stated = {f"itl_{k}_ms": v + 1.0 for k, v in summary_of(itl).items()}
    moved = level_intervals(samples, duration_s=duration, max_units=300, values=stated)
    assert moved["itl_median_ms"] == pytest.approx((lo + 1.0, hi + 1.0))
    # up to the bound every request is resampled, exactly as before
    assert level_intervals(samples, duration_s=duration, max_units=1200) == level_intervals(
        samples, duration_s=duration, max_units=5000
    )
