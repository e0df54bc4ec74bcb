"""What the confirm phase did, read from its stored steps, in words for ``best``.

The steps are the ``confirm`` events the driver stored (``decide.confirm`` decides
them): a ``round`` with the candidates it relaunched, ``round_done``, ``dropped``
(a relaunch that failed), ``done`` with why it ended, and ``reset`` when trials ran
after an earlier phase (the steps before it no longer count).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servesweep.decide.uncertainty import Margin

__all__ = ["ConfirmSummary", "confirm_note", "steps_since_reset", "summarise"]

_ENDS = {
    "separated": "separated",
    "budget": "still tied after the budget",
    "equivalent": "equivalent",
    "failed": "stopped: too few of them could be relaunched",
}


def steps_since_reset(steps: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The stored confirm steps that still count (those after the last ``reset``)."""
    last = max((i for i, s in enumerate(steps) if s.get("step") == "reset"), default=-1)
    return list(steps[last + 1 :])


@dataclass(frozen=True)
class ConfirmSummary:
    """The confirm phase of a sweep, as far as it went."""

    rounds: int
    relaunches: int
    candidates: tuple[int, ...]
    """Trial ids the first round relaunched (the tie set after the sweep, at most ``top``)."""
    reason: str
    """How it ended: ``no_tie``, ``separated``, ``equivalent`` (the candidates left
    are equivalent within the threshold: more launches cannot make a winner),
    ``budget``, ``failed``, an
    ``undecidable: ...`` line, or "" while under way (a stopped run)."""
    dropped: tuple[int, ...] = ()

    @property
    def finished(self) -> bool:
        return bool(self.reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "relaunches": self.relaunches,
            "candidates": list(self.candidates),
            "reason": self.reason or None,
            "finished": self.finished,
            "dropped": list(self.dropped),
        }


def summarise(steps: Sequence[Mapping[str, Any]]) -> ConfirmSummary | None:
    """The phase the steps describe (None: the sweep had no confirm phase)."""
    steps = steps_since_reset(steps)
    if not steps:
        return None
    rounds = [s for s in steps if s.get("step") == "round"]
    ends = [s for s in steps if s.get("step") == "done"]
    first = rounds[0] if rounds else None
    return ConfirmSummary(
        rounds=len(rounds),
        relaunches=sum(int(s.get("relaunches", 0)) for s in rounds),
        candidates=tuple(int(t) for t in first["targets"]) if first else (),
        reason=str(ends[-1].get("reason", "")) if ends else "",
        dropped=tuple(int(s["trial"]) for s in steps if s.get("step") == "dropped"),
    )


def confirm_note(
    summary: ConfirmSummary,
    leader: int,
    tied: Sequence[int],
    beaten: Sequence[tuple[int, Margin]],
    *,
    equivalent: Sequence[int] = (),
    threshold: float | None = None,
) -> str:
    """One line: ``confirm: 2 rounds, 4 relaunches of #5, #7; #7 now beats #5: leads
    by 2.1% (±0.8% at 95%)``. ``leader`` and ``tied`` are the standing now (trial ids,
    the tie set leader first), ``beaten`` the candidates of the phase the leader now
    beats decisively, with the margin; ``equivalent`` those of ``tied`` equivalent to
    the leader within ``threshold``."""
    if summary.reason == "no_tie" and not summary.rounds:
        return "confirm: nothing to confirm (the leader was not tied after the sweep)"
    within = "" if threshold is None else f" within ±{threshold:.1%}".replace(".0%", "%")
    if summary.reason == "equivalent" and not summary.rounds:
        who = " and ".join(f"#{t}" for t in (leader, *equivalent))
        return f"confirm: nothing to confirm ({who} are equivalent{within})"
    if summary.reason.startswith("undecidable") and not summary.rounds:
        return f"confirm: not run ({summary.reason})"
    rounds = f"{summary.rounds} round{'s' if summary.rounds != 1 else ''}"
    relaunches = f"{summary.relaunches} relaunch{'es' if summary.relaunches != 1 else ''}"
    who = ", ".join(f"#{t}" for t in summary.candidates)
    parts = [f"confirm: {rounds}, {relaunches} of {who}"]
    if not summary.finished:
        parts[0] += " (under way when the run stopped: run the sweep again to finish it)"
    for trial, m in beaten:
        parts.append(f"#{leader} now beats #{trial}: {m.describe()}")
    still = [t for t in tied if t in summary.candidates]
    if len(still) > 1:
        end = _ENDS.get(summary.reason, "still tied") if summary.finished else "still tied"
        if end == "separated":
            end = "still tied"
        same = [t for t in still if t in equivalent and t != leader]
        rest = [t for t in still if t not in same]
        if same:
            parts.append(f"{' and '.join(f'#{t}' for t in (leader, *same))} equivalent{within}")
            end = "still tied" if end == "equivalent" else end
        if len(rest) > 1:
            parts.append(f"{' and '.join(f'#{t}' for t in rest)} {end}")
    for trial in summary.dropped:
        parts.append(f"a relaunch of #{trial} failed")
    return "; ".join(parts)
