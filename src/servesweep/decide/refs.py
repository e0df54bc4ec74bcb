"""Metric references resolved against measured results.

Parsing is :mod:`servesweep.spec.constraints`' job (``parse_metric_ref``,
``parse_constraint``); this module answers "what value did trial T measure for
``chat.c1.ttft_p99_ms``" from a :class:`SweepData`, repeats aggregated, and checks a
reference given for a stored sweep (:func:`check_ref`, :func:`check_constraint`) the
way the sweep file's own references were checked.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from servesweep import metrics_catalog as mc
from servesweep.decide.resources import trial_gpus
from servesweep.decide.stats import LevelStats, MetricStats, aggregate_levels, level_sort_key
from servesweep.errors import ConfigError, ServesweepError
from servesweep.metrics_catalog import TRIAL_METRICS, Scope, phase_of
from servesweep.models import LevelResult, level_label, usable
from servesweep.records import SweepData, TrialRecord
from servesweep.spec.constraints import (
    Constraint,
    MetricRef,
    objective_direction,
    parse_constraint,
    parse_metric_ref,
    resolve_objective,
    resolve_objectives,
    validate_ref,
)
from servesweep.spec.load import load_sweep_text
from servesweep.spec.schema import SweepSpec

__all__ = [
    "ResultIndex",
    "check_constraint",
    "check_ref",
    "is_search",
    "objective_of",
    "objectives_of",
    "ref_label",
    "stored_spec",
]


def ref_label(ref: MetricRef) -> str:
    return ref.key


class ResultIndex:
    """Aggregated results of every trial of a sweep, computed once."""

    def __init__(self, data: SweepData, *, reliable_only: bool = False) -> None:
        """``reliable_only``: levels the load generator could not time are left out
        (their reasons kept in ``unreliable``), as a decision must."""
        self.data = data
        self.unreliable: dict[tuple[int, str, str], str] = {}
        """(trial, workload, level) -> why, for the levels left out."""
        if reliable_only:
            kept: dict[int, tuple[LevelResult, ...]] = {}
            for trial_id, results in data.results.items():
                kept[trial_id] = tuple(usable(results))
                for r in results:
                    if r.unreliable is not None:
                        self.unreliable.setdefault((trial_id, r.workload, r.level), r.unreliable)
            data = replace(data, results=kept)
        self.levels: dict[int, list[LevelStats]] = {
            t.id: aggregate_levels(data, t.id) for t in data.trials
        }

    def unreliable_reason(self, trial: TrialRecord, ref: MetricRef) -> str | None:
        """Why ``ref`` has no value for ``trial`` when a level of it was left out as
        unreliable (None otherwise); asked only once ``stats`` found no value."""
        if ref.workload is None:
            return None
        for (tid, workload, level), why in self.unreliable.items():
            if tid == trial.id and workload == ref.workload and ref.level in (None, level):
                return f"{workload}.{level} is unreliable: {why}"
        return None

    def level(self, trial_id: int, workload: str, level: str) -> LevelStats | None:
        for lvl in self.levels.get(trial_id, ()):
            if lvl.workload == workload and lvl.level == level:
                return lvl
        return None

    def workload_levels(self, workload: str) -> list[str]:
        """Every level of a workload measured in any trial, sorted."""
        found = {
            lvl.level
            for levels in self.levels.values()
            for lvl in levels
            if lvl.workload == workload
        }
        return sorted(found, key=level_sort_key)

    def workloads(self) -> list[str]:
        seen: dict[str, None] = {}
        for trial in self.data.trials:
            for lvl in self.levels.get(trial.id, ()):
                seen.setdefault(lvl.workload, None)
        return list(seen)

    def is_eval(self, workload: str) -> bool:
        for levels in self.levels.values():
            for lvl in levels:
                if lvl.workload != workload:
                    continue
                if mc.PASS_RATE.name in lvl.metrics or any(r.eval_results for r in lvl.repeats):
                    return True
        return False

    def stats(self, trial: TrialRecord, ref: MetricRef) -> MetricStats | None:
        """The measured value of ``ref`` for ``trial`` (mean over repeats), or None."""
        if ref.workload is None:
            phase = phase_of(ref.metric)
            if phase is not None:
                secs = trial.phase_seconds.get(phase.value)
                return None if secs is None else MetricStats.of([float(secs)])
            if ref.metric == mc.GPUS.name:
                gpus = trial_gpus(self.data, trial)
                return None if gpus is None else MetricStats.of([float(gpus)])
            return None
        candidates = [lvl for lvl in self.levels.get(trial.id, ()) if lvl.workload == ref.workload]
        if ref.level is not None:
            candidates = [lvl for lvl in candidates if lvl.level == ref.level]
        elif len(candidates) > 1:
            # a capacity search's summary carries its metrics beside the levels it tried
            candidates = [lvl for lvl in candidates if ref.metric in lvl.metrics]
            if len(candidates) > 1:
                return None  # ambiguous: the reference must name a level
        if not candidates:
            return None
        lvl = candidates[0]
        found = lvl.metrics.get(ref.metric)
        if found is None and mc.lookup(ref.metric, Scope.EVAL) is not None:
            return _eval_stat(lvl, ref.metric)
        return found

    def value(self, trial: TrialRecord, ref: MetricRef) -> float | None:
        stats = self.stats(trial, ref)
        return None if stats is None else stats.mean


def _eval_stat(lvl: LevelStats, metric: str) -> MetricStats | None:
    """An eval metric recounted from the stored per-sample results (a result stored
    without it)."""
    values: list[float] = []
    for res in lvl.repeats:
        if not res.eval_results:
            continue
        passed = sum(1 for e in res.eval_results if e.status == "pass")
        errors = sum(1 for e in res.eval_results if e.status == "error")
        total = len(res.eval_results)
        recounted = {
            mc.PASS_RATE.name: passed / total,
            mc.PASSED.name: passed,
            mc.TOTAL.name: total,
            mc.EVAL_ERRORS.name: errors,
            mc.EVAL_ERROR_RATE.name: errors / total,
        }
        values.append(recounted[metric])
    return MetricStats.of(values) if values else None


def stored_spec(data: SweepData) -> SweepSpec | None:
    """The sweep file as stored with the sweep, when its text still loads (an old or
    hand-edited one may not)."""
    if not data.sweep.spec_text.strip():
        return None
    try:
        return load_sweep_text(data.sweep.spec_text, data.sweep.spec_path).spec
    except ServesweepError:
        return None


def is_search(data: SweepData) -> bool:
    """Whether the sweep was a search that proposes its trials (``search.strategy``
    other than ``grid``), as its stored sweep file says."""
    spec = stored_spec(data)
    return bool(spec is not None and spec.search.samples)


def _spec_objective(data: SweepData) -> tuple[MetricRef, str] | None:
    """The objective as the sweep file itself resolves it, when its text still loads."""
    spec = stored_spec(data)
    if spec is None:
        return None  # fall back to the stored dict
    try:
        return resolve_objective(spec), objective_direction(spec)
    except ServesweepError:
        return None


def check_ref(
    data: SweepData, text: str, *, key: str | None = None, index: ResultIndex | None = None
) -> MetricRef:
    """A metric reference given for a stored sweep (``best --objective``), checked like
    one in its sweep file: the workload, level and metric must exist (with a
    suggestion when they do not). Checked against the sweep file as stored, or, when
    that no longer loads, against the workloads measured and the metric catalog.

    Returns the reference with the level filled in where the workload has exactly
    one; raises ConfigError (with ``key``, e.g. the option's name).
    """
    try:
        ref = parse_metric_ref(text)
        spec = stored_spec(data)
        if spec is not None:
            return validate_ref(ref, spec)
        return _check_measured(ref, index or ResultIndex(data))
    except ConfigError as exc:
        raise ConfigError(exc.message, key=key) from None


def check_constraint(
    data: SweepData, text: str, *, key: str | None = None, index: ResultIndex | None = None
) -> Constraint:
    """``REF OP NUMBER`` given for a stored sweep, its reference checked by :func:`check_ref`."""
    try:
        constraint = parse_constraint(text)
    except ConfigError as exc:
        raise ConfigError(exc.message, key=key) from None
    return replace(constraint, ref=check_ref(data, constraint.ref.text, key=key, index=index))


def _hint(word: str, options: Iterable[str]) -> str:
    match = difflib.get_close_matches(word, sorted(options), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _check_measured(ref: MetricRef, index: ResultIndex) -> MetricRef:
    """A reference checked against what a sweep measured (its sweep file unreadable)."""
    if ref.workload is None:
        if ref.level is None and ref.metric in TRIAL_METRICS:
            return ref
        raise ConfigError(
            f"unknown metric {ref.text!r}{_hint(ref.metric, TRIAL_METRICS)} (use "
            f"WORKLOAD.LEVEL.METRIC, WORKLOAD.METRIC or one of {', '.join(sorted(TRIAL_METRICS))})"
        )
    workloads = index.workloads()
    if ref.workload not in workloads:
        raise ConfigError(
            f"{ref.text!r} names unknown workload {ref.workload!r}"
            f"{_hint(ref.workload, workloads)} (measured: {', '.join(workloads) or 'none'})"
        )
    scope = Scope.EVAL if index.is_eval(ref.workload) else Scope.LEVEL
    if mc.lookup(ref.metric, scope) is None:
        names = mc.names_of(scope)
        hint = _hint(ref.metric, names)
        if scope is Scope.EVAL:
            raise ConfigError(
                f"{ref.text!r}: {ref.metric!r} is not a metric of eval workload "
                f"{ref.workload!r}{hint} (eval metrics: {', '.join(sorted(names))})"
            )
        raise ConfigError(
            f"{ref.text!r}: unknown metric {ref.metric!r}{hint} "
            "(see the metric catalog in docs/sweep-file.md)"
        )
    levels = index.workload_levels(ref.workload)
    if scope is Scope.LEVEL and ref.level is not None and ref.level not in levels:
        raise ConfigError(
            f"{ref.text!r}: workload {ref.workload!r} has no level {ref.level!r} "
            f"(levels: {', '.join(levels)})"
        )
    if scope is Scope.LEVEL and ref.level is None and len(levels) == 1:
        return replace(ref, level=levels[0])
    return ref


def objectives_of(data: SweepData, index: ResultIndex | None = None) -> list[tuple[MetricRef, str]]:
    """Every objective of the sweep file, in order (the first ranks, the next ones
    break its ties), when its text still loads; else :func:`objective_of`'s one.
    Empty when nothing was measured at all."""
    spec = stored_spec(data)
    if spec is not None:
        try:
            return [(ref, str(direction)) for ref, direction in resolve_objectives(spec)]
        except ServesweepError:
            pass
    own = objective_of(data, index)
    return [] if own is None else [own]


def objective_of(data: SweepData, index: ResultIndex | None = None) -> tuple[MetricRef, str] | None:
    """The sweep's own objective as (full reference, ``max``/``min``).

    Reads ``SweepData.objective`` (the sweep file's ``objective`` as a dict): a full
    reference, or a bare metric completed with ``workload``/``concurrency``/``rate``
    (default: the first workload and its first level measured). Without an objective:
    the first load workload's first level's ``output_throughput``, maximised (or the
    first eval's ``pass_rate``). None when nothing was measured at all.
    """
    index = index or ResultIndex(data)
    from_spec = _spec_objective(data)
    if from_spec is not None:
        return from_spec
    objective: Mapping[str, Any] = data.objective or {}
    if objective:
        text = objective.get("maximize") or objective.get("minimize")
        if not isinstance(text, str):
            raise ConfigError("the sweep's objective names no metric", key="objective")
        direction = "max" if objective.get("maximize") else "min"
        ref = parse_metric_ref(text)
        if ref.workload is not None or ref.metric in TRIAL_METRICS:
            return ref, direction
        workloads = index.workloads()
        workload = objective.get("workload") or (workloads[0] if workloads else None)
        if workload is None:
            return None
        level: str | None = None
        if objective.get("concurrency") is not None:
            level = level_label(concurrency=int(objective["concurrency"]))
        elif objective.get("rate") is not None:
            level = level_label(rate=float(objective["rate"]))
        elif not index.is_eval(workload):
            levels = index.workload_levels(workload)
            level = levels[0] if levels else None
        return MetricRef(workload, level, ref.metric, text), direction
    for workload in index.workloads():
        if not index.is_eval(workload):
            levels = index.workload_levels(workload)
            return MetricRef.of(workload, levels[0], mc.OUTPUT_THROUGHPUT.name), "max"
    for workload in index.workloads():
        return MetricRef.of(workload, None, mc.PASS_RATE.name), "max"
    return None
