"""The plan of a sweep: trials in run order, the workloads each trial runs, and
what each trial changes.

Each trial is one server config with all the workloads; the server restarts only
between trials, so the plan needs exactly one server start per trial. Trials keep
the expansion order (the grid's last key varies fastest), which keeps consecutive
trials close to each other.

A sampling search (``search.strategy`` other than ``grid``) has no list of trials
before it runs: its plan is a :class:`SearchOutline` (the space, its size, the
strategy, the trials cap and the budget).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servesweep.models import ServerConfig
from servesweep.spec.constraints import resolve_objectives, workload_levels
from servesweep.spec.expand import expand_configs, param_key, param_names, same_value
from servesweep.spec.schema import (
    CapacityWorkload,
    ConfirmSpec,
    EvalWorkload,
    SweepSpec,
    WorkloadSpec,
)
from servesweep.spec.schema_search import SearchBudget
from servesweep.spec.screening import ScreeningPlan, screening_plan
from servesweep.spec.space import build_space, describe_dimensions

__all__ = [
    "ESTIMATE_PHASES",
    "KnownTrial",
    "Plan",
    "PlanTrial",
    "PlanWorkload",
    "SearchOutline",
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
    launches: int = 1
    """Separate launches of the server it is measured in (the sweep's ``launches``)."""

    @property
    def is_eval(self) -> bool:
        return isinstance(self.spec, EvalWorkload)


@dataclass(frozen=True)
class SearchOutline:
    """What a sampling search will draw from, and how much it may spend."""

    strategy: str
    dimensions: tuple[tuple[str, str, str], ...]
    """(name, kind, values) of each dimension."""
    size: int | None
    """Configurations the dimensions span (None: a continuous range)."""
    allowed: int | None
    """Configurations ``exclude``/``when`` allow, points included (None: not counted,
    the space is continuous or too large)."""
    points: int
    trials: int | None
    budget: SearchBudget | None
    seed: int
    startup: int
    prune: bool
    objectives: tuple[str, ...]

    @property
    def max_trials(self) -> int | None:
        """Server starts at most (None: bounded by the budget only)."""
        bounds = [b for b in (self.trials, self.allowed) if b is not None]
        return min(bounds) if bounds else None


@dataclass(frozen=True)
class Plan:
    name: str
    trials: tuple[PlanTrial, ...]
    workloads: tuple[PlanWorkload, ...]
    restarts: int
    """Server starts the plan needs (one per trial; a search: at most this many, 0 when
    only its budget bounds it)."""
    params: tuple[str, ...]
    """The swept param names."""
    search: SearchOutline | None = None
    """A sampling search's outline (then ``trials`` is empty)."""
    confirm: ConfirmSpec | None = None
    """The confirm phase after the trials (None: none)."""
    screening: ScreeningPlan | None = None
    """The screening pass of each trial (None: none)."""

    @property
    def measurements(self) -> int:
        """Workload runs over the whole plan (levels x repeats; an eval counts once)."""
        per_trial = sum(max(len(w.levels), 1) * w.spec.repeats * w.launches for w in self.workloads)
        trials = len(self.trials) if self.search is None else self.search.max_trials or 0
        return per_trial * trials


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


def _outline(spec: SweepSpec) -> SearchOutline:
    space = build_space(spec.params)
    search = spec.search
    allowed = len(space.allowed()) if space.enumerable else None
    return SearchOutline(
        strategy=search.strategy,
        dimensions=tuple(describe_dimensions(space)),
        size=space.size,
        allowed=allowed,
        points=len(space.points),
        trials=search.trials,
        budget=search.budget,
        seed=search.seed,
        startup=search.startup,
        prune=search.pruning,
        objectives=tuple(f"{d} {ref}" for ref, d in resolve_objectives(spec)),
    )


def build_plan(spec: SweepSpec) -> Plan:
    """Expand the sweep into its plan (raises ConfigError for an invalid params section).
    A sampling search gets its outline instead of a list of trials."""
    workloads = tuple(
        PlanWorkload(w.name, workload_levels(w), w, spec.launches_of(w)) for w in spec.workloads
    )
    if spec.search.samples:
        outline = _outline(spec)
        return Plan(
            name=spec.name,
            trials=(),
            workloads=workloads,
            restarts=(outline.max_trials or 0) * spec.max_launches,
            params=param_names(spec.params),
            search=outline,
            confirm=spec.confirm_phase,
            screening=screening_plan(spec),
        )
    trials: list[PlanTrial] = []
    previous: Mapping[str, Any] | None = None
    for seq, config in enumerate(expand_configs(spec), start=1):
        trials.append(PlanTrial(seq=seq, config=config, changes=_changes(previous, config.params)))
        previous = config.params
    return Plan(
        name=spec.name,
        trials=tuple(trials),
        workloads=workloads,
        restarts=len(trials) * spec.max_launches,
        params=param_names(spec.params),
        confirm=spec.confirm_phase,
        screening=screening_plan(spec),
    )


def estimate_duration(plan: Plan, history: Mapping[str, float]) -> float | None:
    """Seconds the plan should take, from mean seconds per phase per trial measured
    in earlier sweeps of the same file; None without history. A search: at most its
    trials (capped by its time budget); None when only GPU-hours bound it."""
    known = [max(float(history[p]), 0.0) for p in ESTIMATE_PHASES if p in history]
    if not known:
        return None
    if plan.search is None:
        return sum(known) * len(plan.trials)
    budget = plan.search.budget
    limit = budget.time if budget is not None else None
    if plan.search.max_trials:
        total = sum(known) * plan.search.max_trials
        return total if limit is None else min(total, limit)
    return limit


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
    if isinstance(spec, CapacityWorkload):
        cap = spec.capacity
        slo = ", ".join(f"{k} {v:g}" for k, v in cap.slo.items())
        size = f"{spec.requests} requests" if spec.requests else format_duration(spec.duration or 0)
        return (
            f"capacity: the highest {cap.vary} in {cap.low:g}..{cap.high:g} where "
            f"{cap.quantile:.0%} of requests meet {slo} (within {cap.tolerance:.0%}, at most "
            f"{cap.max_levels} levels of {size})"
        )
    if isinstance(spec, EvalWorkload):
        limit = f", first {spec.eval.limit} tasks" if spec.eval.limit else ""
        return f"eval {spec.eval.suite}, {spec.eval.samples} sample(s) per task{limit}"
    size = f"{spec.requests} requests" if spec.requests else format_duration(spec.duration or 0)
    kind = "concurrency" if not spec.rate else f"rate ({spec.arrival})"
    text = f"{spec.dataset}, {kind} levels {', '.join(workload.levels)}, {size} per level"
    text += f", max_tokens {spec.max_tokens}"
    if spec.repeats > 1:
        text += f", {spec.repeats} repeats"
    if workload.launches > 1:
        text += f", in {workload.launches} launches"
    return text


def _format_budget(budget: SearchBudget | None) -> str:
    if budget is None:
        return "none"
    parts = []
    if budget.time is not None:
        parts.append(f"{format_duration(budget.time)} of wall time")
    if budget.gpu_hours is not None:
        parts.append(f"{budget.gpu_hours:g} GPU-hours")
    return " or ".join(parts) + (", whichever comes first" if len(parts) > 1 else "")


def _format_search(plan: Plan, outline: SearchOutline) -> list[str]:
    size = f"{outline.size:,}" if outline.size is not None else "continuous"
    if outline.allowed is not None:
        size += f" configurations, {outline.allowed:,} allowed by exclude/when"
    if outline.points:
        size += f" (points included: {outline.points})"
    cap = outline.max_trials
    strategy = outline.strategy
    if outline.startup:
        strategy += f" ({outline.startup} random configurations first)"
    lines = [
        f"sweep {plan.name}: a {outline.strategy} search, "
        + (f"at most {cap} trials" if cap else "trials bounded by the budget")
        + f" x {len(plan.workloads)} workload{'s' if len(plan.workloads) != 1 else ''}",
        f"strategy: {strategy}, seed {outline.seed}",
        f"objective{'s' if len(outline.objectives) > 1 else ''}: " + "; ".join(outline.objectives),
        f"trials: {outline.trials if outline.trials is not None else 'no cap'}; "
        f"budget: {_format_budget(outline.budget)}",
        f"early stop (prune): {'on' if outline.prune else 'off'}",
        "",
        f"search space: {size}",
    ]
    width = max((len(name) for name, _, _ in outline.dimensions), default=0)
    for name, kind, values in outline.dimensions:
        lines.append(f"  {name.ljust(width)}  {kind:<11}  {values}")
    if not outline.dimensions:
        lines.append("  (no dimensions: the points and the server defaults)")
    return lines


@dataclass(frozen=True)
class KnownTrial:
    """What the results database already holds of a planned configuration."""

    number: int
    """The trial's number, as ``run``, ``status`` and the reports show it."""
    outcome: str
    """``ok``, ``failed start_crash``, ``pending``...: its stored outcome."""
    done: bool
    """Final (``run`` does not run it again without ``--retry-failed``)."""


def format_plan(
    plan: Plan,
    estimate_s: float | None = None,
    history_note: str | None = None,
    *,
    known: Mapping[str, KnownTrial] | None = None,
    next_number: int = 1,
) -> str:
    """The plan as plain text for ``servesweep plan``. ``known`` (by fingerprint): the
    trials the results database already has; every other trial gets the number ``run``
    will give it, from ``next_number`` on in plan order."""
    if plan.search is not None:
        lines = _format_search(plan, plan.search)
        return "\n".join(lines + _format_tail(plan, estimate_s, history_note))
    trials = len(plan.trials)
    known = known or {}
    numbers: list[int] = []
    upcoming = next_number
    for trial in plan.trials:
        if trial.fingerprint in known:
            numbers.append(known[trial.fingerprint].number)
        else:
            numbers.append(upcoming)
            upcoming += 1
    done = sum(1 for t in plan.trials if t.fingerprint in known and known[t.fingerprint].done)
    progress = f"; {done} already done, {trials - done} to run" if known else ""
    lines = [
        f"sweep {plan.name}: {trials} trial{'s' if trials != 1 else ''} x "
        f"{len(plan.workloads)} workload{'s' if len(plan.workloads) != 1 else ''} "
        f"= {plan.measurements} measurements{progress}",
        f"params swept: {', '.join(plan.params) if plan.params else 'none (server defaults)'}",
        "",
        "trials:",
    ]
    width = max((len(t.config.label()) for t in plan.trials), default=0)
    states = [
        known[t.fingerprint].outcome if t.fingerprint in known else "new" for t in plan.trials
    ]
    state_width = max((len(x) for x in states), default=0) if known else 0
    state_head = f"{'state'.ljust(state_width)}  " if known else ""
    lines.append(f"  {'#':>3}  {state_head}{'fingerprint':<12}  {'params'.ljust(width)}  | changes")
    previous: PlanTrial | None = None
    for trial, number, state in zip(plan.trials, numbers, states, strict=True):
        label = trial.config.label().ljust(width)
        change = _describe_changes(trial, previous)
        shown = f"{state.ljust(state_width)}  " if known else ""
        lines.append(f"  {number:>3}  {shown}{trial.fingerprint}  {label}  | {change}")
        previous = trial
    return "\n".join(lines + _format_tail(plan, estimate_s, history_note))


def _describe_confirm(confirm: ConfirmSpec) -> str:
    """The confirm phase in one line (docs/sweep-file.md, ``confirm``)."""
    limits = []
    if confirm.budget is None or confirm.budget.launches is not None:
        limits.append(f"at most {confirm.max_launches} more server starts")
    if confirm.max_seconds is not None:
        limits.append(f"at most {format_duration(confirm.max_seconds)}")
    return (
        f"then confirm: the leaders still tied (up to {confirm.top}) relaunched "
        f"{confirm.launches} time{'s' if confirm.launches != 1 else ''} each per round, "
        f"{' and '.join(limits)}"
    )


def _describe_screening(plan: ScreeningPlan, workloads: Sequence[PlanWorkload]) -> str:
    """The screening pass in one line (docs/sweep-file.md, ``screening``)."""
    own = {w.name: w.spec for w in workloads}
    parts = []
    for short in plan.workloads:
        levels = ", ".join(f"{short.name}.{lvl}" for lvl in workload_levels(short))
        full = own[short.name]
        if short.requests is not None:
            of = f" (of {full.requests})" if full.requests is not None else ""
            parts.append(f"{levels} with {short.requests} requests{of}")
        else:
            parts.append(f"{levels} for {format_duration(short.duration or 0.0)}")
    return (
        f"first screening: {'; '.join(parts)}, one repeat; full measurement only for the "
        f"configurations that can still win (beyond both intervals and the "
        f"{plan.threshold:.0%} threshold)"
    )


def _format_tail(plan: Plan, estimate_s: float | None, history_note: str | None) -> list[str]:
    lines = ["", "workloads (every trial, no restart between them):"]
    name_width = max((len(w.name) for w in plan.workloads), default=0)
    for workload in plan.workloads:
        lines.append(f"  {workload.name.ljust(name_width)}  {_describe_workload(workload)}")
    if plan.search is None:
        lines += ["", f"server starts: {plan.restarts}"]
    else:
        starts = f"at most {plan.restarts}" if plan.restarts else "as the budget allows"
        lines += ["", f"server starts: {starts}"]
    if plan.screening is not None:
        lines.append(_describe_screening(plan.screening, plan.workloads))
    if plan.confirm is not None:
        lines.append(_describe_confirm(plan.confirm))
    note = f" ({history_note})" if history_note else ""
    prefix = "estimated duration" if plan.search is None else "estimated duration, at most"
    if estimate_s is not None:
        lines.append(f"{prefix}: {format_duration(estimate_s)}{note}")
    else:
        lines.append(f"{prefix}: unknown{note or ' (no earlier sweep of this file)'}")
    return lines
