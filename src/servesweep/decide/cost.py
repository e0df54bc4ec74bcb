"""What a load level's tokens cost, from the sweep file's price of a GPU-hour.

``cost: {gpu_hour: 2.49, currency: USD}`` in the sweep file prices every GPU a trial
holds; a level that generated ``T`` tokens per second on ``G`` GPUs then costs

    cost_per_mtok     = gpu_hour x G / (3600 x T) x 1e6   (per million output tokens)
    tokens_per_dollar = 3600 x T / (gpu_hour x G)         (per unit of the currency)

Both are exact functions of the output throughput, so its interval maps onto theirs
(the bounds swap for the cost, which falls as throughput rises). The figures are
derived when results are read, not stored: a price changed in the stored sweep file
reprices every level. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from servesweep.metrics_catalog import COST_PER_MTOK, OUTPUT_THROUGHPUT, TOKENS_PER_DOLLAR
from servesweep.models import LevelResult

__all__ = ["PRICED_METRICS", "level_cost", "priced"]

PRICED_METRICS: frozenset[str] = frozenset({COST_PER_MTOK.name, TOKENS_PER_DOLLAR.name})
"""The level metrics derived from the price of a GPU-hour."""

_SECONDS_PER_HOUR = 3600.0


def level_cost(
    metrics: Mapping[str, float],
    intervals: Mapping[str, tuple[float, float]],
    gpus: int | None,
    gpu_hour: float,
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """The cost metrics of one level (and their intervals, where the output throughput
    has one) from its ``metrics`` and ``intervals`` as stored, ``gpus`` held and the
    price of one GPU-hour. Empty when the level generated no tokens or the GPU count
    is unknown."""
    throughput = metrics.get(OUTPUT_THROUGHPUT.name)
    if not gpus or gpus < 1 or gpu_hour <= 0 or not throughput or throughput <= 0:
        return {}, {}
    per_second = gpu_hour * gpus / _SECONDS_PER_HOUR

    def cost(tokens_per_s: float) -> float:
        return per_second / tokens_per_s * 1e6

    def tokens(tokens_per_s: float) -> float:
        return tokens_per_s / per_second

    values = {COST_PER_MTOK.name: cost(throughput), TOKENS_PER_DOLLAR.name: tokens(throughput)}
    bounds: dict[str, tuple[float, float]] = {}
    own = intervals.get(OUTPUT_THROUGHPUT.name)
    if own is not None:
        lo, hi = own
        bounds[TOKENS_PER_DOLLAR.name] = (tokens(lo), tokens(hi))
        if lo > 0:
            bounds[COST_PER_MTOK.name] = (cost(hi), cost(lo))
    return values, bounds


def priced(
    results: Iterable[LevelResult], gpus: int | None, gpu_hour: float | None
) -> list[LevelResult]:
    """``results`` with their cost metrics added (as stored, without a price)."""
    if gpu_hour is None:
        return list(results)
    out = []
    for res in results:
        values, _ = level_cost(res.metrics, res.intervals, gpus, gpu_hour)
        out.append(replace(res, metrics={**res.metrics, **values}) if values else res)
    return out
