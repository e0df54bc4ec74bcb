"""The plan of a sweep: trials in run order, the workloads each trial runs, and
what each trial changes.

Each trial is one server config with all the workloads; the server restarts only
between trials, so the plan needs exactly one server start per trial. Trials keep
the expansion order (the grid's last key varies fastest), which keeps consecutive
trials close to each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servesweep.models import ServerConfig
from servesweep.spec.constraints import workload_levels
from servesweep.spec.expand import expand_configs, param_key, param_names, same_value
from servesweep.spec.schema import SweepSpec, WorkloadSpec

__all__ = [
    "ESTIMATE_PHASES",
    "Plan",
    "PlanTrial",
    "PlanWorkload",
    "build_plan",
    "estimate_duration",
    "format_duration",
    "format_plan",
]

ESTIMATE_PHASES = ("stop", "release", "start", "load", "ready", "bench")
"""The phases whose measured mean seconds an estimate adds up, per trial."""


@dataclass(frozen=True)
class PlanTrial:
    seq: int
    """1-based position in run order."""
    config: ServerConfig
    changes: tuple[str, ...]
    """Params whose value differs from the previous trial (all params for the first)."""

    @property
    def params(self) -> Mapping[str, Any]:
        return self.config.params

    @property
    def fingerprint(self) -> str:
        return self.config.fingerprint


@dataclass(frozen=True)
class PlanWorkload:
    name: str
    levels: tuple[str, ...]
    """Level labels in run order (``c1``, ``c8``, ``r2.5``); empty for an eval."""
    spec: WorkloadSpec

    @property
    def is_eval(self) -> bool:
        return self.spec.is_eval


@dataclass(frozen=True)
class Plan:
    name: str
    trials: tuple[PlanTrial, ...]
    workloads: tuple[PlanWorkload, ...]
    restarts: int
    """Server starts the plan needs (one per trial)."""
    params: tuple[str, ...]
    """The swept param names."""

    @property
    def measurements(self) -> int:
        """Workload runs over the whole plan (levels x repeats; an eval counts once)."""
        per_trial = sum(max(len(w.levels), 1) * w.spec.repeats for w in self.workloads)
        return per_trial * len(self.trials)


def _changes(previous: Mapping[str, Any] | None, current: Mapping[str, Any]) -> tuple[str, ...]:
    if previous is None:
        return tuple(current)
    before = {param_key(k): (k, v) for k, v in previous.items()}
    after = {param_key(k): (k, v) for k, v in current.items()}
    changed = [
        name
        for norm, (name, value) in after.items()
        if norm not in before or not same_value(before[norm][1], value)
    ]
    changed += [name for norm, (name, _) in before.items() if norm not in after]
    return tuple(changed)


def build_plan(spec: SweepSpec) -> Plan:
    """Expand the sweep into its plan (raises ConfigError for an invalid params section)."""
    trials: list[PlanTrial] = []
    previous: Mapping[str, Any] | None = None
    for seq, config in enumerate(expand_configs(spec), start=1):
        trials.append(PlanTrial(seq=seq, config=config, changes=_changes(previous, config.params)))
        previous = config.params
    workloads = tuple(PlanWorkload(w.name, workload_levels(w), w) for w in spec.workloads)
    return Plan(
        name=spec.name,
        trials=tuple(trials),
        workloads=workloads,
        restarts=len(trials),
        params=param_names(spec.params),
    )


def estimate_duration(plan: Plan, history: Mapping[str, float]) -> float | None:
    """Seconds the plan should take, from mean seconds per phase per trial measured
    in earlier sweeps of the same file; None without history."""
    known = [max(float(history[p]), 0.0) for p in ESTIMATE_PHASES if p in history]
    if not known:
        return None
    return sum(known) * len(plan.trials)


def format_duration(seconds: float) -> str:
    """``42s``, ``12m 5s``, ``3h 07m``."""
    total = round(seconds)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m {total % 60}s"
    return f"{total // 3600}h {total % 3600 // 60:02d}m"


def _value(params: Mapping[str, Any], name: str) -> str:
    norm = {param_key(k): v for k, v in params.items()}
    return repr(norm[param_key(name)]) if param_key(name) in norm else "(unset)"


def _describe_changes(trial: PlanTrial, previous: PlanTrial | None) -> str:
    if previous is None:
        return "first start"
    if not trial.changes:
        return "restart"
    parts = [
        f"{name} {_value(previous.params, name)} -> {_value(trial.params, name)}"
        for name in trial.changes
    ]
    return ", ".join(parts)


def _describe_workload(workload: PlanWorkload) -> str:
    spec = workload.spec
    if spec.eval is not None:
        limit = f", first {spec.eval.limit} tasks" if spec.eval.limit else ""
        return f"eval {spec.eval.suite}, {spec.eval.samples} sample(s) per task{limit}"
    size = f"{spec.requests} requests" if spec.requests else format_duration(spec.duration or 0)
    kind = "concurrency" if not spec.rate else f"rate ({spec.arrival})"
    text = f"{spec.dataset}, {kind} levels {', '.join(workload.levels)}, {size} per level"
    text += f", max_tokens {spec.max_tokens}"
    if spec.repeats > 1:
        text += f", {spec.repeats} repeats"
    return text


def format_plan(
    plan: Plan, estimate_s: float | None = None, history_note: str | None = None
) -> str:
    """The plan as plain text for ``servesweep plan``."""
    trials = len(plan.trials)
    lines = [
        f"sweep {plan.name}: {trials} trial{'s' if trials != 1 else ''} x "
        f"{len(plan.workloads)} workload{'s' if len(plan.workloads) != 1 else ''} "
        f"= {plan.measurements} measurements",
        f"params swept: {', '.join(plan.params) if plan.params else 'none (server defaults)'}",
        "",
        "trials:",
    ]
    width = max((len(t.config.label()) for t in plan.trials), default=0)
    lines.append(f"  {'#':>3}  {'fingerprint':<12}  {'params'.ljust(width)}  | changes")
    previous: PlanTrial | None = None
    for trial in plan.trials:
        label = trial.config.label().ljust(width)
        change = _describe_changes(trial, previous)
        lines.append(f"  {trial.seq:>3}  {trial.fingerprint}  {label}  | {change}")
        previous = trial
    lines += ["", "workloads (every trial, no restart between them):"]
    name_width = max((len(w.name) for w in plan.workloads), default=0)
    for workload in plan.workloads:
        lines.append(f"  {workload.name.ljust(name_width)}  {_describe_workload(workload)}")
    lines += ["", f"server starts: {plan.restarts}"]
    note = f" ({history_note})" if history_note else ""
    if estimate_s is not None:
        lines.append(f"estimated duration: {format_duration(estimate_s)}{note}")
    else:
        lines.append(f"estimated duration: unknown{note or ' (no earlier sweep of this file)'}")
    return "\n".join(lines)
