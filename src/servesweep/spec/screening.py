"""What the screening pass measures (docs/sweep-file.md, ``screening``).

Screening decides on the figures the sweep decides on: the levels its objectives and
constraints name. :func:`screening_plan` gives, for a sweep with ``screening`` on, the
short copy of each load workload that one of them names: only the named levels, one
repeat each, with the screening request count (a fraction of the workload's own
``requests`` or ``duration``, or a count, never more than the workload's own). Levels
no objective or constraint names decide nothing, so they are not screened; evals,
capacity searches and trial metrics (``load_s``) are measured in full or known from
the launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servesweep.errors import ConfigError
from servesweep.models import level_label
from servesweep.spec.constraints import MetricRef, resolve_objectives, validate_constraints
from servesweep.spec.schema import LoadWorkload, ScreeningSpec, SweepSpec

__all__ = ["ScreeningPlan", "screening_plan", "short_workload"]


@dataclass(frozen=True)
class ScreeningPlan:
    """The screening pass of a sweep: its settings and the short workloads it runs."""

    spec: ScreeningSpec
    workloads: tuple[LoadWorkload, ...]
    """Short copies of the load workloads the objectives and constraints name, in the
    sweep file's order, each with only the levels named."""
    threshold: float
    """The relative gap beyond which a screening result cannot win."""

    def requests_of(self, name: str) -> int | None:
        """The screening requests per level of workload ``name`` (None: by duration)."""
        for workload in self.workloads:
            if workload.name == name:
                return workload.requests
        return None


def short_workload(workload: LoadWorkload, levels: list[str], spec: ScreeningSpec) -> LoadWorkload:
    """``workload`` cut to ``levels`` (labels such as ``c8``), one repeat each, with the
    screening request count."""
    concurrency = [c for c in workload.concurrency if f"c{c}" in levels]
    rate = [r for r in workload.rate if level_label(rate=r) in levels]
    update: dict[str, object] = {"concurrency": concurrency, "rate": rate, "repeats": 1}
    requests = spec.requests
    if isinstance(requests, int):
        own = workload.requests
        update.update(requests=min(requests, own) if own is not None else requests, duration=None)
    elif workload.requests is not None:
        update["requests"] = max(1, math.ceil(workload.requests * requests))
    else:
        assert workload.duration is not None
        update["duration"] = workload.duration * requests
    return workload.model_copy(update=update)


def _named_levels(spec: SweepSpec) -> dict[str, list[str]]:
    refs: list[MetricRef] = [ref for ref, _ in resolve_objectives(spec)]
    refs += [c.ref for c in validate_constraints(spec)]
    loads = {w.name: w for w in spec.workloads if isinstance(w, LoadWorkload)}
    named: dict[str, list[str]] = {}
    for ref in refs:
        if ref.workload in loads and ref.level is not None:
            levels = named.setdefault(ref.workload, [])
            if ref.level not in levels:
                levels.append(ref.level)
    return named


def screening_plan(spec: SweepSpec) -> ScreeningPlan | None:
    """The screening pass of ``spec`` (None: ``screening`` is off). ConfigError (key
    ``screening``) when the first objective is not a load workload's level: screening
    would have nothing to decide on."""
    settings = spec.screening_pass
    if settings is None:
        return None
    first, _ = resolve_objectives(spec)[0]
    named = _named_levels(spec)
    if first.workload not in named:
        raise ConfigError(
            f"screening decides on short load levels, but the objective {first.key} is not "
            "a level of a load workload (an eval, a capacity search or a trial metric): "
            "drop 'screening'",
            key="screening",
        )
    workloads = tuple(
        short_workload(w, named[w.name], settings)
        for w in spec.workloads
        if isinstance(w, LoadWorkload) and w.name in named
    )
    return ScreeningPlan(settings, workloads, settings.threshold)
