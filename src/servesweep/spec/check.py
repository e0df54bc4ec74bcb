"""Checks of a sweep that the schema alone cannot make.

The schema checks each value; these check how values relate: duplicate workload
names and levels, the params expansion (empty lists, zips, exclusions, ``when``),
that the plan is not empty, the objective and the constraints. Errors carry the
key (``params.when.0``, ``constraints.1``); :func:`servesweep.spec.load.load_sweep`
adds the file and line.
"""

from __future__ import annotations

from servesweep.errors import ConfigError
from servesweep.spec.constraints import resolve_objective, validate_constraints
from servesweep.spec.expand import Expansion, expand_params
from servesweep.spec.schema import SweepSpec

__all__ = ["check_spec"]


def _check_workloads(spec: SweepSpec) -> None:
    names: dict[str, int] = {}
    for index, workload in enumerate(spec.workloads):
        if workload.name in names:
            raise ConfigError(
                f"duplicate workload name {workload.name!r} "
                f"(also workloads.{names[workload.name]})",
                key=f"workloads.{index}.name",
            )
        names[workload.name] = index
        for field in ("concurrency", "rate"):
            levels: list[float] = list(getattr(workload, field))
            repeated = sorted({v for v in levels if levels.count(v) > 1})
            if repeated:
                raise ConfigError(
                    f"level {repeated[0]:g} is listed twice (use 'repeats' to measure again)",
                    key=f"workloads.{index}.{field}",
                )


def _empty_plan_message(expansion: Expansion) -> str:
    removed = []
    if expansion.excluded:
        removed.append(f"{expansion.excluded} by 'exclude'")
    if expansion.filtered:
        removed.append(f"{expansion.filtered} by 'when'")
    why = f": {' and '.join(removed)}" if removed else ""
    return (
        f"the plan has no server configs: all {expansion.candidates} candidates were "
        f"removed{why}; loosen 'exclude' or 'when'"
    )


def check_spec(spec: SweepSpec) -> Expansion:
    """Run every cross-field check; returns the expansion (non-empty) it computed."""
    expansion = expand_params(spec.params)
    if not expansion.configs:
        raise ConfigError(_empty_plan_message(expansion), key="params")
    _check_workloads(spec)
    resolve_objective(spec)
    validate_constraints(spec)
    return expansion
