"""Synthetic levels for the statistics: requests one after another (concurrency 1), one
token per chunk, latencies drawn from a seeded generator. Used by the interval tests and
by bench/interval_cost.py, so the cost measured is that of the levels tested."""

from __future__ import annotations

import random

from servesweep.models import RequestSample


def sequential_level(n: int, tokens: int, seed: int = 1) -> tuple[list[RequestSample], float]:
    """``n`` requests one after another, ``tokens`` each; and the level's duration."""
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
