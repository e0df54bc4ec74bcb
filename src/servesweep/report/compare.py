"""Two sweeps, or two configurations, side by side.

Sweeps are matched by config fingerprint, workload and level; two configurations
(``trial_a``/``trial_b``) are matched by workload and level. For every metric
measured on both sides the change is given, and whether it exceeds the run-to-run
noise: the larger spread (max - min) across repeats of either side. Without
repeats on either side the noise is unknown and the change is not judged.

The text (:func:`format_comparison`) leads each configuration with the sweep's
objective and constraints, always, whatever their change; then, by default, only
the other changes that matter:
those beyond the noise (without repeats: beyond :data:`UNKNOWN_NOISE_THRESHOLD`,
relative), each marked ``better`` or ``worse`` by the direction the metric catalog
gives it; ``metrics`` chooses metrics, ``show_all`` lists every one. The load
generator's own health (:data:`~servesweep.metrics_catalog.CLIENT_HEALTH`) is listed
apart, without a verdict: it says how well the client measured, not how good the
configuration is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from servesweep.decide.refs import ResultIndex, objective_of
from servesweep.decide.stats import (
    LevelStats,
    MetricStats,
    config_label,
    format_number,
    format_stats,
    metric_names,
    printable,
)
from servesweep.errors import ConfigError, ServesweepError
from servesweep.metrics_catalog import CLIENT_HEALTH, Better, Scope, lookup
from servesweep.models import EvalTaskResult
from servesweep.records import SweepData, TrialRecord
from servesweep.report.evals import TaskFlip, task_status
from servesweep.spec.constraints import Constraint, parse_constraint

__all__ = [
    "UNKNOWN_NOISE_THRESHOLD",
    "Comparison",
    "Decision",
    "MetricChange",
    "PairedConfig",
    "compare",
    "format_comparison",
]

UNKNOWN_NOISE_THRESHOLD = 0.05
"""Without repeats, a change counts when it exceeds 5 % of A's value."""


@dataclass(frozen=True)
class MetricChange:
    workload: str
    level: str
    metric: str
    a: MetricStats
    b: MetricStats
    noise: float | None
    """Run-to-run noise: the larger max - min across repeats; None when unknown."""

    @property
    def delta(self) -> float:
        return self.b.mean - self.a.mean

    @property
    def relative(self) -> float | None:
        return None if self.a.mean == 0 else self.delta / abs(self.a.mean)

    @property
    def significant(self) -> bool | None:
        """True when the change exceeds the noise, False when it does not, None when
        the noise is unknown (no repeats)."""
        return None if self.noise is None else abs(self.delta) > self.noise

    @property
    def matters(self) -> bool:
        """Shown by default: beyond the noise, or, with the noise unknown, beyond
        :data:`UNKNOWN_NOISE_THRESHOLD` of A's value."""
        if self.significant is not None:
            return self.significant
        if self.delta == 0:
            return False
        rel = self.relative
        return rel is None or abs(rel) > UNKNOWN_NOISE_THRESHOLD

    @property
    def better(self) -> str:
        """``higher``, ``lower`` or ``neither``: which way the metric improves."""
        entry = lookup(self.metric, Scope.LEVEL) or lookup(self.metric, Scope.EVAL)
        return entry.better.value if entry is not None else Better.NEITHER.value

    @property
    def direction(self) -> str:
        """``better``, ``worse``, or ``changed`` (a metric with no better direction,
        or no change)."""
        if self.delta == 0 or self.better == Better.NEITHER.value:
            return "changed"
        up = self.delta > 0
        return "better" if up == (self.better == Better.HIGHER.value) else "worse"


@dataclass(frozen=True)
class Decision:
    """The objective or one constraint of the sweep, measured on both sides: always
    shown first, whatever its change."""

    label: str
    """``objective (max chat.c1.output_throughput)`` or the constraint's text."""
    a: MetricStats | None
    b: MetricStats | None
    direction: str | None = None
    """``max``/``min`` for the objective; None for a constraint."""
    constraint: Constraint | None = None

    @property
    def noise(self) -> float | None:
        spreads = [s.spread for s in (self.a, self.b) if s is not None and s.spread is not None]
        return max(spreads) if spreads else None


@dataclass(frozen=True)
class PairedConfig:
    """One configuration present on both sides."""

    a: TrialRecord
    b: TrialRecord
    changes: tuple[MetricChange, ...]
    flips: tuple[TaskFlip, ...]
    decisions: tuple[Decision, ...] = ()


@dataclass(frozen=True)
class Comparison:
    name_a: str
    name_b: str
    pairs: tuple[PairedConfig, ...]
    only_a: tuple[TrialRecord, ...]
    """Configurations of A with no match in B (by fingerprint)."""
    only_b: tuple[TrialRecord, ...]

    @property
    def noise_known(self) -> bool:
        return any(c.noise is not None for p in self.pairs for c in p.changes)


def _pick(data: SweepData, number: int, side: str) -> TrialRecord:
    """The trial numbered ``number`` in its sweep (``#3``)."""
    for trial in data.trials:
        if trial.number == number:
            return trial
    ids = ", ".join(str(t.number) for t in data.trials) or "none"
    raise ConfigError(f"sweep {data.sweep.name!r} has no trial {number} (trials: {ids})", key=side)


def _changes(levels_a: list[LevelStats], levels_b: list[LevelStats]) -> list[MetricChange]:
    by_key = {(lvl.workload, lvl.level): lvl for lvl in levels_b}
    out: list[MetricChange] = []
    for la in levels_a:
        lb = by_key.get((la.workload, la.level))
        if lb is None:
            continue
        for metric in metric_names([la, lb]):
            sa, sb = la.metrics.get(metric), lb.metrics.get(metric)
            if sa is None or sb is None or not (math.isfinite(sa.mean) and math.isfinite(sb.mean)):
                continue
            spreads = [s for s in (sa.spread, sb.spread) if s is not None]
            noise = max(spreads) if spreads else None
            out.append(MetricChange(la.workload, la.level, metric, sa, sb, noise))
    return out


def _flips(a: SweepData, ta: TrialRecord, b: SweepData, tb: TrialRecord) -> list[TaskFlip]:
    def statuses(data: SweepData, trial: TrialRecord) -> dict[tuple[str, str], str]:
        tasks: dict[tuple[str, str], list[EvalTaskResult]] = {}
        for res in data.results.get(trial.id, ()):
            for task in res.eval_results:
                tasks.setdefault((res.workload, task.task_id), []).append(task)
        return {k: task_status(v) for k, v in tasks.items()}

    sa, sb = statuses(a, ta), statuses(b, tb)
    return [
        TaskFlip(w, t, ((ta.number, sa[(w, t)]), (tb.number, sb[(w, t)])))
        for (w, t) in sorted(sa.keys() & sb.keys())
        if (sa[(w, t)] == "pass") != (sb[(w, t)] == "pass")
    ]


def compare(
    a: SweepData, b: SweepData, *, trial_a: int | None = None, trial_b: int | None = None
) -> Comparison:
    """Compare two sweeps (configurations matched by fingerprint), or, with
    ``trial_a`` and ``trial_b``, two configurations (``a`` and ``b`` may be the same
    sweep). Raises ConfigError when a named trial does not exist."""
    ia, ib = ResultIndex(a), ResultIndex(b)
    if (trial_a is None) != (trial_b is None):
        raise ConfigError("give both trials to compare two configurations, or neither")
    if trial_a is not None and trial_b is not None:
        pairs_raw = [(_pick(a, trial_a, "trial_a"), _pick(b, trial_b, "trial_b"))]
        only_a: tuple[TrialRecord, ...] = ()
        only_b: tuple[TrialRecord, ...] = ()
    else:
        b_by_fp: dict[str, TrialRecord] = {}
        for trial in sorted(b.trials, key=lambda t: (t.seq, t.id)):
            b_by_fp.setdefault(trial.fingerprint, trial)
        a_fps = {t.fingerprint for t in a.trials}
        pairs_raw = [
            (t, b_by_fp[t.fingerprint])
            for t in sorted(a.trials, key=lambda t: (t.seq, t.id))
            if t.fingerprint in b_by_fp
        ]
        only_a = tuple(t for t in a.trials if t.fingerprint not in b_by_fp)
        only_b = tuple(t for t in b.trials if t.fingerprint not in a_fps)
    pairs = tuple(
        PairedConfig(
            ta,
            tb,
            tuple(_changes(ia.levels.get(ta.id, []), ib.levels.get(tb.id, []))),
            tuple(_flips(a, ta, b, tb)),
            tuple(_decisions(a, ia, ta, b, ib, tb)),
        )
        for ta, tb in pairs_raw
    )
    name_a = f"{a.sweep.name} (#{a.sweep.id})"
    name_b = f"{b.sweep.name} (#{b.sweep.id})"
    return Comparison(name_a, name_b, pairs, only_a, only_b)


def _decisions(
    a: SweepData, ia: ResultIndex, ta: TrialRecord, b: SweepData, ib: ResultIndex, tb: TrialRecord
) -> list[Decision]:
    """B's objective and constraints (A's when B has none), on both sides."""
    out: list[Decision] = []
    for data in (b, a):
        try:
            found = objective_of(data)
            constraints = [parse_constraint(text) for text in data.constraints]
        except ServesweepError:
            continue
        if found is None and not constraints:
            continue
        if found is not None:
            ref, direction = found
            label = f"objective ({direction} {ref.key})"
            out.append(Decision(label, ia.stats(ta, ref), ib.stats(tb, ref), direction))
        for c in constraints:
            out.append(Decision(str(c), ia.stats(ta, c.ref), ib.stats(tb, c.ref), constraint=c))
        break
    return out


def _decision_line(d: Decision) -> str:
    a = "-" if d.a is None else format_stats(d.a)
    b = "-" if d.b is None else format_stats(d.b)
    if d.constraint is not None:

        def met(stats: MetricStats | None) -> str:
            ok = d.constraint.check(None if stats is None else stats.mean) if d.constraint else None
            return {True: "met", False: "violated", None: "not measured"}[ok]

        return f"  {d.label}: A {a} ({met(d.a)}), B {b} ({met(d.b)})"
    line = f"  {d.label}: A {a}, B {b}"
    if d.a is None or d.b is None:
        return line
    delta = d.b.mean - d.a.mean
    line += "  " + ("+" if delta >= 0 else "") + format_number(delta)
    if d.a.mean:
        line += f" ({delta / abs(d.a.mean):+.1%})"
    if delta == 0:
        return line + "  no change"
    word = "better" if (delta > 0) == (d.direction == "max") else "worse"
    noise = d.noise
    if noise is None:
        return line + f"  {word} (noise unknown)"
    if abs(delta) > noise:
        return line + f"  {word}, exceeds noise {format_number(noise)}"
    return line + f"  within noise {format_number(noise)}"


def _verdict(change: MetricChange) -> str:
    if change.significant is None:
        return "noise unknown"
    assert change.noise is not None
    if change.significant:
        return f"exceeds noise {format_number(change.noise)}"
    return f"within noise {format_number(change.noise)}"


def _chosen(change: MetricChange, metrics: Sequence[str]) -> bool:
    full = f"{change.workload}.{change.level}.{change.metric}"
    return any(m in (change.metric, full, f"{change.workload}.{change.metric}") for m in metrics)


def format_comparison(
    comparison: Comparison, *, metrics: Sequence[str] = (), show_all: bool = False
) -> str:
    """Plain text: one block per matched configuration, one line per metric that
    changed beyond the noise (every metric with ``show_all``; the ``metrics`` named,
    by name or full reference, whatever their change), marked better or worse."""
    lines = [f"A = {comparison.name_a}, B = {comparison.name_b}"]
    if not comparison.noise_known:
        lines.append(
            "noise unknown: no repeats on either side (set 'repeats' on the workloads); "
            f"changes above {UNKNOWN_NOISE_THRESHOLD:.0%} are shown"
        )
    known = {c.metric for p in comparison.pairs for c in p.changes}
    missing = [m for m in metrics if not any(_chosen_name(m, k) for k in known)]
    if missing:
        raise ConfigError(
            f"no metric {', '.join(map(repr, missing))} was measured on both sides "
            f"(metrics: {', '.join(sorted(known)) or 'none'})",
            key="--metric",
        )
    quiet = 0
    for pair in comparison.pairs:
        lines.append(f"A {config_label(pair.a)} <-> B {config_label(pair.b)}")
        if pair.a.outcome != pair.b.outcome:
            lines.append(f"  outcome: {pair.a.outcome.value} -> {pair.b.outcome.value}")
        lines += [_decision_line(d) for d in pair.decisions]
        decided = {
            d.constraint.ref.key if d.constraint else _ref_key(d.label) for d in pair.decisions
        }
        ordinary = [
            c for c in pair.changes
            if f"{c.workload}.{c.level}.{c.metric}" not in decided and c.metric not in CLIENT_HEALTH
        ]  # fmt: skip
        health = [c for c in pair.changes if c.metric in CLIENT_HEALTH]
        if metrics:
            shown = [c for c in ordinary if _chosen(c, metrics)]
            health = [c for c in health if _chosen(c, metrics)]
        elif show_all:
            shown = list(ordinary)
        else:
            shown = [c for c in ordinary if c.matters]
            health = [c for c in health if c.matters]
        quiet += len(ordinary) - len(shown)
        rows = [
            (
                f"{c.workload}.{c.level}.{c.metric}",
                format_stats(c.a),
                format_stats(c.b),
                ("+" if c.delta >= 0 else "") + format_number(c.delta),
                "" if c.relative is None else f"{c.relative:+.1%}",
                c.direction if c.matters else "",
                _verdict(c),
            )
            for c in shown
        ]
        if rows:
            widths = [max(len(r[i]) for r in rows) for i in range(6)]
            for row in rows:
                cells = [row[0].ljust(widths[0])] + [row[i].rjust(widths[i]) for i in range(1, 5)]
                cells.append(row[5].ljust(widths[5]))
                lines.append(("  " + "  ".join(cells) + "  " + row[6]).rstrip())
        elif not pair.changes:
            lines.append("  no metric measured on both sides")
        else:
            lines.append("  no other change beyond the noise")
        if health:
            lines.append(
                "  load generator health (the client's own, not the configuration's): "
                + "; ".join(
                    f"{c.workload}.{c.level}.{c.metric} {format_stats(c.a)} -> {format_stats(c.b)}"
                    for c in health
                )
            )
        for flip in pair.flips:
            states = ", ".join(f"#{t} {s}" for t, s in flip.statuses)
            lines.append(f"  flipped {flip.workload}/{flip.task_id}: {states}")
    for side, trials in (("A", comparison.only_a), ("B", comparison.only_b)):
        for trial in trials:
            lines.append(f"only in {side}: {config_label(trial)} ({trial.outcome.value})")
    if quiet and not show_all:
        what = "not chosen" if metrics else "within the noise (or, without repeats, 5 %)"
        lines.append(f"{quiet} metric change(s) {what} not shown (--all lists every metric)")
    return "\n".join(printable(" ".join(line.splitlines())) for line in lines)


def _ref_key(label: str) -> str:
    """``objective (max chat.c1.output_throughput)`` -> ``chat.c1.output_throughput``."""
    return label.rsplit(" ", 1)[-1].rstrip(")")


def _chosen_name(name: str, metric: str) -> bool:
    return name == metric or name.endswith("." + metric)
