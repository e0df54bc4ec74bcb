"""What the predictor is given, built once for every caller (``servesweep plan``, the
sweep's performance gate): the :class:`Setting` of a sweep file and the
:class:`Measured` trials of stored sweeps.

Pure functions over the sweep file and stored records; the callers read the store.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from servesweep.decide.perf.records import Measured, Setting
from servesweep.decide.stats import MetricStats, aggregate_results
from servesweep.models import LevelResult, Outcome
from servesweep.records import TrialRecord
from servesweep.spec.constraints import resolve_objectives, validate_constraints
from servesweep.spec.schema import SweepSpec
from servesweep.spec.space import build_space

__all__ = ["History", "level_rates", "measured_of", "perf_setting"]

History = Sequence[tuple[TrialRecord, Sequence[LevelResult]]]
"""Stored trials with their level results."""

_LEVEL = re.compile(r"^c(\d+)$")


def _norm(name: str) -> str:
    return name.replace("-", "_")


def _configs(spec: SweepSpec) -> list[Mapping[str, Any]]:
    """The params of the sweep's configurations (none where the space is not enumerable)."""
    space = build_space(spec.params)
    return [c.params for c in space.allowed()] if space.enumerable else []


def _follows(configs: Sequence[Mapping[str, Any]], draft: str) -> frozenset[str]:
    """The swept params set by the draft length ``draft``: of two values or more, each
    value with one draft length and each draft length (but none: no speculation) with
    one value, across the sweep's configurations (``Setting.follows``)."""
    drafts = {repr(c.get(draft)) for c in configs if c.get(draft)}
    out = set()
    for name in {k for c in configs for k in c} - {draft}:
        pairs = {(repr(c.get(draft)), repr(c.get(name))) for c in configs if c.get(draft)}
        values = {v for _, v in pairs}
        if len(values) >= 2 and len(pairs) == len(drafts) == len(values):
            out.add(name)
    return frozenset(out)


def _flat(args: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested arguments as dotted names (``speculative_config.model``), as params name them."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        name = f"{prefix}{_norm(str(key))}"
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def perf_setting(
    spec: SweepSpec,
    draft: str | None = None,
    speculative: Sequence[str] = (),
    draft_models: Sequence[str] = (),
) -> Setting:
    """What the predictor is told: the objectives' and the constraints' metrics, the
    engine's draft-length param ``draft`` when the sweep varies it, the concurrency of each
    closed-loop level, and that acceptance depends on nothing but the draft length and
    the engine's other ``speculative`` params (``EnginePreset.spec_params``: the draft
    model, its minimum probability, ngram lookup sizes), which change nothing else;
    which of the swept params or the server's own args name a draft model
    (``draft_models``, ``EnginePreset.draft_model_params``), and whether the server runs
    on CPUs; the
    stated noise of one launch's figure is the sweep's ``decision.launch_sd``, the prior
    of what :func:`~servesweep.decide.perf.predict` learns from the sweep's relaunches
    (where launches vary more, a machine shared with other work, the predictions widen
    with it)."""
    metrics = [ref.key for ref, _ in resolve_objectives(spec)]
    metrics += [c.ref.key for c in validate_constraints(spec) if c.ref.key not in metrics]
    configs = _configs(spec)
    swept = {_norm(k): k for c in configs for k in c}
    draft_param = swept.get(_norm(draft)) if draft else None
    concurrency: dict[str, float] = {}
    for metric in metrics:
        workload, _, rest = metric.partition(".")
        level = rest.partition(".")[0]
        match = _LEVEL.match(level)
        if match:
            concurrency[f"{workload}.{level}"] = float(match.group(1))
    drafting = {_norm(s) for s in (*speculative, *draft_models)}  # a draft model drafts
    follows = _follows(configs, draft_param) if draft_param else frozenset()
    drafter = frozenset(
        v for k, v in swept.items() if k in drafting and v != draft_param and v not in follows
    )
    others = frozenset(
        k for k in swept.values() if k != draft_param and k not in drafter and k not in follows
    )
    models = {_norm(m) for m in draft_models}
    fixed = _flat(spec.server.args)
    return Setting(
        metrics=tuple(metrics),
        draft_param=draft_param,
        concurrency=concurrency,
        invariant={"acceptance_length": others} if draft_param else {},
        drafter=drafter if draft_param else frozenset(),
        follows=follows,
        draft_models=frozenset(v for k, v in swept.items() if k in models),
        model_drafts=any(bool(v) for k, v in fixed.items() if k in models),
        cpu=spec.server.gpu_backend == "none",
        # what launches of one configuration vary, until relaunches measure it: the
        # prior decisions also start from
        noise=float(spec.decision.launch_sd) or Setting.noise,
    )


def level_rates(info: Mapping[str, Any]) -> tuple[float, ...]:
    """A level's cumulative acceptance rate per draft position, from the engine's
    counters stored in its info (``spec_decode.accepted_per_position`` over
    ``spec_decode.drafts``, as ``bench.specdecode`` stores them); empty when the
    engine did not count them."""
    detail = info.get("spec_decode")
    if not isinstance(detail, Mapping):
        return ()
    per_pos = detail.get("accepted_per_position")
    drafts = detail.get("drafts")
    if not isinstance(per_pos, Sequence) or not isinstance(drafts, int | float) or drafts <= 0:
        return ()
    out: list[float] = []
    for value in per_pos:
        if not isinstance(value, int | float):
            return ()
        out.append(min(max(float(value) / float(drafts), 0.0), 1.0))
    return tuple(out)


def _stats(trial: TrialRecord, results: Sequence[LevelResult]) -> dict[str, MetricStats]:
    """Each level metric's stats over its repeats and launches, as ``best`` reads them."""
    return {
        f"{level.workload}.{level.level}.{name}": stats
        for level in aggregate_results(trial.id, results)
        for name, stats in level.metrics.items()
        if math.isfinite(stats.mean)
    }


def measured_of(history: History) -> list[Measured]:
    """The trials that measured levels (ok or stopped early): each level's metrics,
    the mean over its repeats, its stats over repeats and launches (the interval, the
    launches' spread), and its per-position acceptance (:func:`level_rates`)."""
    out = []
    for trial, results in history:
        if trial.outcome not in (Outcome.OK, Outcome.PRUNED):
            continue
        values: dict[str, list[float]] = {}
        rates: dict[str, tuple[float, ...]] = {}
        for result in results:
            for name, value in result.metrics.items():
                if isinstance(value, int | float) and value == value:
                    key = f"{result.workload}.{result.level}.{name}"
                    values.setdefault(key, []).append(float(value))
            rate = level_rates(result.info)
            if len(rate) > len(rates.get(f"{result.workload}.{result.level}", ())):
                rates[f"{result.workload}.{result.level}"] = rate
        if values:
            metrics = {k: statistics.fmean(v) for k, v in values.items()}
            out.append(Measured(dict(trial.params), metrics, rates, _stats(trial, results)))
    return out
