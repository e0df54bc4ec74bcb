"""What the intervals of one level cost: CPU seconds of ``level_intervals`` on
synthetic levels of N requests x T tokens (concurrency 1, one token per chunk).

    .venv/bin/python bench/interval_cost.py            # 64x256, 256x256, 1000x512

Prints a Markdown table (see docs/metrics.md, "Uncertainty").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' synthetic levels

from tests.helpers.samples import sequential_level

from servesweep.decide.level_intervals import level_intervals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64x256,256x256,1000x512")
    args = parser.parse_args()
    print("| requests x tokens | CPU s | intervals |")
    print("|---|---|---|")
    for size in args.sizes.split(","):
        n, tokens = (int(x) for x in size.split("x"))
        samples, duration = sequential_level(n, tokens)
        start = time.process_time()
        found = level_intervals(samples, duration_s=duration, slo={})
        cpu = time.process_time() - start
        print(f"| {n} x {tokens} | {cpu:.2f} | {len(found)} |")


if __name__ == "__main__":
    main()
