"""The best configuration of a sweep under an objective and constraints.

How it decides (also in docs/reports.md):

1. Candidates are the trials still in the plan whose outcome is ``ok``; every other
   trial is excluded with its reason (failed with class and evidence, not measured).
2. A candidate missing a value for an objective or a constraint metric is excluded
   ("missing metric"); one whose value comes only from a level marked ``unreliable``
   (the load generator could not keep time, ``bench.health``) is excluded with that
   reason unless ``include_unreliable``; one violating a constraint is excluded with
   the value.
   Constraints are judged on the mean, and with the value's confidence interval
   whether that is certain: a candidate whose interval straddles the limit stays
   (or is excluded) by its mean, marked ``uncertain`` with what would decide it.
3. Candidates are ranked by the objectives in order (the first decides, the next
   ones break exact ties), values being the mean over repeats.
4. The leader is the winner only when it leads every other candidate by more than
   the uncertainty of the difference *and* by more than the practical threshold
   (the sweep file's ``decision.threshold``, default 1 %); objective by objective,
   :func:`servesweep.decide.uncertainty.tie_set` keeps those it does not beat so.
   Otherwise the result is a tie set, and the cheaper candidate of it wins (fewer
   GPUs, then less GPU memory, then lower latency; ``decision.prefer``), the reason
   said in one line. Values equal within ``rel_tol`` are ranked by run order.
   Among n candidates the tie set is decided at the family-wise confidence
   ``1 - alpha / (n - 1)`` (``Rules.for_ties``), so a configuration as good as the
   leader is dropped with chance ``alpha`` however many there are.
   Each mean's uncertainty counts the variation between launches, at least
   (``decide.uncertainty.decision_se``): learned from the candidates measured in
   several launches, pooled with ``decision.launch_sd`` (default 2 %) until they
   say more. Candidates of the tie set whose difference from the leader lies,
   on every objective, inside ``± threshold`` (an equivalence test, as in TOST) are
   ``equivalent``: the result says so rather than "tie".
5. When the sweep ran a screening pass (``screening`` in the sweep file: short
   levels first, full measurement only for those that could still win), the
   configurations it screened out are excluded as ``screened`` with the reason, and a
   note says what it decided and what it saved (:mod:`servesweep.decide.screened`).
   When the sweep ran a confirm phase (``confirm`` in the sweep file: the tied
   leaders relaunched until they separate or its budget is spent), a note says what
   it did and what it changed (:mod:`servesweep.decide.confirmed`).
6. With several objectives the Pareto set (candidates no other candidate beats
   on every objective) is given too.
7. When a figure the winner was decided on comes from a level whose acceptance
   length is not trusted (random-token prompts or ``ignore_eos``,
   :mod:`servesweep.decide.acceptance`), the winner is still named, marked, and a note says
   which figure and why (:mod:`servesweep.decide.trusted`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servesweep import metrics_catalog as mc
from servesweep.decide.confirmed import ConfirmSummary, confirm_note, summarise
from servesweep.decide.costs import CostView, cost_view
from servesweep.decide.mismatches import mismatch_notes, trial_mismatches
from servesweep.decide.refs import ResultIndex, objectives_of, stored_spec
from servesweep.decide.resources import trial_gpus
from servesweep.decide.screened import ScreeningSummary, screening_note, summarise_screening
from servesweep.decide.stats import (
    MetricStats,
    config_label,
    fixed_args,
    format_number,
    swept_params,
)
from servesweep.decide.trusted import Untrusted, untrusted_figures, untrusted_notes
from servesweep.decide.uncertainty import (
    Margin,
    Rules,
    Verdict,
    judge,
    learned_launch_sd,
    margin,
    prefer,
    tie_set,
)
from servesweep.errors import ConfigError
from servesweep.metrics_catalog import Latency, Stat
from servesweep.models import Outcome
from servesweep.records import SweepData, TrialRecord
from servesweep.spec.constraints import Constraint, MetricRef, parse_constraint, parse_metric_ref

__all__ = [
    "BestResult",
    "Candidate",
    "Exclusion",
    "find_best",
]

DEFAULT_REL_TOL = 1e-6
E2E_MEDIAN = mc.latency(Latency.E2E, Stat.MEDIAN).name


@dataclass(frozen=True)
class Candidate:
    """A feasible configuration with its objective values (mean over repeats)."""

    trial: TrialRecord
    label: str
    values: tuple[float, ...]
    """One value per objective, in the order of ``BestResult.objectives``."""
    stats: tuple[MetricStats, ...]
    constraint_values: tuple[float, ...] = ()
    """One value per constraint, in the order of ``BestResult.constraints``."""
    verdicts: tuple[Verdict, ...] = ()
    """One per constraint: met, or uncertain (with what would decide it)."""


@dataclass(frozen=True)
class Exclusion:
    """A configuration that cannot be the best, and why."""

    trial: TrialRecord
    label: str
    kind: str
    """``failed``, ``not_measured``, ``not_in_plan``, ``missing_metric``, ``unreliable``
    (a level it needs could not be timed by the load generator), ``constraint`` or
    ``screened`` (the screening pass found it could not win)."""
    reason: str
    """One line a person can read."""
    metric: str | None = None
    value: float | None = None
    constraint: str | None = None


@dataclass(frozen=True)
class BestResult:
    """What :func:`find_best` decided, with everything needed to explain it."""

    objectives: tuple[tuple[str, str], ...]
    """(metric reference, ``max``/``min``), the first one decides."""
    constraints: tuple[str, ...]
    winner: Candidate | None
    ranking: tuple[Candidate, ...] = ()
    """Every feasible candidate, best first."""
    ties: tuple[Candidate, ...] = ()
    """Other candidates equal to the winner within tolerance."""
    pareto: tuple[Candidate, ...] = ()
    """Non-dominated candidates (only with several objectives)."""
    excluded: tuple[Exclusion, ...] = ()
    notes: tuple[str, ...] = ()
    """Tie explanations, noise warnings, metrics no trial measured."""
    rel_tol: float = DEFAULT_REL_TOL
    sweep_name: str = ""
    rules: Rules = field(default_factory=Rules)
    decided: bool = True
    """True when the winner beats every other candidate beyond uncertainty and the
    threshold; False when it was picked from a tie set (``ties``)."""
    why: str = ""
    """One line: why the winner, against the runner-up or among the tied."""
    runner_up: Margin | None = None
    """The leader's margin over the best candidate outside the tie set (None: every
    candidate is in it)."""
    confirm: ConfirmSummary | None = None
    """What the sweep's confirm phase did (None: it had none)."""
    confirm_note: str = ""
    untrusted: tuple[Untrusted, ...] = ()
    """The winner's figures that rest on an untrusted acceptance length (one note per
    workload)."""
    screening: ScreeningSummary | None = None
    """What the sweep's screening pass decided and saved (None: it had none)."""
    screening_note: str = ""
    equivalent: tuple[Candidate, ...] = ()
    """Those of ``ties`` equivalent to the leader within the threshold on every
    objective (the difference's interval at ``1 - 2 alpha`` inside ``± threshold``)."""
    launch_sds: tuple[float, ...] = ()
    """The relative variation between launches each objective was decided with."""
    costs: CostView | None = None
    """Each trial's GPUs and, with a price in the sweep file, its cost figures."""
    mismatches: Mapping[int, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)
    """By trial id: the swept parameters its server did not run as asked."""

    @property
    def feasible(self) -> bool:
        return self.winner is not None

    @property
    def trial(self) -> TrialRecord | None:
        return None if self.winner is None else self.winner.trial

    @property
    def value(self) -> float | None:
        return None if self.winner is None else self.winner.values[0]


def _direction(value: str) -> str:
    text = value.strip().lower()
    if text in ("max", "maximize", "maximise"):
        return "max"
    if text in ("min", "minimize", "minimise"):
        return "min"
    raise ConfigError(f"direction must be 'max' or 'min', got {value!r}", key="direction")


def _objectives(
    data: SweepData,
    index: ResultIndex,
    objective: str | None,
    direction: str,
    objectives: Sequence[tuple[str, str]],
) -> list[tuple[MetricRef, str]]:
    out: list[tuple[MetricRef, str]] = []
    if objective is not None:
        out.append((parse_metric_ref(objective), _direction(direction)))
    out.extend((parse_metric_ref(text), _direction(d)) for text, d in objectives)
    if not out:
        out.extend(objectives_of(data, index))
        if not out:
            raise ConfigError(
                "no objective: the sweep file has none and nothing was measured; "
                "give one, e.g. --objective chat.c1.output_throughput"
            )
    return out


def _missing_reason(index: ResultIndex, ref: MetricRef) -> str:
    """Why no trial could have a value for ``ref``, when that is the case."""
    if ref.workload is None:
        return ""
    if ref.workload not in index.workloads():
        known = ", ".join(index.workloads()) or "none"
        return f"no workload {ref.workload!r} was measured (workloads: {known})"
    levels = index.workload_levels(ref.workload)
    if ref.level is None and len(levels) > 1:
        return f"{ref.text!r} names no level; {ref.workload} has {', '.join(levels)}"
    if ref.level is not None and ref.level not in levels:
        return f"{ref.workload} has no level {ref.level} (levels: {', '.join(levels)})"
    return ""


def _ahead(a: float, b: float, direction: str, rel_tol: float) -> int:
    """1 when a is better than b, -1 when worse, 0 when equal within tolerance."""
    if math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-12):
        return 0
    better = a > b if direction == "max" else a < b
    return 1 if better else -1


def _dominates(a: Candidate, b: Candidate, dirs: Sequence[str], rel_tol: float) -> bool:
    cmp = [_ahead(x, y, d, rel_tol) for x, y, d in zip(a.values, b.values, dirs, strict=True)]
    return all(c >= 0 for c in cmp) and any(c > 0 for c in cmp)


def _exclude_unfinished(trial: TrialRecord, label: str) -> Exclusion | None:
    if not trial.in_plan:
        return Exclusion(trial, label, "not_in_plan", "no longer in the sweep file")
    if trial.outcome is Outcome.FAILED:
        cls = trial.failure_class.value if trial.failure_class else "unclassified"
        why = trial.evidence.summary() if trial.evidence else "no evidence recorded"
        return Exclusion(trial, label, "failed", f"failed: {cls}: {why}")
    evidence = trial.evidence
    if trial.outcome is Outcome.PRUNED and evidence is not None and evidence.reason == "screened":
        return Exclusion(trial, label, "screened", f"screened out: {evidence.message}")
    if trial.outcome is not Outcome.OK:
        return Exclusion(trial, label, "not_measured", f"not measured: {trial.outcome.value}")
    return None


def find_best(
    data: SweepData,
    objective: str | None = None,
    direction: str = "max",
    constraints: Sequence[str] = (),
    *,
    objectives: Sequence[tuple[str, str]] = (),
    rel_tol: float = DEFAULT_REL_TOL,
    include_unreliable: bool | None = None,
    rules: Rules | None = None,
) -> BestResult:
    """The best ok trial of a sweep under objectives and constraints.

    ``objective``/``direction`` and then ``objectives`` (pairs of metric reference
    and ``max``/``min``) are ranked in order; without any, the sweep file's
    objective is used. ``constraints`` (``chat.c1.ttft_p99_ms < 500``) replace the
    sweep file's constraints when given. Raises ConfigError for a malformed
    reference or constraint; an empty feasible set is a result (``feasible`` False,
    every configuration in ``excluded`` with its reason). Levels the load generator
    could not time are left out (a trial that needs one is excluded as
    ``unreliable``) unless ``include_unreliable`` (default: the sweep file's) takes
    them in. ``rules`` (confidence, threshold, what "cheaper" means) default to the
    sweep file's ``decision``.
    """
    if include_unreliable is None:
        include_unreliable = data.include_unreliable
    index = ResultIndex(data, reliable_only=not include_unreliable)
    rules = rules if rules is not None else rules_of(data)
    objs = _objectives(data, index, objective, direction, objectives)
    texts = tuple(constraints) if constraints else tuple(data.constraints)
    parsed: list[Constraint] = [parse_constraint(t) for t in texts]
    params = swept_params(data)
    fixed = fixed_args(data)
    dirs = [d for _, d in objs]
    candidates: list[Candidate] = []
    excluded: list[Exclusion] = []
    for trial in sorted(data.trials, key=lambda t: (t.seq, t.id)):
        label = config_label(trial, params, fixed)
        gone = _exclude_unfinished(trial, label)
        if gone is not None:
            excluded.append(gone)
            continue
        stats: list[MetricStats] = []
        missing: str | None = None
        unreliable: str | None = None
        for ref, _ in objs:
            found = index.stats(trial, ref)
            if found is None or not math.isfinite(found.mean):
                missing = ref.key
                unreliable = index.unreliable_reason(trial, ref)
                break
            stats.append(found)
        if missing is not None:
            if unreliable is not None:
                excluded.append(Exclusion(trial, label, "unreliable", unreliable, missing))
            else:
                excluded.append(
                    Exclusion(trial, label, "missing_metric", f"missing metric {missing}", missing)
                )
            continue
        cvalues: list[float] = []
        verdicts: list[Verdict] = []
        violation: Exclusion | None = None
        for con in parsed:
            cstats = index.stats(trial, con.ref)
            value = None if cstats is None else cstats.mean
            ok = con.check(value)
            unreliable = index.unreliable_reason(trial, con.ref) if ok is None else None
            if unreliable is not None:
                violation = Exclusion(
                    trial,
                    label,
                    "unreliable",
                    f"{unreliable} (constraint {con})",
                    metric=con.ref.key,
                    constraint=str(con),
                )
                break
            if ok is None:
                violation = Exclusion(
                    trial,
                    label,
                    "missing_metric",
                    f"missing metric {con.ref.key} (constraint {con})",
                    metric=con.ref.key,
                    constraint=str(con),
                )
                break
            assert value is not None and cstats is not None
            verdict = judge(con, cstats, rules)
            if not ok:
                how = "" if verdict.state == "violated" else f" ({verdict.state}: {verdict.advice})"
                violation = Exclusion(
                    trial,
                    label,
                    "constraint",
                    f"constraint {con} violated: {con.ref.key} = {format_number(value)}{how}",
                    metric=con.ref.key,
                    value=value,
                    constraint=str(con),
                )
                break
            cvalues.append(value)
            verdicts.append(verdict)
        if violation is not None:
            excluded.append(violation)
            continue
        values = tuple(s.mean for s in stats)
        candidates.append(
            Candidate(trial, label, values, tuple(stats), tuple(cvalues), tuple(verdicts))
        )

    notes: list[str] = []
    for ref in [r for r, _ in objs] + [c.ref for c in parsed]:
        why = _missing_reason(index, ref)
        if why and why not in notes:
            notes.append(why)
    ranking = _rank(candidates, dirs, rel_tol)
    winner: Candidate | None = None
    ties: tuple[Candidate, ...] = ()
    pareto: tuple[Candidate, ...] = ()
    decided, why, runner_up = True, "", None
    untrusted: list[Untrusted] = []
    confirmed: ConfirmSummary | None = None
    note = ""
    launch_sds = tuple(
        learned_launch_sd([c.stats[k] for c in ranking], rules.launch_sd) for k in range(len(dirs))
    )
    equivalent: tuple[Candidate, ...] = ()
    if ranking:
        ties_rules = rules.for_ties(len(ranking))
        winner, tied, why, runner_up = _decide(data, index, ranking, objs, rules, launch_sds)
        equivalent = tuple(c for c in tied[1:] if _equivalent(tied[0], c, dirs, rules, launch_sds))
        ties = tuple(c for c in tied if c is not winner)
        decided = not ties
        notes.append(why)
        confirmed = summarise(data.confirm)
        if confirmed is not None:
            leader = tied[0]
            beaten = [
                (
                    c.trial.id,
                    margin(leader.stats[0], c.stats[0], dirs[0], ties_rules, launch_sds[0]),
                )
                for c in ranking
                if c.trial.id in confirmed.candidates and c not in tied
            ]
            note = confirm_note(
                confirmed,
                leader.trial.id,
                [c.trial.id for c in tied],
                beaten,
                equivalent=[c.trial.id for c in equivalent],
                threshold=rules.threshold,
            )
            notes.append(note)
        notes.extend(_uncertain_notes(winner, parsed))
        notes.extend(mismatch_notes(data, [c.trial for c in ranking]))
    screened = summarise_screening(data)
    screened_note = ""
    if screened is not None:
        screened_note = screening_note(screened)
        notes.append(screened_note)
    if ranking:
        assert winner is not None
        untrusted = untrusted_figures(index, winner.trial, [r for r, _ in objs] +
                                      [c.ref for c in parsed])  # fmt: skip
        notes.extend(untrusted_notes(untrusted))
        if len(objs) > 1:
            pareto = tuple(
                c for c in ranking if not any(_dominates(o, c, dirs, rel_tol) for o in ranking)
            )
    return BestResult(
        objectives=tuple((r.key, d) for r, d in objs),
        constraints=tuple(str(c) for c in parsed),
        winner=winner,
        ranking=tuple(ranking),
        ties=ties,
        pareto=pareto,
        excluded=tuple(excluded),
        notes=tuple(notes),
        rel_tol=rel_tol,
        sweep_name=data.sweep.name,
        rules=rules,
        decided=decided,
        why=why,
        runner_up=runner_up,
        confirm=confirmed if ranking else None,
        confirm_note=note if ranking and confirmed is not None else "",
        untrusted=tuple(untrusted),
        screening=screened,
        screening_note=screened_note,
        equivalent=equivalent,
        launch_sds=launch_sds,
        costs=cost_view(data, index, [r for r, _ in objs] + [c.ref for c in parsed]),
        mismatches={t.id: tuple(m) for t in data.trials if (m := trial_mismatches(data, t))},
    )


def _equivalent(
    leader: Candidate,
    cand: Candidate,
    dirs: Sequence[str],
    rules: Rules,
    launch_sds: Sequence[float],
) -> bool:
    """Whether ``cand`` is equivalent to ``leader`` within the threshold on every
    objective."""
    return all(
        margin(leader.stats[k], cand.stats[k], d, rules, launch_sds[k]).equivalent
        for k, d in enumerate(dirs)
    )


def rules_of(data: SweepData) -> Rules:
    """The sweep file's ``decision`` (defaults when it has none or no longer loads)."""
    spec = stored_spec(data)
    return Rules() if spec is None else Rules.of(spec.decision.model_dump())


def _decide(
    data: SweepData,
    index: ResultIndex,
    ranking: Sequence[Candidate],
    objs: Sequence[tuple[MetricRef, str]],
    rules: Rules,
    launch_sds: Sequence[float],
) -> tuple[Candidate, list[Candidate], str, Margin | None]:
    """The winner, the tie set it came from (winner included), why, and its margin
    over the best candidate the tie set left out."""
    dirs = [d for _, d in objs]
    key = objs[0][0].key
    family = rules.for_ties(len(ranking))
    tied, beaten = tie_set(ranking, lambda c, k: c.stats[k], dirs, family, launch_sds)
    leader = tied[0]
    outside = next((c for c in ranking if c not in tied), None)
    beat = next((m for c, m in beaten if c is outside), None)
    if len(tied) == 1:
        if outside is None:
            return leader, tied, f"#{leader.trial.id} is the only candidate", None
        assert beat is not None
        return (
            leader,
            tied,
            f"#{leader.trial.id} beats the runner-up #{outside.trial.id} on {key}: "
            f"{beat.describe()}",
            beat,
        )
    costs = _costs(data, index, objs[0][0])
    chosen, reason = prefer(tied, costs, rules)
    others = ", ".join(f"#{c.trial.id}" for c in tied if c is not leader)
    lead = margin(leader.stats[0], tied[1].stats[0], dirs[0], family, launch_sds[0])
    if all(_equivalent(leader, c, dirs, rules, launch_sds) for c in tied[1:]):
        far = max(
            margin(leader.stats[0], c.stats[0], dirs[0], rules, launch_sds[0]).equivalence_bound
            or 0.0
            for c in tied[1:]
        )
        within = f"{rules.threshold:.1%}".replace(".0%", "%")  # 1%, 0.5%
        return (
            chosen,
            tied,
            f"tie: #{leader.trial.id} and {others} are equivalent within ±{within} on {key} "
            f"(their differences at most {far:.1%} at {2 * rules.confidence - 1:.0%}); "
            f"picked #{chosen.trial.id}: {reason}",
            beat,
        )
    return (
        chosen,
        tied,
        f"tie: #{leader.trial.id} and {others} are not separated on {key} beyond its "
        f"uncertainty and the {rules.threshold:.0%} threshold (#{leader.trial.id} "
        f"{lead.describe()} over #{tied[1].trial.id}); "
        f"picked #{chosen.trial.id}: {reason}",
        beat,
    )


def _costs(
    data: SweepData, index: ResultIndex, ref: MetricRef
) -> dict[str, Callable[[Candidate], float | None]]:
    """What each candidate costs: GPUs held, peak GPU memory (GiB, all its GPUs), and
    the median end-to-end latency at the objective's level."""

    def gpus(c: Candidate) -> float | None:
        n = trial_gpus(data, c.trial)
        return None if n is None else float(n)

    peaks: dict[int, dict[tuple[str, int], int]] = {}
    for point in data.telemetry:
        per = peaks.setdefault(point.trial_id, {})
        slot = (point.node, point.gpu)
        per[slot] = max(per.get(slot, 0), point.used_bytes)

    def memory(c: Candidate) -> float | None:
        per = peaks.get(c.trial.id)
        if per:
            return sum(per.values()) / 2**30
        values = [
            lvl.metrics[mc.GPU_MEM_USED_MAX_MIB.name].max
            for lvl in index.levels.get(c.trial.id, ())
            if mc.GPU_MEM_USED_MAX_MIB.name in lvl.metrics
        ]
        return max(values) / 1024 if values else None

    def latency(c: Candidate) -> float | None:
        if ref.workload is None:
            return None
        lat = MetricRef(ref.workload, ref.level, E2E_MEDIAN, f"{ref.workload}.{E2E_MEDIAN}")
        return index.value(c.trial, lat)

    return {"gpus": gpus, "memory": memory, "latency": latency}


def _uncertain_notes(winner: Candidate, parsed: Sequence[Constraint]) -> list[str]:
    return [
        f"the winner's constraint {con} is uncertain: {con.ref.key} = {verdict.describe()}"
        for con, verdict in zip(parsed, winner.verdicts, strict=True)
        if verdict.state == "uncertain"
    ]


def _rank(candidates: list[Candidate], dirs: Sequence[str], rel_tol: float) -> list[Candidate]:
    """Best first: objectives in order (values within tolerance count as equal), then
    run order. A stable insertion sort keeps the tolerance comparison exact."""
    ranked: list[Candidate] = []
    for cand in sorted(candidates, key=lambda c: (c.trial.seq, c.trial.id)):
        pos = len(ranked)
        for i, other in enumerate(ranked):
            if _better(cand, other, dirs, rel_tol):
                pos = i
                break
        ranked.insert(pos, cand)
    return ranked


def _better(a: Candidate, b: Candidate, dirs: Sequence[str], rel_tol: float) -> bool:
    for x, y, d in zip(a.values, b.values, dirs, strict=True):
        cmp = _ahead(x, y, d, rel_tol)
        if cmp:
            return cmp > 0
    return False
