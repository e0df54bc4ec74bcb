"""Storing one level's per-request samples and reading them back, against the level's
request count: CPU and wall seconds, before (a row per request, its chunk gaps and
tokens as JSON, as servesweep stored them up to schema 5) and after (the level's
``SampleColumns`` as one blob, schema 6), and the size of what a Ray slot pickles to
the driver (the ``LevelResult``).

    .venv/bin/python bench/sample_store_cost.py     # 20k..1M requests of 32 tokens; --sizes

*before* writes the rows as ``Store.add_result`` did (one ``executemany``) and reads
them back through ``Store.results``, which still reads a level stored as rows; the
samples are the records of ``tests.helpers.records_before``. *after* is
``Store.add_result`` and ``Store.results`` of the columns ``compute_columns`` gave.

Prints a Markdown table (docs/benchmarks.md, "Between levels", "Storing the samples").
"""

from __future__ import annotations

import argparse
import json
import pickle
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' synthetic levels
sys.path.insert(0, str(Path(__file__).resolve().parent))

from level_cost import raws_of
from tests.helpers import records_before
from tests.helpers.samples import sequential_level

from servesweep.bench.columns import RawColumns
from servesweep.bench.metrics import LevelContext, compute_columns, paused_gc
from servesweep.models import LevelResult, RequestSample, ServerConfig
from servesweep.store import Store, open_store


def _rows(store: Store, result_id: int, samples: Sequence[RequestSample]) -> None:
    """The samples as rows, as ``add_result`` stored them before (schema 5)."""
    db: sqlite3.Connection = store._db
    with db:
        db.executemany(
            "INSERT INTO samples(result_id, idx, ok, error, scheduled_at, sent_at, "
            "first_token_at, finished_at, prompt_tokens, completion_tokens, "
            "reasoning_tokens, chunk_gaps, chunk_tokens) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    result_id,
                    s.index,
                    1 if s.ok else 0,
                    s.error,
                    s.scheduled_at,
                    s.sent_at,
                    s.first_token_at,
                    s.finished_at,
                    s.prompt_tokens,
                    s.completion_tokens,
                    s.reasoning_tokens,
                    json.dumps(list(s.chunk_gaps)),
                    json.dumps(list(s.chunk_tokens)),
                )
                for s in samples
            ],
        )


def _timed(work: Callable[[], Any]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    work()
    return time.process_time() - cpu, time.perf_counter() - wall


def _store_and_read(samples: Sequence[RequestSample], as_rows: bool) -> list[float]:
    """CPU and wall seconds of storing ``samples`` and of reading them back."""
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "s.db")
        sweep = store.create_sweep("demo", "demo.yaml", "name: demo", "h", "0.1.0")
        (trial,) = store.sync_trials(sweep.id, [ServerConfig.of({"budget": 4})])
        store.begin_attempt(trial.id, 1.0, None)
        level = LevelResult("chat", "c64", 0, {"completed": float(len(samples))})
        if as_rows:
            result_id = store.add_result(trial.id, level)
            write = _timed(lambda: _rows(store, result_id, samples))
        else:
            level = LevelResult("chat", "c64", 0, level.metrics, samples)
            write = _timed(lambda: store.add_result(trial.id, level))
        read = _timed(lambda: store.results(trial.id))
        (got,) = store.results(trial.id)
        assert len(got.samples) == len(samples)
        store.close()
    return [*write, *read]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20000,200000,1000000")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    print(
        "| requests | store before (CPU / wall s) | store after | read before | read after "
        "| pickle MB before | after |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.sizes.split(",")):
        made, _ = sequential_level(n, args.tokens)
        raws = raws_of(made)
        del made
        ctx = LevelContext(t0_ns=0, concurrency=64)
        with paused_gc():
            _, _, records, _ = records_before.compute_level(raws, ctx)
            columns = RawColumns()
            columns.extend(raws)
            del raws
            _, _, samples, _ = compute_columns(columns, ctx)
        before = _store_and_read(records, as_rows=True)
        after = _store_and_read(samples, as_rows=False)
        sizes = [
            len(pickle.dumps(LevelResult("chat", "c64", 0, {}, s))) / 1e6
            for s in (records, samples)
        ]
        print(
            f"| {n:,} | {before[0]:.2f} / {before[1]:.2f} | {after[0]:.2f} / {after[1]:.2f} "
            f"| {before[2]:.2f} / {before[3]:.2f} | {after[2]:.2f} / {after[3]:.2f} "
            f"| {sizes[0]:.0f} | {sizes[1]:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
