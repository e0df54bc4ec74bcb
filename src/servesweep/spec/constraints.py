"""Metric references, constraints and the objective.

A metric reference names one number measured for a trial:

- ``WORKLOAD.LEVEL.METRIC``: one load level of a workload, e.g. ``chat.c1.ttft_p99_ms``
  or ``chat.r2.5.output_throughput`` (levels are ``c<concurrency>`` or ``r<rate>``,
  see :func:`servesweep.models.level_label`; a rate label may contain a dot);
- ``WORKLOAD.METRIC``: an eval workload (``coding.pass_rate``), a capacity workload
  (``chat.capacity``), or a load workload with exactly one level;
- ``METRIC``: a trial metric, the seconds a lifecycle phase took (``load_s``...).

The metric names are those of :mod:`servesweep.metrics_catalog` (the producers store
their numbers under the same names).

A constraint is ``REF OP NUMBER`` with OP one of ``< <= > >= == !=``:
``chat.c1.ttft_p99_ms < 500``.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Literal

from servesweep.errors import ConfigError
from servesweep.metrics_catalog import (
    CAPACITY,
    CAPACITY_METRICS,
    EVAL_METRICS,
    LEVEL_METRICS,
    OUTPUT_THROUGHPUT,
    PASS_RATE,
    TRIAL_METRICS,
)
from servesweep.models import level_label, parse_level
from servesweep.spec.schema import (
    CapacityWorkload,
    EvalWorkload,
    LoadWorkload,
    Objective,
    SweepSpec,
    WorkloadSpec,
)

__all__ = [
    "CAPACITY_METRICS",
    "EVAL_METRICS",
    "LEVEL_METRICS",
    "OPERATORS",
    "TRIAL_METRICS",
    "Constraint",
    "MetricRef",
    "objective_direction",
    "parse_constraint",
    "parse_metric_ref",
    "resolve_objective",
    "resolve_objectives",
    "validate_constraints",
    "validate_ref",
    "workload_levels",
]

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}

_NAME = r"[A-Za-z_][A-Za-z0-9_-]*"
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_LEVEL = rf"c\d+|r(?:{_NUMBER}|inf)"
_REF = re.compile(
    rf"^(?:(?P<workload>{_NAME})\.)?(?:(?P<level>{_LEVEL})\.)?(?P<metric>[A-Za-z_][A-Za-z0-9_]*)$"
)
_CONSTRAINT = re.compile(
    r"^\s*(?P<ref>[^\s<>=!]+)\s*(?P<op><=|>=|==|!=|<|>)\s*(?P<value>[-+]?[^\s]+)\s*$"
)


@dataclass(frozen=True)
class MetricRef:
    """A reference to one metric: ``workload.level.metric`` with optional parts."""

    workload: str | None
    level: str | None
    metric: str
    text: str
    """As the user wrote it."""

    @classmethod
    def of(cls, workload: str | None, level: str | None, metric: str) -> MetricRef:
        """A reference from its parts, written in its canonical form."""
        key = ".".join(p for p in (workload, level, metric) if p)
        return cls(workload=workload, level=level, metric=metric, text=key)

    @property
    def key(self) -> str:
        """The canonical text: ``chat.c1.ttft_p99_ms``."""
        return ".".join(p for p in (self.workload, self.level, self.metric) if p)

    @property
    def is_trial_metric(self) -> bool:
        return self.workload is None and self.metric in TRIAL_METRICS

    def __str__(self) -> str:
        return self.key


def parse_metric_ref(text: str) -> MetricRef:
    """Parse ``WORKLOAD.LEVEL.METRIC``, ``WORKLOAD.METRIC`` or ``METRIC`` (syntax only).

    The level is normalised (``r2.50`` -> ``r2.5``, ``c08`` -> ``c8``).
    Use :func:`validate_ref` to check it against a sweep.
    """
    if not isinstance(text, str):
        raise ConfigError(f"not a metric reference: {text!r}")
    stripped = text.strip()
    match = _REF.match(stripped)
    if match is None:
        raise ConfigError(
            f"not a metric reference: {text!r} "
            "(use WORKLOAD.LEVEL.METRIC like 'chat.c1.ttft_p99_ms', or WORKLOAD.METRIC)"
        )
    workload, level, metric = match.group("workload", "level", "metric")
    if level is not None:
        try:
            concurrency, rate = parse_level(level)
        except ValueError:
            raise ConfigError(f"not a load level in {text!r}: {level!r}") from None
        level = level_label(concurrency, rate)
    return MetricRef(workload=workload, level=level, metric=metric, text=stripped)


@dataclass(frozen=True)
class Constraint:
    """``REF OP NUMBER``: a condition a trial must meet to be a candidate for best."""

    ref: MetricRef
    op: str
    value: float
    text: str

    def check(self, value: float | None) -> bool | None:
        """Whether a measured value satisfies the constraint; None when it is missing."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        return OPERATORS[self.op](float(value), self.value)

    def __str__(self) -> str:
        return f"{self.ref.key} {self.op} {self.value:g}"


def parse_constraint(text: str) -> Constraint:
    """Parse ``REF OP NUMBER`` (syntax only; see :func:`validate_constraints`)."""
    if not isinstance(text, str):
        raise ConfigError(
            f"a constraint must be a string like 'chat.c1.ttft_p99_ms < 500', got {text!r}"
        )
    match = _CONSTRAINT.match(text)
    if match is None:
        raise ConfigError(
            f"not a constraint: {text!r} (use 'REF OP NUMBER' with OP one of "
            "< <= > >= == !=, e.g. 'chat.c1.ttft_p99_ms < 500')"
        )
    raw = match.group("value")
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"constraint {text!r}: not a number: {raw!r}") from None
    if math.isnan(value):
        raise ConfigError(f"constraint {text!r}: not a number: {raw!r}")
    ref = parse_metric_ref(match.group("ref"))
    return Constraint(ref=ref, op=match.group("op"), value=value, text=text.strip())


def workload_levels(workload: WorkloadSpec) -> tuple[str, ...]:
    """The level labels of a workload in run order (``()`` for an eval or a capacity
    search, whose levels are chosen while it runs)."""
    if not isinstance(workload, LoadWorkload):
        return ()
    if workload.rate:
        return tuple(dict.fromkeys(level_label(rate=r) for r in workload.rate))
    return tuple(dict.fromkeys(level_label(concurrency=c) for c in workload.concurrency or [1]))


def _suggest(word: str, options: Iterable[str]) -> str:
    match = difflib.get_close_matches(word, sorted(options), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def validate_ref(ref: MetricRef, spec: SweepSpec) -> MetricRef:
    """Check that a reference names a workload, level and metric of this sweep.

    Returns the reference with the level filled in where the workload has exactly
    one. Raises ConfigError (without file or key; the caller adds them).
    """
    if ref.workload is None:
        if ref.level is None and ref.metric in TRIAL_METRICS:
            return ref
        if ref.metric in LEVEL_METRICS | EVAL_METRICS | CAPACITY_METRICS:
            first = spec.workloads[0]
            levels = workload_levels(first)
            example = (
                f"{first.name}.{levels[0]}.{ref.metric}" if levels else f"{first.name}.{ref.metric}"
            )
            raise ConfigError(f"{ref.text!r} does not say which workload: write e.g. {example!r}")
        names = {w.name for w in spec.workloads}
        hint = _suggest(ref.metric, TRIAL_METRICS | names)
        raise ConfigError(
            f"unknown metric {ref.text!r}{hint} (use WORKLOAD.LEVEL.METRIC, WORKLOAD.METRIC "
            f"or a trial metric: {', '.join(sorted(TRIAL_METRICS))})"
        )
    workloads = {w.name: w for w in spec.workloads}
    workload = workloads.get(ref.workload)
    if workload is None:
        hint = _suggest(ref.workload, workloads)
        raise ConfigError(
            f"{ref.text!r} names unknown workload {ref.workload!r}{hint} "
            f"(workloads: {', '.join(workloads)})"
        )
    if ref.metric in TRIAL_METRICS:
        raise ConfigError(
            f"{ref.text!r}: {ref.metric!r} is a trial metric, measured once per trial; "
            f"write {ref.metric!r} alone"
        )
    if isinstance(workload, CapacityWorkload):
        return _validate_capacity_ref(ref, workload)
    if isinstance(workload, EvalWorkload):
        if ref.metric not in EVAL_METRICS:
            hint = _suggest(ref.metric, EVAL_METRICS)
            raise ConfigError(
                f"{ref.text!r}: {ref.metric!r} is not a metric of eval workload "
                f"{workload.name!r}{hint} (eval metrics: {', '.join(sorted(EVAL_METRICS))})"
            )
        if ref.level is not None:
            raise ConfigError(
                f"{ref.text!r}: eval workload {workload.name!r} has no load levels; "
                f"write {workload.name}.{ref.metric}"
            )
        return ref
    levels = workload_levels(workload)
    if ref.metric not in LEVEL_METRICS:
        if ref.level is None and re.fullmatch(_LEVEL, ref.metric):
            raise ConfigError(
                f"{ref.text!r} names a level but no metric: "
                f"write e.g. '{ref.text}.output_throughput'"
            )
        hint = _suggest(ref.metric, LEVEL_METRICS)
        raise ConfigError(
            f"{ref.text!r}: unknown metric {ref.metric!r}{hint} "
            "(see the metric catalog in docs/sweep-file.md)"
        )
    if ref.level is None:
        if len(levels) == 1:
            return replace(ref, level=levels[0])
        raise ConfigError(
            f"{ref.text!r}: workload {workload.name!r} has {len(levels)} levels "
            f"({', '.join(levels)}); name one, e.g. {workload.name}.{levels[0]}.{ref.metric}"
        )
    if ref.level not in levels:
        raise ConfigError(
            f"{ref.text!r}: workload {workload.name!r} has no level {ref.level!r} "
            f"(levels: {', '.join(levels)})"
        )
    return ref


def _validate_capacity_ref(ref: MetricRef, workload: WorkloadSpec) -> MetricRef:
    if ref.metric not in CAPACITY_METRICS:
        hint = _suggest(ref.metric, CAPACITY_METRICS)
        raise ConfigError(
            f"{ref.text!r}: {ref.metric!r} is not a metric of capacity workload "
            f"{workload.name!r}{hint} (its load levels vary per trial; capacity metrics: "
            f"{', '.join(sorted(CAPACITY_METRICS))})"
        )
    if ref.level is not None:
        raise ConfigError(
            f"{ref.text!r}: capacity workload {workload.name!r} has no fixed levels; "
            f"write {workload.name}.{ref.metric}"
        )
    return ref


def validate_constraints(spec: SweepSpec) -> tuple[Constraint, ...]:
    """Parse and check every constraint of the sweep; the error names the constraint
    (key ``constraints.N``)."""
    out: list[Constraint] = []
    for index, text in enumerate(spec.constraints):
        key = f"constraints.{index}"
        try:
            constraint = parse_constraint(text)
            ref = validate_ref(constraint.ref, spec)
        except ConfigError as exc:
            raise ConfigError(exc.message, key=key) from None
        out.append(replace(constraint, ref=ref))
    return tuple(out)


def objective_direction(spec: SweepSpec) -> Literal["max", "min"]:
    """``max`` or ``min`` of the first objective; ``max`` when the file has none."""
    return spec.objectives[0].direction if spec.objectives else "max"


def _default_objective(spec: SweepSpec) -> MetricRef:
    for workload in spec.workloads:
        if isinstance(workload, CapacityWorkload):
            return MetricRef.of(workload.name, None, CAPACITY.name)
        levels = workload_levels(workload)
        if levels:
            return MetricRef.of(workload.name, levels[0], OUTPUT_THROUGHPUT.name)
    return MetricRef.of(spec.workloads[0].name, None, PASS_RATE.name)


def _first_workload_for(metric: str, spec: SweepSpec) -> str:
    """The first workload that measures ``metric`` (an eval for eval-only metrics, a
    capacity search for capacity metrics)."""
    want_eval = metric in EVAL_METRICS and metric not in LEVEL_METRICS
    want_capacity = metric in CAPACITY_METRICS
    for workload in spec.workloads:
        is_eval, is_capacity = (isinstance(workload, k) for k in (EvalWorkload, CapacityWorkload))
        if is_eval == want_eval and is_capacity == want_capacity:
            return workload.name
    return spec.workloads[0].name


def _check_parts_agree(
    full: MetricRef, workload: str | None, level: str | None, level_key: str, prefix: str
) -> None:
    """A full reference plus objective.workload/concurrency/rate: they must agree."""
    if full.is_trial_metric and (workload is not None or level is not None):
        raise ConfigError(
            f"{full.text!r} is a trial metric, measured once per trial: "
            "drop objective.workload/concurrency/rate",
            key=prefix,
        )
    if workload is not None and workload != full.workload:
        raise ConfigError(
            f"{full.text!r} names workload {full.workload!r}, not {workload!r}",
            key=f"{prefix}.workload",
        )
    if level is not None and level != full.level:
        raise ConfigError(
            f"{full.text!r} names level {full.level!r}, not {level!r}",
            key=level_key,
        )


def resolve_objective(spec: SweepSpec) -> MetricRef:
    """The metric the (first) objective optimises, as a full reference.

    ``maximize``/``minimize`` may be a full reference or a bare metric. A bare
    metric takes its workload from ``objective.workload`` (default: the first
    workload that measures it: an eval for ``pass_rate``, a capacity search for
    ``capacity``, a load workload otherwise) and its level from ``concurrency`` or
    ``rate`` (default: the workload's first level). Without an objective: the first
    load workload's first level's ``output_throughput`` (its ``capacity`` for a
    capacity search; or the first eval's ``pass_rate``), maximised.
    """
    return resolve_objectives(spec)[0][0]


def resolve_objectives(spec: SweepSpec) -> tuple[tuple[MetricRef, Literal["max", "min"]], ...]:
    """Every objective as (full reference, ``max``/``min``), in the order written (the
    default objective when the file has none). Errors name ``objective`` or
    ``objective.N``; the same metric twice is an error."""
    objectives = spec.objectives
    if not objectives:
        return ((_default_objective(spec), "max"),)
    several = isinstance(spec.objective, list)
    out: list[tuple[MetricRef, Literal["max", "min"]]] = []
    for index, objective in enumerate(objectives):
        prefix = f"objective.{index}" if several else "objective"
        ref = _resolve_one(spec, objective, prefix)
        for earlier, _ in out:
            if earlier.key == ref.key:
                raise ConfigError(f"{ref.key!r} is already an objective", key=prefix)
        out.append((ref, objective.direction))
    return tuple(out)


def _resolve_one(spec: SweepSpec, objective: Objective, prefix: str) -> MetricRef:
    field = f"{prefix}.maximize" if objective.maximize is not None else f"{prefix}.minimize"
    try:
        ref = parse_metric_ref(objective.metric)
    except ConfigError as exc:
        raise ConfigError(exc.message, key=field) from None
    if objective.concurrency is not None and objective.rate is not None:
        raise ConfigError("give either 'concurrency' or 'rate', not both", key=prefix)
    level: str | None = None
    level_key = prefix
    if objective.concurrency is not None:
        level = level_label(concurrency=objective.concurrency)
        level_key = f"{prefix}.concurrency"
    elif objective.rate is not None:
        level = level_label(rate=objective.rate)
        level_key = f"{prefix}.rate"
    if ref.workload is not None or ref.is_trial_metric:
        try:
            full = validate_ref(ref, spec)
        except ConfigError as exc:
            raise ConfigError(exc.message, key=field) from None
        _check_parts_agree(full, objective.workload, level, level_key, prefix)
        return full
    workloads = {w.name: w for w in spec.workloads}
    name = objective.workload or _first_workload_for(ref.metric, spec)
    workload = workloads.get(name)
    if workload is None:
        hint = _suggest(name, workloads)
        raise ConfigError(
            f"unknown workload {name!r}{hint} (workloads: {', '.join(workloads)})",
            key=f"{prefix}.workload",
        )
    if not isinstance(workload, LoadWorkload):
        if level is not None:
            raise ConfigError(
                f"{workload.kind} workload {name!r} has no load levels", key=level_key
            )
        full = MetricRef(name, None, ref.metric, objective.metric)
    else:
        levels = workload_levels(workload)
        if level is None:
            level = levels[0]
        elif level not in levels:
            raise ConfigError(
                f"workload {name!r} has no level {level!r} (levels: {', '.join(levels)})",
                key=level_key,
            )
        full = MetricRef(name, level, ref.metric, objective.metric)
    try:
        return validate_ref(full, spec)
    except ConfigError as exc:
        raise ConfigError(exc.message, key=field) from None
