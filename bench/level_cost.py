"""What happens between two levels, against the level's request count: CPU seconds of
the request order drawn for the level and of its statistics (the metrics, then the
intervals), before and after the intervals were bounded and the order drawn lazily.

    .venv/bin/python bench/level_cost.py     # 1k..200k requests of 32 tokens; --sizes, --tokens

Synthetic levels (``tests.helpers.samples.sequential_level``: requests of ``--tokens``
tokens, one token per chunk) stand in for what a fast server gives at high
concurrency. Columns:

- ``order``: the request order of a level of ``--order-requests`` requests over its
  prompts, as ``--requests 10000000`` asks for: *before*, every request's prompt drawn
  up front (the eager shuffle servesweep had, reproduced here); *after*,
  ``servesweep.bench.datasets.request_order`` plus the prompts of the level's own N
  requests, drawn as they are sent;
- ``metrics``: the load generator's ``servesweep.bench.metrics.compute_level``
  *before* (``tests.helpers.metrics_before``: Python lists, every token's latency
  sorted) and *after* (the per-token work over numpy arrays, the percentiles' order
  statistics found by ``numpy.partition``: the same figures, pinned by
  ``tests/unit/test_metrics_vectorised.py``), run as the load generator runs it,
  with Python's cycle collector paused (``servesweep.bench.metrics.paused_gc``);
- ``intervals``: ``servesweep.decide.level_intervals.level_intervals`` *before* (every
  request resampled: ``max_units`` set to the request count, which is the earlier
  algorithm, interval for interval) and *after* (the default, at most
  ``servesweep.decide.intervals.MAX_UNITS`` requests resampled, the cycle collector
  paused); *before* runs up to
  ``--before-max`` requests (it grows by about half a millisecond per request).

Prints a Markdown table (docs/benchmarks.md, "Between levels").
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' synthetic levels

from tests.helpers import metrics_before
from tests.helpers.samples import sequential_level

from servesweep.bench.datasets import request_order
from servesweep.bench.metrics import LevelContext, compute_level, paused_gc
from servesweep.bench.responses import RawResult
from servesweep.decide.level_intervals import level_intervals
from servesweep.models import RequestSample

PROMPTS = 1_000


def eager_order(n_prompts: int, n_requests: int, seed: int) -> list[int]:
    """The request order as it was drawn before: every request's prompt up front."""
    rng = random.Random(seed)
    order: list[int] = []
    while len(order) < n_requests:
        block = list(range(n_prompts))
        rng.shuffle(block)
        order.extend(block)
    return order[:n_requests]


def raws_of(samples: list[RequestSample]) -> list[RawResult]:
    """The load generator's raw results for ``samples`` (times from 0 ns)."""
    out = []
    for s in samples:
        sent = int(s.sent_at * 1e9)
        first = int((s.first_token_at or s.sent_at) * 1e9)
        chunks = [first]
        for gap in s.chunk_gaps:
            chunks.append(chunks[-1] + int(gap * 1e9))
        out.append(
            RawResult(
                index=s.index,
                sent_ns=sent,
                ok=True,
                first_byte_ns=first,
                first_ns=first,
                first_answer_ns=first,
                end_ns=int((s.finished_at or 0.0) * 1e9),
                chunk_ns=chunks,
                chunk_tokens=list(s.chunk_tokens),
                prompt_tokens=s.prompt_tokens,
                completion_tokens=s.completion_tokens,
            )
        )
    return out


def lazy_order(n_requests: int, sent: int) -> None:
    """The order of a level of ``n_requests`` requests, of which ``sent`` are sent."""
    order = request_order(PROMPTS, n_requests, 0)
    for i in range(sent):
        order[i]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,8000,20000,77657,200000")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--order-requests", type=int, default=10_000_000)
    parser.add_argument("--before-max", type=int, default=80_000)
    args = parser.parse_args()
    print(
        "| requests | order before | order after | metrics before | metrics after | "
        "intervals before | intervals after | between levels before | after |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.sizes.split(",")):
        samples, duration = sequential_level(n, args.tokens)
        raws = raws_of(samples)
        ctx = LevelContext(t0_ns=0, concurrency=64)
        clock = time.process_time()
        metrics_before.compute_level(raws, ctx)
        metrics_old = time.process_time() - clock
        clock = time.process_time()
        with paused_gc():  # as the load generator runs them
            metrics = compute_level(raws, ctx)[0]
        t_metrics = time.process_time() - clock
        clock = time.process_time()
        eager_order(PROMPTS, args.order_requests, 0)
        order_before = time.process_time() - clock
        clock = time.process_time()
        lazy_order(args.order_requests, n)
        order_after = time.process_time() - clock
        clock = time.process_time()
        with paused_gc():
            level_intervals(samples, duration_s=duration, slo={}, values=metrics)
        after = time.process_time() - clock
        before: float | None = None
        if n <= args.before_max:
            clock = time.process_time()
            level_intervals(samples, duration_s=duration, slo={}, max_units=n)
            before = time.process_time() - clock
        shown = "-" if before is None else f"{before:.2f}"
        total_before = "-" if before is None else f"{order_before + metrics_old + before:.2f}"
        print(
            f"| {n:,} | {order_before:.2f} | {order_after:.3f} | {metrics_old:.2f} | "
            f"{t_metrics:.2f} | {shown} | "
            f"{after:.2f} | {total_before} | {order_after + t_metrics + after:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
