"""``servesweep best`` written out: the decision of :func:`servesweep.decide.best.find_best`
as text for the terminal and as JSON (``best --json``). It renders; the decision and
its reasons are :mod:`servesweep.decide.best`'s."""

from __future__ import annotations

from typing import Any

from servesweep.decide.acceptance import UNTRUSTED_MARK
from servesweep.decide.best import BestResult, Candidate
from servesweep.decide.stats import format_number, printable

__all__ = ["best_to_json", "format_best", "untrusted_suffix"]


def untrusted_suffix(result: BestResult) -> str:
    """After the winner's name when it rests on an untrusted acceptance length."""
    if not result.untrusted:
        return ""
    what = "on" if any(u.direct for u in result.untrusted) else "with speculative decoding on"
    return f" ({UNTRUSTED_MARK} decided {what} an untrusted acceptance figure: see note)"


def format_best(result: BestResult) -> str:
    """A plain-text explanation of the decision, for the terminal."""
    objs = ", ".join(f"{d} {k}" for k, d in result.objectives)
    cons = "; ".join(result.constraints) or "none"
    lines: list[str] = []
    if result.winner is None:
        lines.append(f"no feasible configuration (objective: {objs}; constraints: {cons})")
    else:
        win = result.winner
        lines.append(f"best: {win.label}{untrusted_suffix(result)}")
        for (key, d), stats in zip(result.objectives, win.stats, strict=True):
            bits = []
            if stats.lo is not None and stats.hi is not None:
                bits.append(
                    f"{(stats.confidence or 0.95):.0%} interval "
                    f"{format_number(stats.lo)}..{format_number(stats.hi)}"
                )
            if stats.spread is not None:
                bits.append(
                    f"repeats {stats.n}: {format_number(stats.min)}..{format_number(stats.max)}"
                )
            shown = f" ({'; '.join(bits)})" if bits else ""
            lines.append(f"  {d} {key} = {format_number(stats.mean)}{shown}")
        for con, verdict in zip(result.constraints, win.verdicts, strict=True):
            lines.append(f"  constraint {con}: {verdict.describe()}")
        held = result.costs.headline(win.trial) if result.costs else ""
        if held:
            lines.append(f"  cost: {held}")
        if win.trial.launch_command:
            lines.append(f"  launch: {win.trial.launch_command}")
    for note in result.notes:
        lines.append(f"note: {note}")
    if result.pareto:
        lines.append(f"Pareto set ({objs}):")
        for cand in result.pareto:
            vals = ", ".join(format_number(v) for v in cand.values)
            lines.append(f"  {cand.label}: {vals}")
    if len(result.ranking) > 1:
        lines.append("ranking:")
        for i, cand in enumerate(result.ranking, 1):
            vals = ", ".join(format_number(v) for v in cand.values)
            held = result.costs.describe(cand.trial) if result.costs else ""
            lines.append(f"  {i}. {cand.label}: {vals}" + (f" [{held}]" if held else ""))
    if result.excluded:
        lines.append("excluded:")
        for exc in result.excluded:
            lines.append(f"  {exc.label}: {exc.reason}")
    if result.winner is None:
        lines.append(
            "try: loosen a constraint (--constraint), check the failures above "
            "(servesweep report), or rerun failed trials (servesweep run --retry-failed)"
        )
    return "\n".join(printable(" ".join(line.splitlines())) for line in lines)


def _candidate_json(result: BestResult, cand: Candidate) -> dict[str, Any]:
    return {
        "trial": cand.trial.id,
        "seq": cand.trial.seq,
        "fingerprint": cand.trial.fingerprint,
        "params": dict(cand.trial.params),
        "label": cand.label,
        "values": {k: v for (k, _), v in zip(result.objectives, cand.values, strict=True)},
        "stats": {k: s.to_dict() for (k, _), s in zip(result.objectives, cand.stats, strict=True)},
        "constraint_values": dict(zip(result.constraints, cand.constraint_values, strict=True)),
        "constraint_verdicts": {
            con: {"state": v.state, "value": v.value, "lo": v.lo, "hi": v.hi, "advice": v.advice}
            for con, v in zip(result.constraints, cand.verdicts, strict=True)
        },
        "launch_command": cand.trial.launch_command,
        **(result.costs.of(cand.trial).to_dict() if result.costs else {}),
        "config_mismatch": [
            {k: m.get(k) for k in ("param", "asked", "engine", "source")}
            for m in result.mismatches.get(cand.trial.id, ())
        ],
    }


def best_to_json(result: BestResult) -> dict[str, Any]:
    """The decision as JSON-ready data (``servesweep best --json``)."""
    return {
        "sweep": result.sweep_name,
        "feasible": result.feasible,
        "objectives": [{"metric": k, "direction": d} for k, d in result.objectives],
        "constraints": list(result.constraints),
        "rel_tol": result.rel_tol,
        "decision": {
            "decided": result.decided,
            "why": result.why,
            "confidence": result.rules.confidence,
            "threshold": result.rules.threshold,
            "prefer": list(result.rules.prefer),
            "launch_sd": list(result.launch_sds),
            "equivalent": [c.trial.id for c in result.equivalent],
            "acceptance_trusted": not result.untrusted,
            "untrusted_acceptance": [u.to_dict() for u in result.untrusted],
            "runner_up_margin": None
            if result.runner_up is None
            else {
                "lead": result.runner_up.lead,
                "relative": result.runner_up.relative,
                "uncertainty": result.runner_up.uncertainty,
            },
        },
        "confirm": None
        if result.confirm is None
        else {**result.confirm.to_dict(), "note": result.confirm_note},
        "screening": None
        if result.screening is None
        else {**result.screening.to_dict(), "note": result.screening_note},
        "cost": None if result.costs is None else result.costs.to_dict(),
        "best": None if result.winner is None else _candidate_json(result, result.winner),
        "ties": [_candidate_json(result, c) for c in result.ties],
        "pareto": [_candidate_json(result, c) for c in result.pareto],
        "ranking": [_candidate_json(result, c) for c in result.ranking],
        "excluded": [
            {
                "trial": e.trial.id,
                "label": e.label,
                "kind": e.kind,
                "reason": e.reason,
                "failure_class": e.trial.failure_class.value if e.trial.failure_class else None,
                "metric": e.metric,
                "value": e.value,
                "constraint": e.constraint,
            }
            for e in result.excluded
        ],
        "notes": list(result.notes),
    }
