"""The draft length per batch size that a sweep supports, and the schedule an engine
can take (issue 34).

The best draft length moves with the batch: drafting pays while a step is cheap and
stops paying once verifying every sequence's drafts fills the step. An engine that
takes a schedule (vLLM's ``num_speculative_tokens_per_batch_size``) can use a
different draft length at each batch size; ``servesweep best`` gives the one the
measurements and the performance prediction support, only for a sweep that varies
the engine's draft length and measures more than one concurrency.

How it decides (also in docs/reports.md):

1. The configurations are those of the best (:func:`servesweep.decide.best.find_best`)
   with only the draft length changed: every other knob stays the winner's. The
   figure is the first objective's metric, read at every closed-loop level ``cN`` of
   its workload (concurrency N).
2. At each level, the draft lengths measured there (trials ``ok``, the level reliable,
   its constraints at that level met) are ranked by their mean; those the leader does
   not beat beyond the uncertainty and the threshold
   (:func:`servesweep.decide.uncertainty.margin`, family-wise over the level's draft
   lengths as ``best``'s tie set) are tied with it, and the shortest
   of them is chosen: it verifies fewer tokens per step (the cheaper, as elsewhere).
3. Draft lengths of the sweep never measured with the winner's other knobs (skipped
   as predicted worse, or not run) are predicted (:func:`servesweep.decide.perf.predict`,
   from every trial of the sweep). One whose whole interval beats the measured choice
   by the threshold is chosen instead, marked ``predicted``: it was never launched.
   One whose interval still reaches past the choice is listed as open (launch it to
   know); the rest are predicted worse.
4. The schedule, levels in order of concurrency; the first range starts at batch size 1.
   Between two neighbouring levels whose draft lengths differ, nothing was measured:
   the switch goes to the first batch size where the upper level's draft length is
   predicted at least as good as the lower one's (the two compared by the model's
   point estimates, by bisection; the note gives their intervals), or to the upper
   level's concurrency where the prediction is unknown (:class:`Switch`). For vLLM:
   ``[[1, 4, 4], [5, 8, 1]]`` with ``num_speculative_tokens`` the largest (vLLM caps
   every entry at it and carries the last range's draft length to every larger batch).
   An engine without a schedule parameter takes one draft length for every batch: the
   result says so and gives each level's own launch instead.

What a schedule cannot say is listed with it (:attr:`DraftSchedule.limits`): batch sizes
between two measured concurrencies were not measured; the schedule itself was never
launched (each figure comes from a launch with one draft length); vLLM's batch is the
requests of one step, which a closed-loop level's concurrency only bounds.

Pure functions over plain records; the caller says what the engine's flags can
express (:class:`ScheduleForm`, from its preset).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servesweep.decide.best import BestResult, rules_of
from servesweep.decide.perf import Measured, Prediction, Setting, predict
from servesweep.decide.perf.gate import PREDICTED_WORSE
from servesweep.decide.perf.inputs import measured_of
from servesweep.decide.refs import ResultIndex, stored_spec
from servesweep.decide.stats import MetricStats, swept_params
from servesweep.decide.uncertainty import Rules, margin
from servesweep.errors import ServesweepError
from servesweep.models import Outcome
from servesweep.records import SweepData, TrialRecord
from servesweep.spec.constraints import Constraint, MetricRef, parse_constraint
from servesweep.spec.space import build_space

__all__ = [
    "DraftChoice",
    "DraftSchedule",
    "LevelChoice",
    "ScheduleForm",
    "Switch",
    "choose_draft",
    "draft_schedule",
    "schedule_ranges",
]

_LEVEL = re.compile(r"^c(\d+)$")


@dataclass(frozen=True)
class ScheduleForm:
    """What an engine's flags can express (from its preset): the param of the draft
    length, and the param that takes a draft length per batch size (None: one draft
    length for every batch)."""

    engine: str
    draft_param: str | None
    schedule_param: str | None = None


@dataclass(frozen=True)
class DraftChoice:
    """One draft length at one level: measured (a trial's mean and interval) or
    predicted (never launched with the winner's other knobs)."""

    draft: int
    value: float | None
    """None: predicted unknown (too far from anything measured)."""
    low: float | None
    high: float | None
    basis: str
    """``measured`` or ``predicted``."""
    trial: int | None = None
    """The trial measured (None: predicted)."""

    @property
    def predicted(self) -> bool:
        return self.basis != "measured"

    def to_dict(self) -> dict[str, Any]:
        return {
            "draft": self.draft,
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "basis": self.basis,
            "trial": self.trial,
        }


@dataclass(frozen=True)
class LevelChoice:
    """The draft length chosen at one concurrency, with what it was chosen among."""

    level: str
    concurrency: int
    chosen: DraftChoice
    tied: tuple[int, ...] = ()
    """Measured draft lengths not separated from the leader (the chosen one excluded)."""
    measured: tuple[DraftChoice, ...] = ()
    predicted: tuple[DraftChoice, ...] = ()
    open: tuple[int, ...] = ()
    """Predicted draft lengths whose interval still reaches past the chosen one."""
    why: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    """The launch params of this level's draft length alone (the winner's other knobs)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "concurrency": self.concurrency,
            "draft": self.chosen.draft,
            "basis": self.chosen.basis,
            "chosen": self.chosen.to_dict(),
            "tied": list(self.tied),
            "open": list(self.open),
            "why": self.why,
            "measured": [c.to_dict() for c in self.measured],
            "predicted": [c.to_dict() for c in self.predicted],
            "params": dict(self.params),
        }


@dataclass(frozen=True)
class Switch:
    """Where the draft length changes between two neighbouring measured concurrencies."""

    low: int
    """The concurrency below (its draft length holds up to ``batch - 1``)."""
    high: int
    """The concurrency above."""
    batch: int
    """The first batch size given the draft length of ``high``."""
    basis: str
    """``predicted`` (the performance prediction placed it) or ``next`` (at ``high``:
    the prediction could not tell, or no batch size lies between)."""
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "low": self.low,
            "high": self.high,
            "batch": self.batch,
            "basis": self.basis,
            "why": self.why,
        }


@dataclass(frozen=True)
class DraftSchedule:
    """The draft length per concurrency, and the schedule the engine can take."""

    engine: str
    draft_param: str
    metric: str
    """The figure compared at every level (``chat.<level>.output_throughput``)."""
    direction: str
    base: Mapping[str, Any]
    """The winner's params: every knob but the draft length stays as in it."""
    levels: tuple[LevelChoice, ...]
    ranges: tuple[tuple[int, int, int], ...]
    """``(first batch, last batch, draft length)``, merged where equal."""
    schedule_param: str | None
    expressed: bool
    """Whether the engine's flags take the schedule (a schedule param, and the draft
    length not the same at every level)."""
    params: Mapping[str, Any]
    """The launch params: the schedule's when expressed, else the winner's."""
    limits: tuple[str, ...] = ()
    """What the schedule cannot say, one line each."""
    ruled_out: Mapping[int, str] = field(default_factory=dict)
    """Draft lengths of the sweep neither measured nor predicted, and why (failed, or
    skipped as not fitting in memory)."""
    switches: tuple[Switch, ...] = ()
    """Where the draft length changes between measured concurrencies."""

    @property
    def predicted(self) -> bool:
        """Whether any level's draft length was only predicted."""
        return any(lv.chosen.predicted for lv in self.levels)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "draft_param": self.draft_param,
            "metric": self.metric,
            "direction": self.direction,
            "base": dict(self.base),
            "levels": [lv.to_dict() for lv in self.levels],
            "ranges": [list(r) for r in self.ranges],
            "schedule_param": self.schedule_param,
            "expressed": self.expressed,
            "predicted": self.predicted,
            "params": dict(self.params),
            "limits": list(self.limits),
            "ruled_out": {str(k): v for k, v in sorted(self.ruled_out.items())},
            "switches": [w.to_dict() for w in self.switches],
        }


def _draft(params: Mapping[str, Any], draft_param: str) -> int | None:
    """The draft length a configuration sets (absent: 0, no speculation); None when
    it is not a whole number."""
    value = params.get(draft_param, 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if float(value).is_integer() else None


def _others(params: Mapping[str, Any], draft_param: str) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k != draft_param}


def schedule_ranges(
    choices: Sequence[tuple[int, int]], starts: Mapping[int, int] | None = None
) -> tuple[tuple[int, int, int], ...]:
    """``(concurrency, draft)`` pairs, in any order, as inclusive batch-size ranges:
    each draft length from the first batch size of its range (``starts``, by
    concurrency; default the concurrency itself) up to the next range's, the first from
    batch size 1, the last ending at its own concurrency (vLLM carries it to every
    larger batch); neighbours with the same draft length merged."""
    ordered = sorted(choices)
    first = dict(starts or {})
    out: list[tuple[int, int, int]] = []
    for i, (conc, draft) in enumerate(ordered):
        start = 1 if i == 0 else first.get(conc, conc)
        if i + 1 < len(ordered):
            following = ordered[i + 1][0]
            end = first.get(following, following) - 1
        else:
            end = max(conc, start)
        if out and out[-1][2] == draft:
            out[-1] = (out[-1][0], end, draft)
        else:
            out.append((start, end, draft))
    return tuple(out)


def _better(a: float | None, b: float | None, direction: str) -> bool:
    if a is None or b is None:
        return b is None and a is not None
    return a > b if direction == "max" else a < b


def _beats(p: Prediction, value: float, direction: str, threshold: float) -> bool:
    """The whole predicted interval beats ``value`` by the threshold."""
    if direction == "max":
        return p.low is not None and p.low > value * (1 + threshold)
    return p.high is not None and p.high < value * (1 - threshold)


def _reaches(p: Prediction, value: float, direction: str, threshold: float) -> bool:
    """The predicted interval still reaches past ``value`` by the threshold."""
    if p.low is None or p.high is None:
        return True
    if direction == "max":
        return p.high > value * (1 + threshold)
    return p.low < value * (1 - threshold)


def _space_drafts(data: SweepData, draft_param: str) -> set[int]:
    """The draft lengths the sweep file's space holds (enumerable spaces only)."""
    spec = stored_spec(data)
    if spec is None:
        return set()
    try:
        space = build_space(spec.params)
        configs = space.allowed() if space.enumerable else []
    except ServesweepError:
        return set()
    found = {_draft(c.params, draft_param) for c in configs}
    return {d for d in found if d is not None}


def _constraints_at(texts: Sequence[str], workload: str, level: str) -> list[Constraint]:
    out = []
    for text in texts:
        con = parse_constraint(text)
        if con.ref.workload == workload and con.ref.level == level:
            out.append(con)
    return out


@dataclass(frozen=True)
class _Group:
    """The winner's configurations over the draft length."""

    trials: Mapping[int, TrialRecord]
    """Draft length -> the measured trial (the first in run order)."""
    unmeasured: tuple[int, ...]
    """Draft lengths to predict: never measured, and not ruled out."""
    ruled_out: Mapping[int, str]
    """Draft length -> why it is neither measured nor predicted (it failed, or would
    not fit in memory)."""


def _group(data: SweepData, winner: TrialRecord, draft_param: str) -> _Group:
    base = _others(winner.params, draft_param)
    trials: dict[int, TrialRecord] = {}
    ruled_out: dict[int, str] = {}
    drafts: set[int] = set(_space_drafts(data, draft_param))
    for trial in sorted(data.trials, key=lambda t: (t.seq, t.id)):
        draft = _draft(trial.params, draft_param)
        if draft is None or _others(trial.params, draft_param) != base or not trial.in_plan:
            continue
        drafts.add(draft)
        if trial.outcome is Outcome.OK:
            trials.setdefault(draft, trial)
            continue
        reason = trial.evidence.reason if trial.evidence is not None else None
        if trial.outcome is Outcome.FAILED:
            cls = trial.failure_class.value if trial.failure_class else "unclassified"
            ruled_out.setdefault(draft, f"failed: {cls}" + (f" ({reason})" if reason else ""))
        elif trial.outcome is Outcome.SKIPPED and reason not in (None, PREDICTED_WORSE):
            ruled_out.setdefault(draft, f"skipped: {reason}")
    for draft in trials:
        ruled_out.pop(draft, None)
    unmeasured = tuple(sorted(d for d in drafts if d not in trials and d not in ruled_out))
    return _Group(trials, unmeasured, ruled_out)


def choose_draft(
    level: str,
    concurrency: int,
    measured: list[tuple[DraftChoice, MetricStats]],
    predicted: list[tuple[DraftChoice, Prediction]],
    direction: str,
    rules: Rules,
    launch_sd: float | None,
) -> LevelChoice | None:
    """The draft length chosen at one level (steps 2 and 3 of the module docstring)
    among the ``measured`` ones (with their stats) and the ``predicted`` ones."""
    ranked = sorted(measured, key=lambda m: -m[1].mean if direction == "max" else m[1].mean)
    chosen: DraftChoice | None = None
    tied: tuple[int, ...] = ()
    why = ""
    if ranked:
        leader, lstats = ranked[0]
        family = rules.for_ties(len(ranked))  # as best's tie set: family-wise
        together = [
            c
            for c, s in ranked
            if c is leader or not margin(lstats, s, direction, family, launch_sd).decisive
        ]
        chosen = min(together, key=lambda c: c.draft)
        tied = tuple(sorted(c.draft for c in together if c is not chosen))
        if tied:
            why = (
                f"draft {chosen.draft} chosen: the shortest of the draft lengths not "
                f"separated beyond their uncertainty and the {rules.threshold:.0%} threshold "
                f"({', '.join(str(d) for d in sorted(c.draft for c in together))})"
            )
        elif len(ranked) > 1:
            runner, rstats = ranked[1]
            why = (
                f"draft {chosen.draft} beats draft {runner.draft}: "
                f"{margin(lstats, rstats, direction, family, launch_sd).describe()}"
            )
        else:
            why = f"draft {chosen.draft} is the only one measured"
    known = [(c, p) for c, p in predicted if p.known and c.value is not None]
    opened: list[int] = []
    if chosen is not None and chosen.value is not None:
        value = chosen.value
        beating = [(c, p) for c, p in known if _beats(p, value, direction, rules.threshold)]
        if beating:
            best_c = beating[0][0]
            for c, _ in beating[1:]:
                if _better(c.value, best_c.value, direction):
                    best_c = c
            why = (
                f"draft {best_c.draft} predicted (never launched) beyond the measured "
                f"draft {chosen.draft} by more than the {rules.threshold:.0%} threshold"
            )
            chosen = best_c
        opened = [
            c.draft
            for c, p in predicted
            if c is not chosen and _reaches(p, value, direction, rules.threshold)
        ]
    elif known:
        chosen = known[0][0]
        for c, _ in known[1:]:
            if _better(c.value, chosen.value, direction):
                chosen = c
        why = f"draft {chosen.draft} predicted: no draft length was measured at {level}"
        opened = [c.draft for c, _ in known if c is not chosen]
    if chosen is None:
        return None
    return LevelChoice(
        level,
        concurrency,
        chosen,
        tied,
        tuple(c for c, _ in sorted(measured, key=lambda m: m[0].draft)),
        tuple(c for c, _ in sorted(predicted, key=lambda m: m[0].draft)),
        tuple(sorted(opened)),
        why,
    )


def _predict(
    data: SweepData,
    draft_param: str,
    base: Mapping[str, Any],
    drafts: Sequence[int],
    metrics: Sequence[str],
    concurrency: Mapping[str, float],
) -> list[dict[str, Prediction]]:
    history = [(t, data.results.get(t.id, ())) for t in data.trials if t.in_plan]
    measured: list[Measured] = measured_of(history)
    others = frozenset(k for t in data.trials for k in t.params if k != draft_param)
    setting = Setting(
        metrics=tuple(metrics),
        draft_param=draft_param,
        concurrency=concurrency,
        invariant={"acceptance_length": others},
        noise=rules_of(data).launch_sd or Setting.noise,  # the stated prior, as the gate's
    )
    configs = [{**base, draft_param: d} for d in drafts]
    return predict(setting, configs, measured)


def draft_schedule(
    data: SweepData,
    best: BestResult,
    form: ScheduleForm | None,
    *,
    include_unreliable: bool | None = None,
) -> DraftSchedule | None:
    """The draft length per concurrency and the schedule ``form``'s engine can take,
    around ``best``'s winner (module docstring); None unless the engine has a draft
    length, the sweep varies it, and the winner's workload was measured at more than
    one concurrency. ``include_unreliable``: as ``best`` was given it (default: the
    sweep file's)."""
    if include_unreliable is None:
        include_unreliable = data.include_unreliable
    if form is None or form.draft_param is None or best.winner is None:
        return None
    wanted = form.draft_param.replace("-", "_")
    draft_param = next((p for p in swept_params(data) if p.replace("-", "_") == wanted), None)
    if draft_param is None:
        return None
    winner = best.winner.trial
    objective, direction = best.objectives[0]
    parts = objective.split(".")
    if len(parts) != 3:
        return None
    workload, _, name = parts
    index = ResultIndex(data, reliable_only=not include_unreliable)
    levels: dict[str, int] = {}
    for level in index.workload_levels(workload):
        match = _LEVEL.match(level)
        if match:
            levels[level] = int(match.group(1))
    if len(levels) < 2:
        return None
    group = _group(data, winner, draft_param)
    base = _others(winner.params, draft_param)
    constraints = {lv: _constraints_at(best.constraints, workload, lv) for lv in levels}
    metrics = [f"{workload}.{lv}.{name}" for lv in levels]
    metrics += [c.ref.key for cons in constraints.values() for c in cons]
    predictions = (
        _predict(
            data,
            draft_param,
            base,
            group.unmeasured,
            metrics,
            {f"{workload}.{lv}": float(c) for lv, c in levels.items()},
        )
        if group.unmeasured
        else []
    )
    launch_sd = best.launch_sds[0] if best.launch_sds else None
    choices: list[LevelChoice] = []
    for level, conc in sorted(levels.items(), key=lambda kv: kv[1]):
        ref = MetricRef.of(workload, level, name)
        measured: list[tuple[DraftChoice, MetricStats]] = []
        for draft, trial in sorted(group.trials.items()):
            stats = index.stats(trial, ref)
            if stats is None or not math.isfinite(stats.mean):
                continue
            if not all(c.check(index.value(trial, c.ref)) for c in constraints[level]):
                continue
            measured.append(
                (DraftChoice(draft, stats.mean, stats.lo, stats.hi, "measured", trial.id), stats)
            )
        predicted: list[tuple[DraftChoice, Prediction]] = []
        for draft, per in zip(group.unmeasured, predictions, strict=True):
            p = per.get(ref.key) or Prediction(ref.key)
            cons_ok = not p.known or all(
                (q := per.get(c.ref.key)) is not None and c.check(q.value) is True
                for c in constraints[level]
            )
            if not cons_ok:
                continue
            predicted.append((DraftChoice(draft, p.value, p.low, p.high, "predicted"), p))
        choice = choose_draft(level, conc, measured, predicted, direction, best.rules, launch_sd)
        if choice is not None:
            params = {**base, draft_param: choice.chosen.draft}
            choices.append(
                LevelChoice(
                    choice.level,
                    choice.concurrency,
                    choice.chosen,
                    choice.tied,
                    choice.measured,
                    choice.predicted,
                    choice.open,
                    choice.why,
                    params,
                )
            )
    if len(choices) < 2:
        return None
    metric = f"{workload}.<level>.{name}"
    switches = _switches(data, draft_param, base, workload, name, direction, choices)
    found = _schedule(form, draft_param, metric, direction, dict(winner.params), choices, switches)
    return dataclasses.replace(found, ruled_out=dict(group.ruled_out))


def _shown(p: Prediction) -> str:
    if p.low is None or p.high is None or p.value is None:
        return "unknown"
    return f"{p.value:.4g} ({p.low:.4g}..{p.high:.4g})"


def _apart(a: Prediction, b: Prediction, direction: str) -> bool:
    """Whether ``a``'s interval lies wholly past ``b``'s in the better direction."""
    if a.low is None or a.high is None or b.low is None or b.high is None:
        return False
    return a.low > b.high if direction == "max" else a.high < b.low


def _switches(
    data: SweepData,
    draft_param: str,
    base: Mapping[str, Any],
    workload: str,
    name: str,
    direction: str,
    choices: Sequence[LevelChoice],
) -> tuple[Switch, ...]:
    """Between two measured concurrencies whose draft lengths differ, the first batch
    size where the upper one's draft length is predicted at least as good as the lower
    one's (the model's point estimates, only these two draft lengths compared); at the
    upper concurrency when a prediction is unknown. Found by bisection, a prediction per
    probe: the model's step time is linear in the batch, so the two cross once."""
    measured_levels = {f"{workload}.c{lv.concurrency}": float(lv.concurrency) for lv in choices}
    out: list[Switch] = []
    for a, b in itertools.pairwise(choices):
        ka, kb = a.chosen.draft, b.chosen.draft
        if ka == kb:
            continue
        lo, hi = a.concurrency, b.concurrency  # ka holds at lo, kb at hi
        crossed: tuple[Prediction, Prediction] | None = None
        unknown: int | None = None
        while hi - lo > 1:
            x = (lo + hi) // 2
            metric = f"{workload}.c{x}.{name}"
            concurrency = {**measured_levels, f"{workload}.c{x}": float(x)}
            pa, pb = (
                p[metric]
                for p in _predict(data, draft_param, base, [ka, kb], [metric], concurrency)
            )
            if pa.value is None or pb.value is None:
                unknown = x
                break
            if pb.value == pa.value or _better(pb.value, pa.value, direction):
                hi, crossed = x, (pa, pb)
            else:
                lo = x
        gap = f"batch sizes {a.concurrency + 1}-{b.concurrency - 1} were not measured"
        if b.concurrency - a.concurrency <= 1:
            out.append(Switch(a.concurrency, b.concurrency, b.concurrency, "next"))
        elif unknown is not None:
            why = (
                f"the prediction cannot tell {draft_param}={ka} from {kb} at batch {unknown}: "
                f"c{a.concurrency}'s draft length holds up to c{b.concurrency} ({gap})"
            )
            out.append(Switch(a.concurrency, b.concurrency, b.concurrency, "next", why))
        elif crossed is None:
            why = f"{draft_param}={ka} is predicted ahead of {kb} up to batch {hi - 1} ({gap})"
            out.append(Switch(a.concurrency, b.concurrency, hi, "predicted", why))
        else:
            pa, pb = crossed
            apart = _apart(pb, pa, direction)
            why = (
                f"at batch {hi} {draft_param}={kb} is predicted {_shown(pb)} against {ka}'s "
                f"{_shown(pa)}: the point estimates cross there, their intervals "
                + ("apart" if apart else "overlap")
                + f" ({gap}: measure one to place the switch)"
            )
            out.append(Switch(a.concurrency, b.concurrency, hi, "predicted", why))
    return tuple(out)


def _schedule(
    form: ScheduleForm,
    draft_param: str,
    metric: str,
    direction: str,
    best: Mapping[str, Any],
    choices: Sequence[LevelChoice],
    switches: Sequence[Switch] = (),
) -> DraftSchedule:
    base = _others(best, draft_param)
    starts = {w.high: w.batch for w in switches}
    ranges = schedule_ranges([(lv.concurrency, lv.chosen.draft) for lv in choices], starts)
    drafts = [r[2] for r in ranges]
    top = max(drafts)
    measured = ", ".join(f"c{lv.concurrency}" for lv in choices)
    limits: list[str] = []
    expressed = False
    params: dict[str, Any] = {**base, draft_param: top}
    if len(ranges) == 1:
        if _draft(best, draft_param) == top:
            params = dict(best)
        what = "no speculation" if top == 0 else f"{draft_param}={top}"
        limits.append(f"one draft length serves every measured concurrency: {what}")
    elif form.schedule_param is None:
        limits.append(
            f"{form.engine} takes one draft length ({draft_param}) for every batch size: "
            "it cannot follow a schedule; launch each concurrency's own draft length, or "
            "the best's"
        )
        params = dict(best)
    else:
        expressed = True
        params[form.schedule_param] = [list(r) for r in ranges]
        limits.append(
            f"only {measured} were measured: where the draft length changes between two "
            "of them the performance prediction places the switch (below), or it comes at "
            "the upper one; every batch above the last keeps the last's (vLLM carries a "
            "range's draft length forward)"
        )
        limits.append(
            "the schedule itself was never launched: each figure comes from a launch "
            "with one draft length; with a schedule vLLM uses piecewise CUDA graphs "
            "instead of full ones (unless VLLM_USE_V2_MODEL_RUNNER=1), and with data "
            "parallelism above 1 it ignores the schedule"
        )
        limits.append(
            "vLLM's batch is the requests of one step (decodes and prefills together), "
            "which a closed-loop level's concurrency only bounds; the schedule is by "
            "batch size only, never by context length or acceptance"
        )
        if 0 in drafts:
            limits.append(
                "a range with draft length 0 turns speculation off at those batch sizes; "
                "the draft (or n-gram lookup) stays loaded"
            )
    if any(lv.chosen.predicted for lv in choices):
        limits.append(
            "a draft length marked predicted was never launched with these knobs: "
            "launch it before relying on it"
        )
    for w in switches:
        if w.why:
            limits.append(f"switch c{w.low} -> c{w.high} at batch {w.batch}: {w.why}")
    return DraftSchedule(
        engine=form.engine,
        draft_param=draft_param,
        metric=metric,
        direction=direction,
        base=dict(base),
        levels=tuple(choices),
        ranges=ranges,
        schedule_param=form.schedule_param,
        expressed=expressed,
        params=params,
        limits=tuple(limits),
        switches=tuple(switches),
    )
