"""What each configuration held and what its tokens cost, as the reports show it
beside a decision: its GPUs and, with a price in the sweep file (``cost``), its cost
per million output tokens and tokens per unit of currency at one level.

The level is the one the decision looks at: the first objective or constraint that
names a level of a load workload, else the first load level measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from servesweep import metrics_catalog as mc
from servesweep.decide.numbers import format_number
from servesweep.decide.refs import ResultIndex
from servesweep.decide.resources import sweep_cost, trial_gpus
from servesweep.records import SweepData, TrialRecord
from servesweep.spec.constraints import MetricRef

__all__ = ["CostView", "TrialCost", "cost_view"]


@dataclass(frozen=True)
class TrialCost:
    """One trial's GPUs and cost figures (None: unknown or unpriced)."""

    gpus: int | None
    cost_per_mtok: float | None = None
    tokens_per_dollar: float | None = None

    def describe(self, currency: str) -> str:
        """``2 GPUs, 0.52 USD/Mtok``."""
        parts = [] if self.gpus is None else [f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"]
        if self.cost_per_mtok is not None:
            parts.append(f"{format_number(self.cost_per_mtok)} {currency}/Mtok")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            mc.COST_PER_MTOK.name: self.cost_per_mtok,
            mc.TOKENS_PER_DOLLAR.name: self.tokens_per_dollar,
        }


@dataclass(frozen=True)
class CostView:
    """The price the sweep file gives, the level its costs are read at, and each
    trial's figures."""

    gpu_hour: float | None
    currency: str
    level: str | None
    """``chat.c8``: where the cost figures are read (None: no load level)."""
    trials: Mapping[int, TrialCost]

    def of(self, trial: TrialRecord) -> TrialCost:
        return self.trials.get(trial.id, TrialCost(None))

    def describe(self, trial: TrialRecord) -> str:
        """``2 GPUs, 0.52 USD/Mtok`` (empty when nothing is known)."""
        return self.of(trial).describe(self.currency)

    def headline(self, trial: TrialRecord) -> str:
        """One line for the winner: ``2 GPUs; at chat.c8 0.52 USD per million output
        tokens (1.9M tokens per USD, at 2.49 USD per GPU-hour)``."""
        mine = self.of(trial)
        parts = [] if mine.gpus is None else [f"{mine.gpus} GPU{'s' if mine.gpus != 1 else ''}"]
        if mine.cost_per_mtok is not None and mine.tokens_per_dollar is not None:
            assert self.gpu_hour is not None
            parts.append(
                f"at {self.level} {format_number(mine.cost_per_mtok)} {self.currency} per "
                f"million output tokens ({format_number(mine.tokens_per_dollar)} tokens per "
                f"{self.currency}, at {format_number(self.gpu_hour)} {self.currency} per GPU-hour)"
            )
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"gpu_hour": self.gpu_hour, "currency": self.currency, "level": self.level}


def _level_of(refs: Iterable[MetricRef], index: ResultIndex) -> tuple[str, str] | None:
    for ref in refs:
        if ref.workload is not None and ref.level is not None:
            return ref.workload, ref.level
    for workload in index.workloads():
        if not index.is_eval(workload):
            levels = index.workload_levels(workload)
            if levels:
                return workload, levels[0]
    return None


def cost_view(data: SweepData, index: ResultIndex, refs: Iterable[MetricRef]) -> CostView:
    """Every trial's GPUs and cost at the level the decision's ``refs`` look at."""
    cost = sweep_cost(data)
    where = _level_of(refs, index)
    trials: dict[int, TrialCost] = {}
    for trial in data.trials:
        figures: dict[str, float | None] = {}
        if cost is not None and where is not None:
            for metric in (mc.COST_PER_MTOK, mc.TOKENS_PER_DOLLAR):
                ref = MetricRef.of(where[0], where[1], metric.name)
                figures[metric.name] = index.value(trial, ref)
        trials[trial.id] = TrialCost(
            trial_gpus(data, trial),
            figures.get(mc.COST_PER_MTOK.name),
            figures.get(mc.TOKENS_PER_DOLLAR.name),
        )
    return CostView(
        gpu_hour=None if cost is None else cost.gpu_hour,
        currency="" if cost is None else cost.currency,
        level=None if where is None else ".".join(where),
        trials=trials,
    )
