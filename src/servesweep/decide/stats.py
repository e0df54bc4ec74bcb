"""Views of a :class:`~servesweep.records.SweepData` that every report format shares.

One place decides how results are flattened (trial x workload x level x repeat), how
repeats are aggregated (mean with min/max/stdev), which params were swept, how many
GPUs a trial used and how much GPU time each phase cost. Renderers only format.
"""

from __future__ import annotations

import math
import statistics
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from servesweep.decide.acceptance import AcceptanceContext
from servesweep.decide.cost import level_cost
from servesweep.decide.intervals import DEFAULT_CONFIDENCE, Combined, Interval, combine
from servesweep.decide.level_intervals import INTERVAL_METRICS, eval_intervals, level_intervals
from servesweep.decide.numbers import format_number, format_stats
from servesweep.decide.resources import sweep_cost, trial_gpus
from servesweep.errors import ConfigError
from servesweep.metrics_catalog import ACCEPTANCE_LENGTH, DURATION_S
from servesweep.models import LevelResult, Outcome, parse_level
from servesweep.records import SweepData, TrialRecord
from servesweep.spec.load import load_sweep_text

__all__ = [
    "GPU_PHASES",
    "KEY_METRICS",
    "LevelStats",
    "MetricStats",
    "PhaseCost",
    "aggregate_levels",
    "aggregate_results",
    "config_label",
    "fixed_args",
    "format_number",
    "format_stats",
    "in_plan_count",
    "metric_names",
    "out_of_plan",
    "outcome_counts",
    "phase_costs",
    "printable",
    "result_intervals",
    "swept_params",
    "trial_gpu_count",
]

GPU_PHASES: tuple[str, ...] = ("stop", "release", "start", "load", "ready", "bench")
"""Phases whose duration is charged as GPU time (the GPUs are reserved for the sweep)."""

KEY_METRICS: tuple[str, ...] = (
    "output_throughput",
    "ttft_p99_ms",
    "tpot_median_ms",
    "ttft_median_ms",
    "itl_p99_ms",
    "e2e_median_ms",
    "request_throughput",
    "acceptance_length",
    "error_rate",
    "pass_rate",
)
"""Metrics shown in the terminal table when present, in this order."""


@dataclass(frozen=True)
class MetricStats:
    """One metric across the repeats of one workload level."""

    mean: float
    min: float
    max: float
    stdev: float | None
    """Sample standard deviation; None with a single repeat."""
    n: int
    lo: float | None = None
    """Lower bound of the mean's confidence interval (None: the metric has none)."""
    hi: float | None = None
    confidence: float | None = None
    """The confidence of ``lo..hi`` (0.95)."""
    within_se: float | None = None
    """Standard error of the mean from the repeats' own intervals (their requests)."""
    launches: int = 1
    """Separate launches of the server the values come from."""
    launch_sd: float | None = None
    """Standard deviation between the launches' means (None with one launch)."""
    repeat_sd: float | None = None
    """Standard deviation between repeats inside one launch (pooled; None without)."""

    @property
    def spread(self) -> float | None:
        """max - min across repeats: the run-to-run noise; None without repeats."""
        return None if self.n < 2 else self.max - self.min

    @property
    def interval(self) -> Interval | None:
        if self.lo is None or self.hi is None or self.confidence is None:
            return None
        return Interval(self.mean, self.lo, self.hi, self.confidence)

    @property
    def half_width(self) -> float | None:
        """Half the interval's width: the ``±`` of the tables."""
        return None if self.lo is None or self.hi is None else (self.hi - self.lo) / 2.0

    @classmethod
    def of(
        cls,
        values: Sequence[float],
        bounds: Sequence[tuple[float, float] | None] | None = None,
        *,
        launches: Sequence[int] | None = None,
        confidence: float = DEFAULT_CONFIDENCE,
    ) -> MetricStats:
        """The stats of ``values`` (one per repeat); with ``bounds`` (each repeat's own
        interval at ``confidence``, or None), the interval of their mean
        (:func:`servesweep.decide.intervals.combine`). With ``launches`` (the launch of each
        value), repeats are combined within each launch first, then the launches'
        means: the interval holds both the variation inside a launch and between
        launches."""
        if not values:
            raise ValueError("MetricStats.of needs at least one value")
        stdev = statistics.stdev(values) if len(values) > 1 else None
        which = list(launches) if launches is not None else [0] * len(values)
        groups: dict[int, list[int]] = {}
        for i, launch in enumerate(which):
            groups.setdefault(launch, []).append(i)
        means = [statistics.fmean(values[i] for i in idx) for idx in groups.values()]
        inside = [statistics.variance([values[i] for i in idx]) for idx in groups.values()
                  if len(idx) > 1]  # fmt: skip
        found = None
        if bounds is not None:
            found = _launch_interval(values, bounds, list(groups.values()), confidence)
        return cls(
            mean=statistics.fmean(values),
            min=min(values),
            max=max(values),
            stdev=stdev,
            n=len(values),
            lo=None if found is None else found.interval.lo,
            hi=None if found is None else found.interval.hi,
            confidence=None if found is None else confidence,
            within_se=None if found is None else found.within_se,
            launches=len(groups),
            launch_sd=statistics.stdev(means) if len(means) > 1 else None,
            repeat_sd=math.sqrt(statistics.fmean(inside)) if inside else None,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mean": finite(self.mean),
            "min": finite(self.min),
            "max": finite(self.max),
            "stdev": finite(self.stdev),
            "n": self.n,
        }
        if self.lo is not None:
            out.update(lo=finite(self.lo), hi=finite(self.hi), confidence=self.confidence)
        if self.launches > 1:
            out.update(
                launches=self.launches,
                launch_sd=finite(self.launch_sd),
                repeat_sd=finite(self.repeat_sd),
            )
        return out


def _launch_interval(
    values: Sequence[float],
    bounds: Sequence[tuple[float, float] | None],
    groups: Sequence[Sequence[int]],
    confidence: float,
) -> Combined | None:
    """Repeats combined within each launch, then the launches' means combined."""

    def part(i: int) -> tuple[float, float | None, float | None]:
        b = bounds[i]
        return (values[i], None, None) if b is None else (values[i], b[0], b[1])

    inner: list[tuple[float, float | None, float | None]] = []
    for idx in groups:
        found = combine([part(i) for i in idx], confidence=confidence, part_confidence=confidence)
        mean = statistics.fmean(values[i] for i in idx)
        inner.append((mean, None, None) if found is None else
                     (mean, found.interval.lo, found.interval.hi))  # fmt: skip
    if len(inner) == 1:
        return combine([part(i) for i in groups[0]], confidence=confidence,
                       part_confidence=confidence)  # fmt: skip
    return combine(inner, confidence=confidence, part_confidence=confidence)


@dataclass(frozen=True)
class LevelStats:
    """All repeats of one workload level of one trial."""

    trial_id: int
    workload: str
    level: str
    repeats: tuple[LevelResult, ...]
    metrics: Mapping[str, MetricStats]

    @property
    def unreliable(self) -> str | None:
        """Why the load generator could not time this level (the first repeat's
        reason, with how many repeats were so), or None when every repeat is reliable."""
        reasons = [r.unreliable for r in self.repeats if r.unreliable is not None]
        if not reasons:
            return None
        if len(self.repeats) > 1:
            return f"{reasons[0]} ({len(reasons)} of {len(self.repeats)} repeats)"
        return reasons[0]

    @property
    def acceptance(self) -> AcceptanceContext | None:
        """The dataset and mode the level's acceptance length was measured in (an
        untrusted repeat's when the repeats differ); None without an acceptance length
        or when the level did not record its dataset."""
        if ACCEPTANCE_LENGTH.name not in self.metrics:
            return None
        found = [AcceptanceContext.of_info(r.info) for r in self.repeats]
        known = [c for c in found if c is not None]
        untrusted = [c for c in known if not c.trusted]
        return next(iter(untrusted or known), None)

    @property
    def warnings(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for res in self.repeats:
            for warning in res.warnings:
                seen.setdefault(warning, None)
        return tuple(seen)

    @property
    def notes(self) -> tuple[str, ...]:
        """Where the load came from when not from the server's machine."""
        where = {
            str(r.info["load_generator"]) for r in self.repeats if r.info.get("load_generator")
        }
        return tuple(
            f"load generator on the {w}: latencies include the network" for w in sorted(where)
        )


def finite(value: float | None) -> float | None:
    """``value`` when it is a finite number, else None (JSON has no NaN/inf)."""
    if value is None or not math.isfinite(value):
        return None
    return value


def level_sort_key(level: str) -> tuple[int, float, str]:
    """Concurrency levels first, by size, then request rates, then anything else."""
    try:
        conc, rate = parse_level(level)
    except ValueError:
        return (2, 0.0, level)
    if conc is not None:
        return (0, float(conc), level)
    return (1, rate if rate is not None else 0.0, level)


def aggregate_levels(data: SweepData, trial_id: int) -> list[LevelStats]:
    """The trial's results grouped by (workload, level), repeats aggregated.

    Workloads keep their order of appearance; levels are sorted (c1, c8, r2...).
    With a price in the sweep file (``cost``), each load level has its cost figures
    too (:mod:`servesweep.decide.cost`).
    """
    return aggregate_results(trial_id, _priced(data, trial_id, data.results.get(trial_id, ())))


def _priced(data: SweepData, trial_id: int, results: Sequence[LevelResult]) -> list[LevelResult]:
    """``results`` with the cost metrics of :func:`servesweep.decide.cost.level_cost` added,
    when the sweep file gives a price."""
    cost = sweep_cost(data)
    trial = next((t for t in data.trials if t.id == trial_id), None)
    if cost is None or trial is None:
        return list(results)
    gpus = trial_gpus(data, trial)
    out: list[LevelResult] = []
    for res in results:
        own = result_intervals(res)
        values, bounds = level_cost(res.metrics, own, gpus, cost.gpu_hour)
        if values:
            res = replace(res, metrics={**res.metrics, **values}, intervals={**own, **bounds})
        out.append(res)
    return out


def aggregate_results(trial_id: int, results: Iterable[LevelResult]) -> list[LevelStats]:
    """``results`` (one trial's) grouped by (workload, level), repeats aggregated, as
    :func:`aggregate_levels` does for a trial of a sweep."""
    groups: dict[tuple[str, str], list[LevelResult]] = {}
    for res in results:
        groups.setdefault((res.workload, res.level), []).append(res)
    workload_order = {w: i for i, w in enumerate(dict.fromkeys(k[0] for k in groups))}
    out: list[LevelStats] = []
    for (workload, level), reps in sorted(
        groups.items(), key=lambda kv: (workload_order[kv[0][0]], level_sort_key(kv[0][1]))
    ):
        reps.sort(key=lambda r: (r.launch, r.repeat))
        values: dict[str, list[float]] = {}
        bounds: dict[str, list[tuple[float, float] | None]] = {}
        launches: dict[str, list[int]] = {}
        for res in reps:
            own = result_intervals(res)
            for name, value in res.metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    values.setdefault(name, []).append(float(value))
                    bounds.setdefault(name, []).append(own.get(name))
                    launches.setdefault(name, []).append(res.launch)
        metrics = {
            name: MetricStats.of(
                vals,
                bounds[name] if name in INTERVAL_METRICS else None,
                launches=launches[name],
            )
            for name, vals in values.items()
        }
        out.append(LevelStats(trial_id, workload, level, tuple(reps), metrics))
    return out


def result_intervals(res: LevelResult) -> Mapping[str, tuple[float, float]]:
    """A level's intervals at :data:`DEFAULT_CONFIDENCE`: as stored, or computed from
    its stored requests (a level stored before intervals existed; goodput has none
    then, the SLO not being kept with the level)."""
    if res.intervals and res.confidence in (None, DEFAULT_CONFIDENCE):
        return res.intervals
    cached = _COMPUTED.get(id(res))
    if cached is not None and cached[0] is res:
        return cached[1]
    found = _computed_intervals(res)
    if len(_COMPUTED) > 10_000:
        _COMPUTED.clear()
    _COMPUTED[id(res)] = (res, found)
    return found


_COMPUTED: dict[int, tuple[LevelResult, Mapping[str, tuple[float, float]]]] = {}
"""Intervals computed from stored requests, by result (every report view asks again)."""


def _computed_intervals(res: LevelResult) -> Mapping[str, tuple[float, float]]:
    if res.eval_results:
        return eval_intervals(res.eval_results)
    if res.samples:
        duration = res.metrics.get(DURATION_S.name, res.duration_s)
        acc = res.metrics.get(ACCEPTANCE_LENGTH.name)
        source = str(res.info.get("acceptance_source", ""))
        return level_intervals(
            res.samples,
            duration_s=float(duration),
            acceptance=None if acc is None else (float(acc), source),
        )
    return {}


def metric_names(levels: Iterable[LevelStats]) -> list[str]:
    """Every metric name seen, key metrics first, then the rest alphabetically."""
    seen: set[str] = set()
    for lvl in levels:
        seen.update(lvl.metrics)
    key = [m for m in KEY_METRICS if m in seen]
    return key + sorted(seen - set(key))


def swept_params(data: SweepData) -> list[str]:
    """Param names that take more than one value across the trials of the plan (all
    trials when none is in it; all params when every trial has the same ones), in
    order of first appearance."""
    trials = [t for t in data.trials if t.in_plan] or list(data.trials)
    names: dict[str, None] = {}
    for trial in trials:
        for name in trial.params:
            names.setdefault(name, None)
    varying = [n for n in names if len({_hashable(t.params.get(n)) for t in trials}) > 1]
    return varying or list(names)


def all_params(data: SweepData) -> list[str]:
    names: dict[str, None] = {}
    for trial in data.trials:
        for name in trial.params:
            names.setdefault(name, None)
    return list(names)


def _hashable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


def config_label(
    trial: TrialRecord,
    params: Sequence[str] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> str:
    """``#3 budget=12 topk=6``: the trial's number in its sweep and its (swept) params.
    A trial that sets none of ``params`` is labelled by what it does set, the same in
    every trial: its own params over ``fixed`` (the sweep's ``server.args``),
    ``#10 (fixed: max-num-seqs=16 max-model-len=2048)``; ``(defaults)`` only when there
    is nothing."""
    names = list(params) if params is not None else list(trial.params)
    bits = [f"{n}={format_value(trial.params.get(n))}" for n in names if n in trial.params]
    if bits:
        return f"#{trial.number} " + " ".join(bits)
    merged = {k.replace("_", "-"): v for k, v in (fixed or {}).items()}
    merged.update({k.replace("_", "-"): v for k, v in trial.params.items()})
    shown = [f"{n}={format_value(v)}" for n, v in merged.items()]
    return f"#{trial.number} " + (f"(fixed: {' '.join(shown)})" if shown else "(defaults)")


def fixed_args(data: SweepData) -> dict[str, Any]:
    """The sweep file's ``server.args`` (what every trial sets under its own params);
    empty when the stored file cannot be read by this version."""
    try:
        return dict(load_sweep_text(data.sweep.spec_text, data.sweep.spec_path).spec.server.args)
    except (ConfigError, ValueError):
        return {}


def printable(text: str) -> str:
    """Text safe for a terminal: control and format characters (ANSI escapes, OSC
    sequences, bidi overrides, carriage returns) are shown as ``\\xNN`` escapes
    instead of being sent to the terminal. Newlines and tabs are kept."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co", "Cn"):
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)


def format_value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format_number(value)
    return str(value)


def trial_gpu_count(data: SweepData, trial: TrialRecord) -> int | None:
    """How many GPUs the trial held (see :func:`servesweep.decide.resources.trial_gpus`)."""
    return trial_gpus(data, trial)


@dataclass(frozen=True)
class PhaseCost:
    """Time spent in one phase over the whole sweep."""

    phase: str
    seconds: float
    gpu_hours: float
    """seconds x GPUs of each trial / 3600; trials with an unknown GPU count count one GPU."""


def phase_costs(data: SweepData) -> tuple[list[PhaseCost], int]:
    """Wall seconds and GPU-hours per phase; also how many trials had an unknown GPU
    count (charged as one GPU each)."""
    seconds = dict.fromkeys(GPU_PHASES, 0.0)
    gpu_seconds = dict.fromkeys(GPU_PHASES, 0.0)
    unknown = 0
    for trial in data.trials:
        gpus = trial_gpu_count(data, trial)
        if gpus is None and trial.phase_seconds:
            unknown += 1
        for phase, secs in trial.phase_seconds.items():
            if phase not in seconds or not math.isfinite(secs):
                continue
            seconds[phase] += secs
            gpu_seconds[phase] += secs * (gpus or 1)
    costs = [PhaseCost(p, seconds[p], gpu_seconds[p] / 3600.0) for p in GPU_PHASES]
    return costs, unknown


def outcome_counts(data: SweepData) -> dict[str, int]:
    """Trials of the plan by outcome, every outcome listed (zero included); trials the
    sweep file no longer has are counted by :func:`out_of_plan`."""
    counts = {o.value: 0 for o in Outcome}
    for trial in data.trials:
        if trial.in_plan:
            counts[trial.outcome.value] += 1
    return counts


def in_plan_count(data: SweepData) -> int:
    """Trials of the sweep file's plan (what ``plan``, ``run`` and ``status`` count)."""
    return sum(1 for t in data.trials if t.in_plan)


def out_of_plan(data: SweepData) -> int:
    """Trials the sweep file no longer has (kept as history, marked ``not in plan``)."""
    return sum(1 for t in data.trials if not t.in_plan)
