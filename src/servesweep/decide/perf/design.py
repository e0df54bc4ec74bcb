"""Which configuration a sampling search launches next when it predicts performance:
the first launches chosen for what they teach the predictor, then the predictor's own
choice, and the sampler's only where the predictor knows nothing that can still win.

A launch is the cost of a sweep, so the first ones are chosen as an experimental
design, not at random (:func:`design_point`):

1. the longest draft length of the space, every other numeric knob at the middle of
   its range (log scale where its values span a factor of 4 or more): one launch's
   acceptance per draft position gives the accepted length of every shorter draft,
   and the middle is a step from every other value of each knob, where the empirical
   model (``empirical``) reaches farthest from one measurement;
2. the same configuration without speculation (the shortest draft length of the
   space): the other end of the cost of a step, so that the step cost against the
   draft length and the batch is fitted, and with it the throughput of every draft
   length at those knobs (``speculative``).

Ties (two values equally near the middle) are broken by the sweep's seed. A design
configuration already measured, skipped or forbidden is passed over; a space without
a draft-length knob has only the first. The design has two roles, not two launch
slots: what the sweep measured before it (``params.points``, which a search hands out
first) fills a role when it is at that end of the draft lengths, so a no-draft baseline
point measured first leaves the design only its longest draft length, and a point in
between leaves it both. A search started warm (earlier sweeps' measurements,
``search/sampled.py``) has no design: the predictor already knows the space, and
:func:`next_launch` picks from the first launch.

Then :func:`next_launch` on the predictions of every configuration not measured yet:
the predicted best when its value beats the leader (of the configurations predicted
within the noise of one launch of it, which the prediction cannot tell apart, the one
with the narrowest interval: the surest, a step from what was measured); else, among
those whose interval still reaches the leader's value by the decision threshold, the
one whose interval reaches farthest (the most it could still win); else none, and the
sampler proposes.
What it picks the performance gate launches too (its interval reaches the leader's
value), so the two never disagree about it.

The guide adds no launch that is likely to run out of memory (:func:`memory_safe`; the
memory gate still judges every launch, the sampler's too): it picks only among the
configurations predicted to fit without using the memory gate's margin (a prediction
over the capacity but within the margin is launched by the gate, and such a launch is
the likeliest to crash), and after a trial crashed out of memory, never one that
raises every numeric knob that trial had (the same other knobs, each numeric one as
large or larger) and is predicted to need at least as much memory as it: expected to
crash the same way. Where none is left, the sampler proposes.

Pure functions over plain records; no I/O.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from servesweep.decide.perf.empirical import Features
from servesweep.decide.perf.gate import rules_out
from servesweep.decide.perf.records import Prediction
from servesweep.spec.constraints import Constraint

__all__ = [
    "design_point",
    "first_launch",
    "memory_safe",
    "next_launch",
    "partner",
]


def _draft_value(params: Mapping[str, Any], draft: str | None) -> float:
    if draft is None:
        return 0.0
    value = params.get(draft, 0)
    return float(value) if _numeric(value) else 0.0


def _off_centre(features: Features, params: Mapping[str, Any]) -> float:
    """Squared distance of the knobs but the draft length from the middle of their
    ranges (normalized to 0-1, log scale where the empirical model uses it)."""
    total = 0.0
    for knob, (low, high, log, _) in features.numeric.items():
        if knob == features.draft:
            continue
        value = params.get(knob, low)
        if not isinstance(value, int | float) or high <= low:
            continue
        v = float(value)
        u = math.log(v / low) / math.log(high / low) if log else (v - low) / (high - low)
        total += (u - 0.5) ** 2
    return round(total, 9)  # values equally near the middle tie (the seed chooses)


def _rest(params: Mapping[str, Any], draft: str | None) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k != draft}


def first_launch(
    space: Sequence[Mapping[str, Any]], draft: str | None, seed: object
) -> Mapping[str, Any] | None:
    """The design's first configuration among ``space`` (see the module doc)."""
    if not space:
        return None
    features = Features.of(space, draft)
    longest = max(_draft_value(p, draft) for p in space)
    tie = random.Random(f"design:{seed}")
    keyed = [(_off_centre(features, p), tie.random(), i) for i, p in enumerate(space)]
    return space[min(k for k in keyed if _draft_value(space[k[2]], draft) == longest)[2]]


def partner(
    space: Sequence[Mapping[str, Any]], draft: str | None, measured: Mapping[str, Any]
) -> Mapping[str, Any] | None:
    """The design's second configuration: ``measured`` at the shortest draft length of
    ``space`` (None: no draft-length knob, or ``measured`` is that already)."""
    if draft is None or not space:
        return None
    shortest = min(_draft_value(p, draft) for p in space)
    if _draft_value(measured, draft) == shortest:
        return None
    rest = _rest(measured, draft)
    for p in space:
        if _draft_value(p, draft) == shortest and _rest(p, draft) == rest:
            return p
    return None


def design_point(
    space: Sequence[Mapping[str, Any]],
    draft: str | None,
    seed: object,
    left: Sequence[Mapping[str, Any]],
    measured: Sequence[Mapping[str, Any]],
) -> Mapping[str, Any] | None:
    """The design's next configuration among ``left`` (the configurations of ``space``
    not measured, skipped or forbidden yet), given the configurations ``measured`` so
    far; None: the design is over (both its roles filled, or its next configuration
    gone). The first role, the longest draft length still to be had (among those left
    and measured; the middle alone without a draft-length knob), is chosen among those
    left while nothing measured is at that length (so one skipped as not fitting gives
    way to the next nearest the middle, and where every configuration of the longest
    is gone, the next length takes the role once); the second, the shortest draft
    length, is the partner of the first measured at the longest, while nothing
    measured is at the shortest."""
    if not space:
        return None
    if draft is None:
        return None if measured else first_launch(left, None, seed)
    shortest = min(_draft_value(p, draft) for p in space)
    longest = max((_draft_value(p, draft) for p in (*left, *measured)), default=shortest)
    if longest <= shortest:
        return None if measured else first_launch(left, draft, seed)
    at_longest = [m for m in measured if _draft_value(m, draft) == longest]
    if not at_longest:
        return first_launch(left, draft, seed)
    if any(_draft_value(m, draft) == shortest for m in measured):
        return None
    pick = partner(space, draft, at_longest[0])
    return pick if pick is not None and pick in left else None


def next_launch(
    predictions: Sequence[Mapping[str, Prediction]],
    objective: str,
    direction: Literal["max", "min"],
    constraints: Sequence[Constraint],
    leader: float | None,
    threshold: float,
    tie: float = 0.02,
) -> int | None:
    """The index of the configuration to launch next among those not measured yet
    (their ``predictions``), or None when no known prediction can still win (the
    sampler's turn); see the module doc. Predicted values within ``tie`` (relative: the
    noise of one launch) of the predicted best are not told apart by the prediction:
    of those, the one with the narrowest interval (the surest, a step from what was
    measured) is launched."""
    sign = 1.0 if direction == "max" else -1.0
    bar = None if leader is None else sign * leader + threshold * abs(leader)
    able: list[tuple[float, float, float, int]] = []  # value, top, width, index
    for i, preds in enumerate(predictions):
        p = preds.get(objective)
        if p is None or p.value is None or p.low is None or p.high is None:
            continue
        if any(rules_out(preds.get(c.ref.key), c) for c in constraints):
            continue
        top = sign * (p.high if direction == "max" else p.low)
        if bar is not None and top < bar:
            continue  # its whole interval is below the leader's by the threshold
        able.append((sign * p.value, top, p.high - p.low, i))
    if not able:
        return None
    best = max(a[0] for a in able)
    if leader is None or best > sign * leader:
        tied = [a for a in able if a[0] >= best - tie * abs(best)]
        return min(tied, key=lambda a: (a[2], -a[0], a[3]))[3]
    return max(able, key=lambda a: (a[1], -a[3]))[3]


def _numeric(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _raises(params: Mapping[str, Any], crashed: Mapping[str, Any]) -> bool:
    """``params`` has every knob of ``crashed``: the same non-numeric values, each
    numeric one as large or larger."""
    if params.keys() != crashed.keys():
        return False
    for knob, value in crashed.items():
        other = params[knob]
        if _numeric(value) and _numeric(other):
            if float(other) < float(value):
                return False
        elif other != value:
            return False
    return True


def memory_safe(
    candidates: Sequence[Mapping[str, Any]],
    over_by: Sequence[int | None],
    crashed: Sequence[tuple[Mapping[str, Any], int | None]],
) -> list[bool]:
    """Which of ``candidates`` the guide may pick (see the module doc): ``over_by`` is
    each one's predicted memory beyond its capacity (bytes; negative or 0: it fits;
    None: unknown), ``crashed`` the configurations that ran out of memory with theirs.
    A candidate predicted over its capacity (within the gate's margin, or the gate
    would not launch it) is left out; so is one that raises every knob of a crashed
    configuration and is predicted to need at least as much beyond the capacity (an
    unknown prediction on either side: the knobs decide)."""
    out = []
    for params, over in zip(candidates, over_by, strict=True):
        safe = over is None or over <= 0
        for crash, crash_over in crashed:
            if not safe:
                break
            same_or_more = over is None or crash_over is None or over >= crash_over
            safe = not (same_or_more and _raises(params, crash))
        out.append(safe)
    return out
