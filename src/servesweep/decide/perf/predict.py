"""Every configuration's metrics predicted from the trials measured so far (see the
package's docstring for the reasoning).

The noise of one launch's figure is learned per metric from the sweep's own
relaunches by the rule ``best`` decides with
(:func:`~servesweep.decide.uncertainty.learned_launch_sd`, the stated
:attr:`Setting.noise` its prior), and every interval holds it: a measured
configuration's (and one a knob cannot change) is two of the standard errors a
decision gives its mean (:func:`~servesweep.decide.uncertainty.decision_se`: its own
interval, and at least what launches vary); a model's throughput or any metric of the
empirical model is at least two of that noise either side, as a launch of it will vary
by that much however well the model fits. (The acceptance length of the speculative
model keeps its own bounds: acceptance depends on the target, the drafter and the
text, not on the launch, and the engine's counters give it exactly.)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from servesweep.decide.perf.empirical import Features, fit_predict
from servesweep.decide.perf.records import Measured, Prediction, Setting, Trust
from servesweep.decide.perf.speculative import (
    AcceptanceFit,
    StepTime,
    fit_acceptance,
    fit_step_cost,
    predict_throughput,
)
from servesweep.decide.stats import MetricStats
from servesweep.decide.uncertainty import decision_se, learned_launch_sd

__all__ = ["learned_noise", "predict", "verify"]


def _split(metric: str) -> tuple[str, str]:
    """``chat.c8.output_throughput`` -> (``chat.c8``, ``output_throughput``)."""
    level, _, name = metric.rpartition(".")
    return level, name


def _same(a: Mapping[str, Any], b: Mapping[str, Any], ignore: frozenset[str]) -> bool:
    keys = (set(a) | set(b)) - ignore
    return all(a.get(k) == b.get(k) for k in keys)


def _draft(setting: Setting, params: Mapping[str, Any]) -> int:
    if setting.draft_param is None:
        return 0
    value = params.get(setting.draft_param, 0)
    return int(value) if isinstance(value, int | float) else 0


def _model(setting: Setting, params: Mapping[str, Any]) -> bool:
    """Whether ``params`` draft with a model (:attr:`Setting.draft_models`,
    :attr:`Setting.model_drafts`), not by lookup; on CPUs (:attr:`Setting.cpu`) it costs
    per drafted token."""
    named = [params[k] for k in setting.draft_models if k in params]
    return any(bool(v) for v in named) if named else setting.model_drafts


def _widened(p: Prediction, factor: float) -> Prediction:
    if p.value is None or p.low is None or p.high is None or factor == 1.0:
        return p
    low = p.value - (p.value - p.low) * factor
    high = p.value + (p.high - p.value) * factor
    return Prediction(p.metric, p.value, max(low, 0.0) if p.low >= 0 else low, high, p.basis)


Point = tuple[Mapping[str, Any], float, MetricStats | None]
"""A measured configuration's params, its value of a metric and the value's stats."""


def _measured(metric: str, points: Sequence[Point], noise: float, basis: str) -> Prediction:
    """The mean of ``points`` (one configuration's measurements) with two of the standard
    errors a decision gives it: each measurement's :func:`decision_se` (its interval,
    and at least what launches vary, ``noise`` relative), or ``noise`` of its value."""
    value = statistics.fmean(v for _, v, _ in points)
    variance = 0.0
    for _, v, stats in points:
        se = decision_se(stats, noise) if stats is not None else None
        variance += (noise * v) ** 2 if se is None else se * se
    half = 2 * math.sqrt(variance) / len(points)
    return Prediction(metric, value, value - half, value + half, basis)


def _floored(p: Prediction, noise: float) -> Prediction:
    """``p`` with its interval at least ``2 x noise`` of its value either side: a launch
    of the configuration varies by that much, however well a model fits."""
    if p.value is None or p.low is None or p.high is None:
        return p
    half = 2 * noise * abs(p.value)
    return Prediction(
        p.metric, p.value, min(p.low, p.value - half), max(p.high, p.value + half), p.basis
    )


def learned_noise(setting: Setting, trials: Sequence[Measured]) -> Callable[[str], float]:
    """Per metric, the relative noise of one launch's figure: learned from ``trials``
    measured in several launches (:func:`learned_launch_sd`, ``setting.noise`` its
    prior); ``setting.noise`` while none was relaunched."""
    cache: dict[str, float] = {}

    def noise(metric: str) -> float:
        if metric not in cache:
            stats = [t.stats[metric] for t in trials if metric in t.stats]
            cache[metric] = learned_launch_sd(stats, setting.noise)
        return cache[metric]

    return noise


def _shared(setting: Setting) -> frozenset[str]:
    """The params the acceptance curve does not depend on (with the draft length and
    those it sets)."""
    knob = {setting.draft_param} if setting.draft_param else set()
    return setting.invariant.get(setting.acceptance, frozenset()) | knob | setting.follows


def _curve_key(setting: Setting, workload: str, params: Mapping[str, Any]) -> str:
    """Which acceptance curve a configuration has: its workload and its values of the
    params the curve may depend on (the drafter's: its model, minimum probability...)."""
    shared = _shared(setting)
    return repr((workload, sorted((k, repr(v)) for k, v in params.items() if k not in shared)))


def _acceptance(
    setting: Setting,
    workload: str,
    params: Mapping[str, Any],
    trials: Sequence[Measured],
    noise: Callable[[str], float],
) -> AcceptanceFit | None:
    """The acceptance curve of the workload and of ``params``' drafter: it does not
    depend on the params known not to change it (the batch, memory settings:
    ``Setting.invariant``), so the levels of every trial of the workload that agrees
    with ``params`` on the others tell; a drafter of other settings (another minimum
    probability, another ngram lookup) has a curve of its own."""
    shared = _shared(setting)
    lengths: dict[int, list[float]] = {}
    rates: tuple[float, ...] = ()
    noises = [setting.noise]
    for t in trials:
        if not _same(t.params, params, shared):
            continue
        for lv, rate in t.rates.items():
            if lv.split(".")[0] == workload and len(rate) > len(rates):
                rates = rate
        for m, v in t.metrics.items():
            lv, n = _split(m)
            if n == setting.acceptance and lv.split(".")[0] == workload:
                lengths.setdefault(_draft(setting, t.params), []).append(v)
                noises.append(noise(m))
    return fit_acceptance({k: statistics.fmean(v) for k, v in lengths.items()}, rates, max(noises))


def _speculative(
    setting: Setting,
    metric: str,
    params: Mapping[str, Any],
    trials: Sequence[Measured],
    acceptances: dict[str, AcceptanceFit | None],
    noise: Callable[[str], float],
) -> Prediction | None:
    """Acceptance length from the acceptance curve; throughput from it and the step
    cost, when the configuration's other knobs were measured at two draft lengths or
    more (counting no speculation)."""
    level, name = _split(metric)
    knob = setting.draft_param
    if knob is None or name not in (setting.throughput, setting.acceptance):
        return None
    draft = _draft(setting, params)
    workload = level.split(".")[0]
    key = _curve_key(setting, workload, params)
    if key not in acceptances:
        acceptances[key] = _acceptance(setting, workload, params, trials, noise)
    acceptance = acceptances[key]
    if acceptance is None:
        return None
    if name == setting.acceptance:
        if draft <= 0:
            return None  # no speculation: no acceptance length
        value, low, high = acceptance.length(draft)
        return Prediction(metric, value, low, high, "speculative")
    if level not in setting.concurrency:
        return None
    plain: list[StepTime] = []  # step times read from throughput
    points: list[StepTime] = []  # from TPOT, the first token's time apart
    firsts: list[StepTime] = []
    tokens: list[float] = []
    for t in trials:
        k = _draft(setting, t.params)
        # no speculation: the drafter's params do nothing, so it is every drafter's k = 0
        ignore = {knob} | setting.follows | (setting.drafter if k <= 0 else set())
        if not _same(t.params, params, frozenset(ignore)):
            continue
        for m, v in t.metrics.items():
            lv, n = _split(m)
            if n != setting.throughput or lv not in setting.concurrency or v <= 0:
                continue
            c = setting.concurrency[lv]
            length = t.metrics.get(f"{lv}.{setting.acceptance}", acceptance.length(k)[0])
            plain.append(StepTime(c, k, c * length / v))
            tpot, ttft, answer = (
                t.metrics.get(f"{lv}.{name}", 0.0)
                for name in (setting.tpot, setting.ttft, setting.tokens)
            )
            if tpot > 0 and ttft > 0 and answer > 1:
                # a step emits E[L] tokens, one per TPOT; the first token's time (the
                # prompt's prefill, the draft's too) is a cost of its own
                points.append(StepTime(c, k, tpot / 1000 * length))
                firsts.append(StepTime(c, k, ttft / 1000))
                if lv == level:
                    tokens.append(answer)
    # the request model only where every level gave its times: a step time read from
    # throughput holds the first token's time as well, so the two do not mix
    split = bool(plain) and len(points) == len(plain) and bool(tokens)
    if not split:
        points = plain
    model = _model(setting, params)
    cost = fit_step_cost(points, noise(metric), setting.cpu and model, model)
    if cost is None:
        return None
    first = fit_step_cost(firsts, noise(metric)) if split else None
    got = predict_throughput(
        acceptance,
        cost,
        setting.concurrency[level],
        draft,
        first,
        statistics.fmean(tokens) if split else None,
    )
    if got is None:
        return None
    value, low, high = got
    return _floored(Prediction(metric, value, low, high, "speculative"), noise(metric))


def predict(
    setting: Setting,
    configs: Sequence[Mapping[str, Any]],
    trials: Sequence[Measured],
    earlier: Sequence[Measured] = (),
    trust: Trust | None = None,
) -> list[dict[str, Prediction]]:
    """Per configuration, per metric of ``setting``, the prediction from this sweep's
    ``trials`` and ``earlier`` sweeps' (same engine, model and GPUs: a warm start); the
    noise of each metric learned from this sweep's relaunches (:func:`learned_noise`),
    as ``best`` learns it."""
    trust = trust or Trust()
    known = [*trials, *earlier]
    noise = learned_noise(setting, trials)
    acceptances: dict[str, AcceptanceFit | None] = {}
    features = Features.of([*configs, *(t.params for t in known)], setting.draft_param)
    out: list[dict[str, Prediction]] = [{} for _ in configs]
    for metric in setting.metrics:
        _, name = _split(metric)
        sd = noise(metric)
        data: list[Point] = [
            (t.params, t.metrics[metric], t.stats.get(metric)) for t in known if metric in t.metrics
        ]
        empirical = fit_predict(features, [(p, v) for p, v, _ in data], configs, sd)
        ignore = setting.invariant.get(name, frozenset())
        for i, params in enumerate(configs):
            same = [d for d in data if _same(d[0], params, frozenset())]
            alike = [d for d in data if _same(d[0], params, ignore)] if ignore else []
            if same:
                out[i][metric] = _measured(metric, same, sd, "measured")
                continue
            if alike:
                found: Prediction | None = _measured(metric, alike, sd, "invariant")
            else:
                found = _speculative(setting, metric, params, known, acceptances, noise)
            if found is None and empirical[i] is not None:
                value, low, high = empirical[i]  # type: ignore[misc]
                found = _floored(Prediction(metric, value, low, high, "empirical"), sd)
            out[i][metric] = _widened(found, trust.factor(metric)) if found else Prediction(metric)
    return out


def verify(trust: Trust, prediction: Prediction, measured: float) -> Trust:
    """The trust after a launched configuration measured ``measured``: a prediction
    that missed its own interval widens that metric's intervals by as much as it would
    have needed, for the rest of the sweep; one that held leaves them as they were
    (never narrower)."""
    p = prediction
    if p.value is None or p.low is None or p.high is None or p.basis == "measured":
        return trust
    if p.low <= measured <= p.high:
        return trust
    half = (p.high - p.value) if measured > p.value else (p.value - p.low)
    needed = abs(measured - p.value) / half if half > 0 else float("inf")
    # interval already widened by the current factor: scale it by what this miss needed
    factor = trust.factor(p.metric) * min(needed, 1e6)
    return Trust({**trust.widen, p.metric: max(trust.factor(p.metric), factor)})
