"""Random levels of raw requests for the statistics' tests: failures, requests
without an end or a first token, chunk tokens from the stream, from the usage or
none, multi-token and empty chunks, ties (whole milliseconds), schedule lags,
reasoning."""

from __future__ import annotations

import random

from servesweep.bench.client import RawResult
from servesweep.bench.metrics import LevelContext

__all__ = ["random_level"]


def random_level(seed: int) -> tuple[list[RawResult], LevelContext]:
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
