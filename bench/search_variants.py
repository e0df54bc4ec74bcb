"""Variants of tpe+predict tried against the GPU-hours goal, on the search landscape
(bench/search_efficiency.py) and on its mirror.

The mirror keeps the landscape's memory (the same 15 OOM configurations), its latency
constraint and its cost model, and mirrors the throughput along ``max-num-seqs`` and
``max-num-batched-tokens`` (their log2 indices i -> 3 - i), so its best lies away from
the OOM cliff (near-best: (64, 2048, 2) and (64, 4096, 2)). A change that helps on one
landscape only suits where that landscape's best happens to be.

Variants (each as the driver would run it: the same Search, memory gate and pruning):

- ``base``: tpe+predict as servesweep runs it.
- ``kv``: a start of ``params.points`` chosen from the prediction, before TPE: the
  configurations predicted to fit spread evenly over their predicted KV-cache capacity
  (3 or 6 of them), or the 6 with the most.
- ``mem``: the same, spread evenly over their predicted memory beside the KV cache
  (weights, draft, workspace), 2 to 8 of them.
- ``one-axis``: the designs of ``mem`` that met the goal on both, on the landscape
  mirrored along one axis only (``mirror-seqs``, ``mirror-tokens``).
- ``prune``: bounds on early stop: an oracle stops every trial that is not near-best
  right after its objective level (c8; c32 is saved), or right after its first level
  (c1; no early stop can know that before measuring the objective).
- ``order``: the objective's level first (c8, c1, c32), so a trial that cannot beat
  the best is stopped before the constraint's level.

Run:  PYTHONPATH=src .venv/bin/python bench/search_variants.py [base kv mem one-axis prune order]
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import search_efficiency as se
from landscape_memory import GPU_BYTES

from servesweep.models import LevelResult, ServerConfig
from servesweep.search import PrunePolicy, Search
from servesweep.servers.memory import Capacity, MemoryModel, MemoryPrediction

Key = tuple[int, int, int]
ORIGINAL = dict(se.TRUTH)


def mirrored(seqs: int, tokens: int, spec_tokens: int, axes: str = "st") -> se.Truth:
    """The throughput mirrored along ``axes``: ``s`` max-num-seqs, ``t`` batched tokens."""
    i, j, h = math.log2(seqs / 32), math.log2(tokens / 2048), spec_tokens / 2
    i, j = (3 - i if "s" in axes else i), (3 - j if "t" in axes else j)
    throughput = (
        900
        * (1 + 0.24 * i - 0.05 * i * i)
        * (1 + 0.16 * j - 0.035 * j * j)
        * (1 + 0.16 * h - 0.05 * h * h - 0.035 * h * i)
    )
    t = se.truth(seqs, tokens, spec_tokens)
    return se.Truth(throughput, t.oom, t.ttft_ms)


LANDSCAPES = {"original": "", "mirror": "st", "mirror-seqs": "s", "mirror-tokens": "t"}
"""The landscape and its mirrors: along both axes (``mirror``, the one each variant
is checked on), or along one."""


def use(landscape: str) -> None:
    """Point the benchmark's truth at ``landscape`` (a key of :data:`LANDSCAPES`)."""
    axes = LANDSCAPES[landscape]
    se.TRUTH = {k: mirrored(*k, axes=axes) for k in ORIGINAL} if axes else ORIGINAL
    se.BEST = max(t.throughput for t in se.TRUTH.values() if t.feasible)
    se.NEAR_BEST = {
        k for k, t in se.TRUTH.items() if t.feasible and t.throughput >= (1 - se.NEAR) * se.BEST
    }


def _params(key: Key) -> dict[str, Any]:
    return {"max-num-seqs": key[0], "max-num-batched-tokens": key[1], se.SPEC_PARAM: key[2]}


def _predictions() -> dict[Key, MemoryPrediction]:
    """The uncalibrated prediction of every configuration (what is known before a trial)."""
    model = MemoryModel.of_sweep(se.sweep_spec("tpe", 0), Capacity(GPU_BYTES, "gpu", "bench"))
    return {k: model.predict(_params(k)) for k in ORIGINAL}


PRED = _predictions()
FITS = [k for k, p in PRED.items() if not p.certain_oom]


def spread(n: int, by: Callable[[Key], float]) -> list[Key]:
    """``n`` configurations predicted to fit, evenly over their rank by ``by``."""
    ranked = sorted(FITS, key=by)
    return [ranked[i] for i in sorted({round(q * (len(ranked) - 1) / (n - 1)) for q in range(n)})]


def _kv(key: Key) -> float:
    return PRED[key].kv_tokens


def _beside_kv(key: Key) -> float:
    return PRED[key].per_gpu_bytes - PRED[key].kv_cache


_SPEC = se.sweep_spec


def run(
    label: str,
    points: Sequence[Key] = (),
    seeds: int = 100,
    landscapes: Sequence[str] = ("original", "mirror"),
) -> None:
    """tpe+predict over ``seeds`` seeds on each landscape; one line of shares of the
    grid's GPU-hours (median, p90) and the median restarts."""
    line = f"{label:<50}"
    for landscape in landscapes:
        use(landscape)

        def spec(strategy: str, seed: int, **search: Any) -> se.SweepSpec:
            base = _SPEC(strategy, seed, **search)
            if not points:
                return base
            data = base.model_dump(mode="json", exclude_unset=True)
            data["params"]["points"] = [_params(k) for k in points]
            return se.SweepSpec.model_validate(data)

        se.sweep_spec = spec
        reaches = [se.run_search("tpe", seed, predict=True) for seed in range(seeds)]
        s = se.summarize(reaches, se.grid_cost())
        line += (
            f"  {landscape} {s['share_of_grid_median']:6.1%} {s['share_of_grid_p90']:6.1%}"
            f" r{s['restarts_median']:g}"
        )
    se.sweep_spec = _SPEC
    print(line, flush=True)


def _prune_bounds() -> None:
    current: dict[str, Key] = {}
    run_trial, prune_reason = se.run_trial, se.prune_reason

    def trial(
        search: Search, seq: int, config: ServerConfig, clock: float, rng: random.Random
    ) -> Any:
        current["key"] = se._key(config.params)
        return run_trial(search, seq, config, clock, rng)

    def after_objective(policy: PrunePolicy, results: Sequence[LevelResult]) -> str | None:
        why = prune_reason(policy, results)
        if why is None and len(results) >= 2 and current["key"] not in se.NEAR_BEST:
            return "oracle: not near-best"
        return why

    def after_first(policy: PrunePolicy, results: Sequence[LevelResult]) -> str | None:
        if current["key"] not in se.NEAR_BEST:
            return "oracle: not near-best"
        return prune_reason(policy, results)

    se.run_trial = trial  # type: ignore[assignment]
    try:
        se.prune_reason = after_objective
        run("bound: every other trial stopped after c8")
        se.prune_reason = after_first
        run("bound: every other trial stopped after c1")
    finally:
        se.run_trial, se.prune_reason = run_trial, prune_reason


def main(argv: Sequence[str]) -> int:
    which = set(argv) or {"base", "kv", "mem", "one-axis", "prune", "order"}
    for landscape in LANDSCAPES:
        use(landscape)
        print(f"{landscape}: near-best {sorted(se.NEAR_BEST)}")
    if "base" in which:
        run("tpe+predict")
    if "kv" in which:
        run("points: spread over predicted KV capacity, 3", spread(3, _kv))
        run("points: spread over predicted KV capacity, 6", spread(6, _kv))
        run("points: the 6 with the most KV capacity", sorted(FITS, key=_kv, reverse=True)[:6])
    if "mem" in which:
        for n in range(2, 9):
            run(f"points: spread over memory beside KV, {n}", spread(n, _beside_kv))
    if "one-axis" in which:  # the two designs that met the goal, on the one-axis mirrors
        one = ("mirror-seqs", "mirror-tokens")
        run("tpe+predict", landscapes=one)
        for n in (4, 7):
            run(f"points: spread over memory beside KV, {n}", spread(n, _beside_kv), landscapes=one)
    if "prune" in which:
        _prune_bounds()
    if "order" in which:
        levels = se.LEVELS
        se.LEVELS = (("c8", 240.0), ("c1", 180.0), ("c32", 240.0))
        try:
            run("levels c8, c1, c32 (the objective's first)")
        finally:
            se.LEVELS = levels
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
