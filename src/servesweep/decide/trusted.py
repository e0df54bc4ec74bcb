"""Decisions that rest on an acceptance length that cannot be trusted.

``best`` asks :func:`untrusted_figures` which of the levels it decided on (the
objectives' and the constraints') measured speculative decoding on text real traffic
does not look like (random-token prompts, ``ignore_eos``: the rule is
:mod:`servesweep.decide.acceptance`). Two cases:

- *direct*: the decision reads ``acceptance_length`` itself;
- *indirect*: it reads another metric (throughput, latency) of a level whose
  speculative decoding ran on such text: the speed-up the draft brought there, good or
  bad, is not what real traffic gets either.

Either way the winner is still named, and a note says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servesweep.decide.acceptance import REAL_TEXT, UNTRUSTED_MARK, AcceptanceContext
from servesweep.decide.refs import ResultIndex
from servesweep.decide.stats import LevelStats
from servesweep.metrics_catalog import ACCEPTANCE_LENGTH
from servesweep.records import TrialRecord
from servesweep.spec.constraints import MetricRef

__all__ = ["Untrusted", "untrusted_figures", "untrusted_notes"]


@dataclass(frozen=True)
class Untrusted:
    """A figure a decision used whose level's acceptance length is not trusted."""

    ref: str
    """The reference the decision read (``chat.c4.output_throughput``)."""
    workload: str
    level: str
    context: AcceptanceContext
    direct: bool
    """True when the figure is the acceptance length itself."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.ref,
            "workload": self.workload,
            "level": self.level,
            "direct": self.direct,
            **self.context.to_info(),
        }


def _levels(index: ResultIndex, trial: TrialRecord, ref: MetricRef) -> list[LevelStats]:
    if ref.workload is None:
        return []
    return [
        lvl
        for lvl in index.levels.get(trial.id, ())
        if lvl.workload == ref.workload and ref.level in (None, lvl.level)
    ]


def untrusted_figures(
    index: ResultIndex, trial: TrialRecord, refs: Sequence[MetricRef]
) -> list[Untrusted]:
    """The figures among ``refs`` (objectives, then constraints) that ``trial``'s
    decision read from a level with an untrusted acceptance length, each reference once."""
    found: dict[str, Untrusted] = {}
    for ref in refs:
        for lvl in _levels(index, trial, ref):
            ctx = lvl.acceptance
            if ctx is None or ctx.trusted or ref.key in found:
                continue
            direct = ref.metric == ACCEPTANCE_LENGTH.name
            found[ref.key] = Untrusted(ref.key, lvl.workload, lvl.level, ctx, direct)
    return list(found.values())


def untrusted_notes(untrusted: Sequence[Untrusted]) -> list[str]:
    """``best``'s notes on ``untrusted``: one line per workload, naming its figures.

    A workload's levels share their prompts and mode, so a winner decided on several of
    its metrics (throughput at one level, latency at another) gets one note, not one
    per metric."""
    by_workload: dict[str, list[Untrusted]] = {}
    for u in untrusted:
        by_workload.setdefault(u.workload, []).append(u)
    notes = []
    for figures in by_workload.values():
        why = figures[0].context.reasons
        direct = [u.ref for u in figures if u.direct]
        indirect = [u.ref for u in figures if not u.direct]
        heads = []
        if direct:
            heads.append(f"{', '.join(direct)} {_decide(direct)} here but "
                         f"{_was(direct)} measured on {why}")  # fmt: skip
        if indirect:
            heads.append(
                f"{', '.join(indirect)} {_was(indirect)} measured with speculative decoding "
                f"on {why}: the speed-up the draft brought there is not what real traffic gets"
            )
        notes.append(
            f"untrusted acceptance ({UNTRUSTED_MARK}): {'; '.join(heads)}; measure the winner "
            f"on {REAL_TEXT} before trusting it"
        )
    return notes


def _decide(refs: Sequence[str]) -> str:
    return "decides" if len(refs) == 1 else "decide"


def _was(refs: Sequence[str]) -> str:
    return "was" if len(refs) == 1 else "were"
