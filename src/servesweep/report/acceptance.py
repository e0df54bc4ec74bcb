"""Decisions that rest on an acceptance length that cannot be trusted.

``best`` asks :func:`untrusted_figures` which of the levels it decided on (the
objectives' and the constraints') measured speculative decoding on text real traffic
does not look like (random-token prompts, ``ignore_eos``: the rule is
:mod:`servesweep.acceptance`). Two cases:

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

from servesweep.acceptance import REAL_TEXT, UNTRUSTED_MARK, AcceptanceContext
from servesweep.metrics_catalog import ACCEPTANCE_LENGTH
from servesweep.report.data import LevelStats
from servesweep.report.refs import ResultIndex
from servesweep.spec.constraints import MetricRef
from servesweep.store.records import TrialRecord

__all__ = ["Untrusted", "untrusted_figures"]


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

    def note(self) -> str:
        """One line for ``best``'s notes."""
        why = self.context.reasons
        if self.direct:
            head = f"{self.ref} decides here but was measured on {why}"
        else:
            head = (
                f"{self.ref} was measured with speculative decoding on {why}: the speed-up "
                "the draft brought there is not what real traffic gets"
            )
        return (
            f"untrusted acceptance ({UNTRUSTED_MARK}): {head}; measure the winner on "
            f"{REAL_TEXT} before trusting it"
        )

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
