"""Storing one level's per-request samples, against the level's request count: CPU and
wall seconds of ``Store.add_result`` into a fresh results database (every request's
sample a row, its chunk gaps and tokens as JSON), and CPU seconds and size of
``pickle.dumps`` of the ``LevelResult`` (what a Ray slot sends the driver).

    .venv/bin/python bench/sample_store_cost.py     # 20k..200k requests of 32 tokens; --sizes

Prints a Markdown table (docs/benchmarks.md, "Between levels", "Storing the samples").
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' synthetic levels

from tests.helpers.samples import sequential_level

from servesweep.models import LevelResult, ServerConfig
from servesweep.store import open_store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20000,77657,200000")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    print("| requests | add_result CPU s | add_result wall s | pickle CPU s | pickle MB |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in args.sizes.split(",")):
        samples, duration = sequential_level(n, args.tokens)
        result = LevelResult(
            workload="chat",
            level="c64",
            repeat=0,
            metrics={"completed": float(n)},
            samples=tuple(samples),
            started_at=0.0,
            duration_s=duration,
        )
        with tempfile.TemporaryDirectory() as tmp:
            store = open_store(Path(tmp) / "s.db")
            sweep = store.create_sweep("demo", "demo.yaml", "name: demo", "h", "0.1.0")
            (trial,) = store.sync_trials(sweep.id, [ServerConfig.of({"budget": 4})])
            store.begin_attempt(trial.id, 1.0, None)
            cpu, wall = time.process_time(), time.perf_counter()
            store.add_result(trial.id, result)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            store.close()
        clock = time.process_time()
        blob = pickle.dumps(result)
        pickled = time.process_time() - clock
        print(
            f"| {n:,} | {cpu:.2f} | {wall:.2f} | {pickled:.2f} | {len(blob) / 1e6:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
