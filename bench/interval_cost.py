"""What the intervals of one level cost: CPU seconds of ``level_intervals`` on
synthetic levels of N requests x T tokens (concurrency 1, one token per chunk).

    .venv/bin/python bench/interval_cost.py            # 64x256, 256x256, 1000x512

Prints a Markdown table (see docs/metrics.md, "Uncertainty").
"""

from __future__ import annotations

import argparse
import random
import time

from servesweep.level_intervals import level_intervals
from servesweep.models import RequestSample


def level(n: int, tokens: int, seed: int = 1) -> tuple[list[RequestSample], float]:
    rng = random.Random(seed)
    out: list[RequestSample] = []
    t = 0.0
    for i in range(n):
        ttft = rng.uniform(0.02, 0.04)
        gaps = tuple(rng.uniform(0.003, 0.006) for _ in range(tokens - 1))
        end = t + ttft + sum(gaps)
        out.append(
            RequestSample(
                index=i,
                ok=True,
                sent_at=t,
                first_token_at=t + ttft,
                finished_at=end,
                prompt_tokens=100,
                completion_tokens=tokens,
                chunk_gaps=gaps,
                chunk_tokens=(1,) * tokens,
            )
        )
        t = end
    return out, t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64x256,256x256,1000x512")
    args = parser.parse_args()
    print("| requests x tokens | CPU s | intervals |")
    print("|---|---|---|")
    for size in args.sizes.split(","):
        n, tokens = (int(x) for x in size.split("x"))
        samples, duration = level(n, tokens)
        start = time.process_time()
        found = level_intervals(samples, duration_s=duration, slo={})
        cpu = time.process_time() - start
        print(f"| {n} x {tokens} | {cpu:.2f} | {len(found)} |")


if __name__ == "__main__":
    main()
