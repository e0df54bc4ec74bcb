"""The confirm phase: which tied candidates are launched again, or done.

Pure decisions, no processes: after the grid or the search, the driver asks
:func:`decide` and carries the answer out (queueing each trial for more launches of
its configuration, stored as further launches of the same trial, so its intervals
combine within- and between-launch variation). It asks again after every round.
The rules (successive elimination):

* the candidates are the tie set of ``best`` (the leader and those it does not beat
  beyond uncertainty and the practical threshold), in ranking order, at most ``top``
  of them in the first round; a later round keeps only those of the round before
  that are still tied (a candidate once beaten is never relaunched again), less the
  ones whose relaunch failed;
* a candidate equivalent to the leader (``decide.uncertainty.Margin.equivalent``: the
  difference's interval lies inside ``± decision.threshold``, an equivalence test as
  in TOST) is not relaunched: more launches cannot make either the winner;
* fewer than two candidates left: done (``equivalent`` when the others left were
  equivalent to the leader, ``separated``, or ``no_tie`` when the sweep ended without
  a tie);
* each candidate of a round gets ``launches`` more launches, fewer when the budget
  has less room (an equal share for each); none left: done (``budget``), as when the
  phase's time budget is spent. The budget is what the rounds since the phase began
  added, so a phase begun anew (trials ran since) has all of it;
* a round that was under way when a run stopped is finished first (the launches it
  planned and that are not stored yet), so a rerun continues the confirm where it was.

The history is what the driver stored (:class:`Round`, one per round started) and the
launches the results database holds: a rerun decides exactly as the killed run would
have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from servesweep.spec.schema import ConfirmSpec

__all__ = ["Done", "Relaunch", "Round", "cost", "decide", "spent_launches"]


@dataclass(frozen=True)
class Round:
    """One round as stored: the launches each candidate has when it is done."""

    number: int
    targets: Mapping[int, int]
    """Trial id -> launches stored once the round is done."""
    done: bool = False
    seconds: float = 0.0
    """How long the round took (0 while under way)."""
    relaunches: int = 0
    """The launches it adds (what it costs of the budget)."""


@dataclass(frozen=True)
class Relaunch:
    """Launch these trials again: ``more[trial]`` launches each, in round ``round``."""

    round: int
    more: Mapping[int, int]
    targets: Mapping[int, int] = field(default_factory=dict)
    new: bool = True
    """False: finishing a round a stopped run had begun."""


@dataclass(frozen=True)
class Done:
    reason: str
    """``no_tie``, ``separated``, ``equivalent`` (the candidates left are equivalent
    to the leader within the threshold), ``budget`` or ``failed`` (too few candidates
    whose relaunches work)."""


def spent_launches(launches: Mapping[int, int], base: int) -> int:
    """Extra launches stored beyond each trial's own ``base`` launches."""
    return sum(max(0, n - base) for n in launches.values())


def decide(
    spec: ConfirmSpec,
    tied: Sequence[int],
    launches: Mapping[int, int],
    rounds: Sequence[Round],
    *,
    dropped: frozenset[int] = frozenset(),
    elapsed_s: float = 0.0,
    equivalent: frozenset[int] = frozenset(),
) -> Relaunch | Done:
    """What the confirm phase does next.

    ``tied``: the tie set now, leader first (ranking order); ``launches``: launches
    stored per trial; ``rounds``: the rounds so far; ``dropped``: trials whose relaunch failed;
    ``elapsed_s``: seconds the finished rounds took; ``equivalent``: those of ``tied``
    equivalent to the leader within the threshold."""
    last = rounds[-1] if rounds else None
    if last is not None and not last.done:
        more = {
            t: n - launches.get(t, 0)
            for t, n in last.targets.items()
            if t not in dropped and n > launches.get(t, 0)
        }
        if more:
            return Relaunch(last.number, more, dict(last.targets), new=False)
    alive = [t for t in tied if t not in dropped]
    # the first round takes the top of the tie set; a later one only who is left of it
    alive = alive[: spec.top] if last is None else [t for t in alive if t in last.targets]
    same = [t for t in alive if t in equivalent]
    alive = [t for t in alive if t not in equivalent]
    if len(alive) < 2:
        if same:
            return Done("equivalent")
        if last is None:
            return Done("no_tie")
        still = [t for t in tied if t in last.targets]
        return Done("failed" if len(still) >= 2 else "separated")
    limit = spec.max_seconds
    if limit is not None and elapsed_s >= limit:
        return Done("budget")
    room = spec.max_launches - sum(r.relaunches for r in rounds)
    each = min(spec.launches, room // len(alive))
    if each < 1:
        return Done("budget")
    number = 1 if last is None else last.number + 1
    more = dict.fromkeys(alive, each)
    targets = {t: launches.get(t, 0) + each for t in alive}
    return Relaunch(number, more, targets)


def cost(step: Relaunch) -> int:
    """The launches a round adds."""
    return sum(step.more.values())
