"""What happens between two levels, against the level's request count: CPU seconds of
the level's statistics (the metrics, then the intervals) once its last request has
come back, before and after a level's requests were kept as columns.

    .venv/bin/python bench/level_cost.py     # 1k..1M requests of 32 tokens; --sizes, --tokens

Synthetic levels (``tests.helpers.samples.sequential_level``: requests of ``--tokens``
tokens, one token per chunk) stand in for what a fast server gives at high
concurrency. Both run as the load generator runs them, with Python's cycle collector
paused (``servesweep.bench.metrics.paused_gc``). Columns:

- *before*: the statistics from one record per request, as they were
  (``tests.helpers.records_before``: ``compute_level`` over the load generator's
  ``RawResult`` list, building one ``RequestSample`` per request with its chunk gaps
  as a tuple of floats, then ``level_intervals`` over those records);
- *gathered*: what the load generator now does as each request completes, during
  the level (``RawColumns.append``, a few array appends a request and its token
  sums), summed over the level: not between levels, shown for what it moved there;
- *after*: ``servesweep.bench.metrics.compute_columns`` over the gathered columns
  (numpy over every request and chunk at once; the samples a
  ``servesweep.samples.SampleColumns``; exact sums, order statistics and the
  bootstrap's draws from ``servesweep.decide.exact``), then ``level_intervals`` over
  them (the same intervals, ``tests/unit/test_sample_columns.py``).

*before* runs up to ``--before-max`` requests. The request order is drawn as the
requests are sent (``servesweep.bench.datasets.RequestOrder``), during the level.

Prints a Markdown table (docs/benchmarks.md, "Between levels").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' synthetic levels

from tests.helpers import records_before
from tests.helpers.samples import sequential_level

from servesweep.bench.columns import RawColumns
from servesweep.bench.metrics import LevelContext, compute_columns, paused_gc
from servesweep.bench.responses import RawResult
from servesweep.decide.level_intervals import level_intervals
from servesweep.models import RequestSample


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,20000,77657,200000,1000000")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--before-max", type=int, default=1_000_000)
    args = parser.parse_args()
    print(
        "| requests | metrics before | intervals before | between levels before | "
        "gathered (in the level) | metrics after | intervals after | between levels after |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.sizes.split(",")):
        samples, duration = sequential_level(n, args.tokens)
        raws = raws_of(samples)
        del samples
        ctx = LevelContext(t0_ns=0, concurrency=64)
        cells = ["-", "-", "-"]
        if n <= args.before_max:
            with paused_gc():
                clock = time.process_time()
                metrics, _, records, _ = records_before.compute_level(raws, ctx)
                metrics_old = time.process_time() - clock
                clock = time.process_time()
                records_before.level_intervals(records, duration_s=duration, slo={}, values=metrics)
                intervals_old = time.process_time() - clock
            del records
            cells = [
                f"{metrics_old:.2f}",
                f"{intervals_old:.2f}",
                f"{metrics_old + intervals_old:.2f}",
            ]
        with paused_gc():
            clock = time.process_time()
            columns = RawColumns()
            for r in raws:
                columns.append(r)
            gathered = time.process_time() - clock
            del raws
            clock = time.process_time()
            metrics, _, columnar, _ = compute_columns(columns, ctx)
            t_metrics = time.process_time() - clock
            clock = time.process_time()
            level_intervals(columnar, duration_s=duration, slo={}, values=metrics)
            t_intervals = time.process_time() - clock
        print(
            f"| {n:,} | {' | '.join(cells)} | {gathered:.2f} | {t_metrics:.2f} | "
            f"{t_intervals:.2f} | {t_metrics + t_intervals:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
