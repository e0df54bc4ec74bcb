"""A capacity workload as a plan of levels (:class:`CapacityPlan`): load levels chosen
by :func:`~servesweep.bench.capacity_search.next_load` until the highest load meeting
the SLO is known, each measured by the ordinary load generator
(:mod:`servesweep.bench.load`, which runs the plan; this module does not import it).

The plan's results are one :class:`~servesweep.models.LevelResult` per level it measured (labelled
``c12`` or ``r3.75`` like any level; ``info["capacity"]`` holds its load, SLO score
and attainment) and a last one, level
:data:`CAPACITY_LEVEL`, whose metrics are the capacity metrics of the catalog
(:data:`servesweep.metrics_catalog.CAPACITY_METRICS`): ``capacity`` (req/s or
concurrency), ``capacity_levels``, ``capacity_attainment`` and
``capacity_output_throughput``; its ``info`` lists the levels tried and says whether
the capacity is bounded by the range (``below_low``, ``at_least_high``) or by
``max_levels``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from servesweep.bench.capacity_search import Probe, estimate, next_load, slo_score
from servesweep.metrics_catalog import (
    CAPACITY,
    CAPACITY_ATTAINMENT,
    CAPACITY_LEVELS,
    CAPACITY_METRICS,
    CAPACITY_OUTPUT_THROUGHPUT,
    OUTPUT_THROUGHPUT,
)
from servesweep.models import LevelResult
from servesweep.spec.schema import CapacityWorkload, LoadWorkload, WorkloadSpec

__all__ = [
    "CAPACITY_LEVEL",
    "CapacityPlan",
    "capacity_result",
    "error_checked",
    "level_workload",
]

CAPACITY_LEVEL = "capacity"
"""The level label of a capacity workload's summary result."""


def level_workload(workload: CapacityWorkload, load: float) -> LoadWorkload:
    """The load workload measuring one load level of a capacity search (the
    capacity workload's fields as they are, its section dropped)."""
    if workload.capacity.vary == "concurrency":
        levels: dict[str, Any] = {"concurrency": [round(load)], "rate": []}
    else:
        levels = {"concurrency": [], "rate": [load]}
    fields = {**dict(workload), "capacity": None, "repeats": 1, **levels}
    return LoadWorkload.model_construct(set(workload.model_fields_set) | set(levels), **fields)


def capacity_result(workload: CapacityWorkload, levels: Sequence[LevelResult]) -> LevelResult:
    """The summary result of a capacity search over the measured ``levels`` (in the
    order measured, each with its ``info["capacity"]``)."""
    spec = workload.capacity
    probes = [_probe(r) for r in levels]
    found = estimate(spec, probes)
    at_capacity = next((r for r, p in zip(levels, probes, strict=True) if found.probe is p), None)
    metrics = {
        CAPACITY.name: found.capacity,
        CAPACITY_LEVELS.name: float(len(levels)),
        CAPACITY_ATTAINMENT.name: found.probe.attainment if found.probe is not None else 0.0,
        CAPACITY_OUTPUT_THROUGHPUT.name: (
            at_capacity.metrics.get(OUTPUT_THROUGHPUT.name, 0.0) if at_capacity else 0.0
        ),
    }
    assert set(metrics) == CAPACITY_METRICS
    info: dict[str, Any] = {
        "vary": spec.vary,
        "slo": dict(spec.slo),
        "quantile": spec.quantile,
        "tolerance": spec.tolerance,
        "bound": found.bound,
        "upper": found.upper,
        "levels": [{"level": r.level, **(r.info.get("capacity") or {})} for r in levels],
    }
    warnings = []
    if found.bound == "below_low":
        warnings.append(
            f"the SLO fails already at the lowest load {spec.low:g}: capacity 0 "
            "(lower capacity.low)"
        )
    elif found.bound == "at_least_high":
        warnings.append(
            f"the SLO still holds at the highest load {spec.high:g}: the capacity is at "
            "least that (raise capacity.high)"
        )
    elif found.bound == "max_levels":
        warnings.append(
            f"stopped after {spec.max_levels} levels before the capacity was within "
            f"{spec.tolerance:.0%} (between {found.capacity:g} and {found.upper or spec.high:g})"
        )
    return LevelResult(
        workload=workload.name,
        level=CAPACITY_LEVEL,
        repeat=0,
        metrics=metrics,
        warnings=tuple(warnings),
        info=info,
        started_at=levels[0].started_at if levels else 0.0,
        duration_s=sum(r.duration_s for r in levels),
    )


def _probe(result: LevelResult) -> Probe:
    facts = result.info.get("capacity") or {}
    score = facts.get("score")
    return Probe(
        float(facts.get("load", 0.0)),
        math.inf if score is None else float(score),
        float(facts.get("attainment", 0.0)),
    )


def _scored(workload: CapacityWorkload, load: float, result: LevelResult) -> LevelResult:
    spec = workload.capacity
    score, attainment = slo_score(result.samples, spec.slo, spec.quantile)
    facts = {
        "load": load,
        "score": score if math.isfinite(score) else None,
        "attainment": attainment,
        "meets_slo": score <= 1.0,
    }
    return replace(result, info={**result.info, "capacity": facts})


def error_checked(workload: WorkloadSpec, results: Sequence[LevelResult]) -> list[LevelResult]:
    """The results whose error rate may fail a trial (``bench_errors``). A capacity
    search measures loads beyond what the server sustains on purpose, so only the
    levels that met the SLO count, and the lowest load measured (errors there mean the
    server fails at any load); for any other workload, every result."""
    if not isinstance(workload, CapacityWorkload):
        return list(results)
    levels = [r for r in results if r.level != CAPACITY_LEVEL and "capacity" in r.info]
    if not levels:
        return []
    lowest = min(levels, key=lambda r: float(r.info["capacity"].get("load", 0.0)))
    return [r for r in levels if r is lowest or r.info["capacity"].get("meets_slo")]


class CapacityPlan:
    """The levels of one capacity workload, chosen one at a time: the load generator
    measures each level :meth:`next_level` returns and hands its result back, until
    it returns None; :attr:`results` are then the levels measured and the summary
    (:func:`capacity_result`). ``on_progress`` hears one line per level and one for
    the capacity found."""

    def __init__(
        self, workload: CapacityWorkload, on_progress: Callable[[str], None] | None = None
    ) -> None:
        self.workload = workload
        self.spec = workload.capacity
        self.on_progress = on_progress
        self.measured: list[LevelResult] = []
        self._probes: list[Probe] = []
        self._pending: tuple[LoadWorkload, float] | None = None

    def next_level(
        self, previous: LoadWorkload | None, result: LevelResult | None
    ) -> LoadWorkload | None:
        """The next level to measure (a load workload of one level), or None when the
        capacity is known; ``previous`` is the level returned last and ``result`` its
        measurement (both None at the start)."""
        if self._pending is not None:
            level, measured_at = self._pending
            if previous is not level or result is None:
                raise ValueError("next_level needs the result of the level it returned last")
            self._record(measured_at, result)
        self._pending = None
        load = next_load(self.spec, self._probes)
        if load is None:
            self._finish()
            return None
        self._pending = (level_workload(self.workload, load), load)
        return self._pending[0]

    @property
    def results(self) -> list[LevelResult]:
        """The levels measured, then the summary."""
        return [*self.measured, capacity_result(self.workload, self.measured)]

    def _record(self, load: float, result: LevelResult) -> None:
        scored = _scored(self.workload, load, result)
        self.measured.append(scored)
        self._probes.append(_probe(scored))
        if self.on_progress is not None:
            verdict = "meets" if self._probes[-1].ok else "misses"
            self.on_progress(
                f"{self.workload.name} capacity: {scored.level} {verdict} the SLO "
                f"({self._probes[-1].attainment:.1%} of requests within it)"
            )

    def _finish(self) -> None:
        if self.on_progress is not None:
            summary = capacity_result(self.workload, self.measured)
            unit = "req/s" if self.spec.vary == "rate" else "concurrent requests"
            self.on_progress(
                f"{self.workload.name} capacity: {summary.metrics[CAPACITY.name]:g} {unit}"
            )
