"""Checks of a sweep that the schema alone cannot make.

The schema checks each value; these check how values relate: duplicate workload
names and levels, the params expansion (empty lists, zips, exclusions, ``when``),
that the plan (or a sampling search's space) is not empty, the search settings, the
objectives and the constraints, the placeholders of the command templates
(:mod:`servesweep.spec.templates`), and that no configuration sets up speculative
decoding its engine silently does not run (:mod:`servesweep.spec.speculation`).
Errors carry the key (``params.when.0``, ``constraints.1``);
:func:`servesweep.spec.load.load_sweep` adds the file and line.
"""

from __future__ import annotations

from typing import Any

from servesweep.errors import ConfigError
from servesweep.spec.constraints import resolve_objectives, validate_constraints
from servesweep.spec.expand import Expansion, expand_params
from servesweep.spec.schema import SweepSpec
from servesweep.spec.screening import screening_plan
from servesweep.spec.space import ZIP_DIMENSION, SearchSpace, build_space
from servesweep.spec.speculation import silent_speculation
from servesweep.spec.templates import check_templates

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


def _space_params(space: SearchSpace) -> list[dict[str, Any]]:
    """The params a sampled configuration sets (values do not matter), and each point's."""
    sampled: dict[str, Any] = {}
    for dim in space.dimensions:
        if dim.name == ZIP_DIMENSION:
            sampled.update({k: None for row in dim.choices for k in row})
        else:
            sampled[dim.name] = None
    return [sampled, *(dict(p.params) for p in space.points)]


def _check_space(spec: SweepSpec) -> SearchSpace:
    """A sampling search: its space, and that it can finish."""
    search = spec.search
    space = build_space(spec.params)
    if space.enumerable:
        total = (space.size or 0) + len(space.points)
        if not space.allowed():
            raise ConfigError(
                f"the search space has no allowed configuration: all {total} were removed "
                "by 'exclude' or 'when'; loosen them",
                key="params",
            )
    elif search.trials is None and search.budget is None:
        raise ConfigError(
            f"a {search.strategy} search over a continuous range never runs out of "
            "configurations: give 'trials' or 'budget'",
            key="search",
        )
    return space


def _check_strategy(spec: SweepSpec) -> None:
    if spec.search.strategy == "nsga2" and len(spec.objectives) < 2:
        raise ConfigError(
            "nsga2 is a Pareto search over several objectives: give them as a list "
            "(objective: [{maximize: ...}, {minimize: ...}]), or use strategy tpe for one",
            key="search.strategy",
        )


def _flag_key(key: str) -> str:
    return key if key.startswith("env.") else key.replace("_", "-")


def _check_speculation(spec: SweepSpec, configs: list[dict[str, Any]]) -> None:
    """A draft model (or knob) the engine would load and not speculate with: refused
    before anything starts, naming the configuration and the fix."""
    server = spec.server
    args = {_flag_key(k): v for k, v in server.args.items()}
    for config in configs or [{}]:
        merged = {**args, **{_flag_key(k): v for k, v in config.items()}}
        problem = silent_speculation(server.engine, merged, server.env)
        if problem and not config:
            raise ConfigError(problem, key="server.args")
        if problem:
            shown = ", ".join(f"{k}: {v}" for k, v in config.items())
            raise ConfigError(f"configuration {{{shown}}}: {problem}", key="params")


def check_spec(spec: SweepSpec) -> None:
    """Run every cross-field check (ConfigError with the key of the first problem)."""
    configs: list[dict[str, Any]]
    if spec.search.samples:
        # a sampled value is known only when it is drawn: each launch checks its
        # speculation then (servers.engines.build_launch)
        configs = _space_params(_check_space(spec))
    else:
        expansion = expand_params(spec.params)
        if not expansion.configs:
            raise ConfigError(_empty_plan_message(expansion), key="params")
        configs = [dict(config.params) for config in expansion.configs]
        _check_speculation(spec, configs)
    _check_workloads(spec)
    _check_strategy(spec)
    resolve_objectives(spec)
    validate_constraints(spec)
    screening_plan(spec)
    check_templates(spec, configs)
