"""Whether a speculative-decoding acceptance length can be trusted: the text it was
measured on.

A draft model predicts code, math and chat differently, and two ways of measuring
make the figure meaningless for real traffic: random-token prompts (``dataset:
synthetic``), whose continuations no draft model can predict, and ``ignore_eos``,
which makes the model write past its own end, text it would never send (it collapses
to repetition the draft predicts trivially, or to noise it cannot). Acceptance from
either collapses or inflates against real traffic, and so does the speed-up measured
with it.

The load generator records an :class:`AcceptanceContext` with every level that has an
acceptance length (``info.acceptance_context``); every report reads it back with
:meth:`AcceptanceContext.of_info` (which also rebuilds it for a level stored before it
was recorded) and marks an untrusted figure with :data:`UNTRUSTED_MARK`. Pure data, no
I/O: this is the one home of the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "REAL_TEXT",
    "UNTRUSTED_MARK",
    "AcceptanceContext",
    "acceptance_caveat",
    "untrusted_reasons",
]

UNTRUSTED_MARK = "?"
"""After an acceptance length measured on text real traffic does not look like."""


REAL_TEXT = "a real dataset (builtin:chat, builtin:coding, builtin:math) without ignore_eos"
"""What to measure acceptance on instead."""


def untrusted_reasons(dataset: str, ignore_eos: bool) -> str | None:
    """``random-token prompts (dataset synthetic) and ignore_eos (...)``, or None."""
    why = []
    if dataset == "synthetic":
        why.append("random-token prompts (dataset synthetic)")
    if ignore_eos:
        why.append("ignore_eos (text generated past the model's own end)")
    return " and ".join(why) or None


def acceptance_caveat(dataset: str, ignore_eos: bool) -> str | None:
    """Why an acceptance length measured on ``dataset`` (with ``ignore_eos``) cannot be
    trusted, or None when it can."""
    why = untrusted_reasons(dataset, ignore_eos)
    if why is None:
        return None
    return (
        f"acceptance length measured on {why} is not what real traffic gets: compare "
        f"it only with the same workload; use {REAL_TEXT} to judge it"
    )


@dataclass(frozen=True)
class AcceptanceContext:
    """The dataset and mode an acceptance length was measured in."""

    dataset: str
    ignore_eos: bool
    endpoint: str | None = None
    """``chat`` or ``completions`` (None: not recorded)."""

    @property
    def caveat(self) -> str | None:
        return acceptance_caveat(self.dataset, self.ignore_eos)

    @property
    def reasons(self) -> str | None:
        """Why not trusted, in a few words (None: trusted)."""
        return untrusted_reasons(self.dataset, self.ignore_eos)

    @property
    def trusted(self) -> bool:
        return self.caveat is None

    def describe(self) -> str:
        """``dataset builtin:chat, chat endpoint, ignore_eos``."""
        bits = [f"dataset {self.dataset}"]
        if self.endpoint:
            bits.append(f"{self.endpoint} endpoint")
        if self.ignore_eos:
            bits.append("ignore_eos")
        return ", ".join(bits)

    def to_info(self) -> dict[str, Any]:
        """As stored in ``info.acceptance_context``."""
        out: dict[str, Any] = {
            "dataset": self.dataset,
            "ignore_eos": self.ignore_eos,
            "trusted": self.trusted,
        }
        if self.endpoint is not None:
            out["endpoint"] = self.endpoint
        caveat = self.caveat
        if caveat is not None:
            out["caveat"] = caveat
        return out

    @classmethod
    def of_info(cls, info: Mapping[str, Any]) -> AcceptanceContext | None:
        """The context of a stored level: its ``acceptance_context``, or (a level stored
        before that was recorded) its ``dataset`` and ``ignore_eos``; None when neither
        says which dataset it was."""
        found = info.get("acceptance_context")
        source: Mapping[str, Any] = found if isinstance(found, Mapping) else info
        dataset = source.get("dataset")
        if not isinstance(dataset, str) or not dataset:
            return None
        endpoint = source.get("endpoint")
        return cls(
            dataset=dataset,
            ignore_eos=bool(source.get("ignore_eos")),
            endpoint=endpoint if isinstance(endpoint, str) else None,
        )
