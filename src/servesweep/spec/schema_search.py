"""The sweep file's search parts: param ranges, the ``search`` section, ``capacity``.

- :class:`ParamRange`: ``{low, high}`` with optional ``step`` and ``log: true`` in
  ``params.grid`` beside lists (lists stay categorical). Integer when ``low``, ``high``
  (and ``step``) are written as integers, float otherwise.
- :class:`SearchSpec`: how configurations are chosen (``grid``, ``random``, ``tpe``,
  ``nsga2``), how many, with what budget and seed.
- :class:`CapacitySpec`: a workload that searches the highest load meeting an SLO.

Union tags (:data:`UNION_TAGS`) name the members of the file's either/or values (a list
or a range, one objective or a list, a workload's kind); the loader drops them from error
locations so errors name the keys as written.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from servesweep.spec.values import Duration, FrozenModel, check_slos, parse_duration

__all__ = [
    "DEFAULT_STARTUP",
    "STRATEGIES",
    "UNION_TAGS",
    "CapacitySpec",
    "Number",
    "ParamRange",
    "SearchBudget",
    "SearchSpec",
    "round_float",
]

STRATEGIES = ("grid", "random", "tpe", "nsga2")
"""Search strategies: the grid (every configuration, in order) and Optuna's samplers."""

DEFAULT_STARTUP = {"tpe": 6, "nsga2": 8}
"""Random configurations before the model takes over when ``startup_trials`` is not
given (tpe: measured in bench/search_efficiency.py; nsga2: its first generation)."""

UNION_TAGS = frozenset({"~values", "~range", "~one", "~list", "~load", "~eval", "~capacity"})
"""Tags of the sweep file's tagged unions; not keys of the file."""

_INT_TOLERANCE = 1e-9


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    return value


Number = Annotated[int | float, BeforeValidator(_number)]
"""An int or a float as written (``8`` stays an int, ``8.0`` a float); no strings."""


def _fmt(value: float) -> str:
    return f"{value:g}"


class ParamRange(FrozenModel):
    """A param sampled from ``low`` to ``high`` (both included)."""

    low: Number
    high: Number
    step: Number | None = None
    """Only multiples of ``step`` above ``low``; must divide ``high - low``."""
    log: bool = False
    """Sample uniformly in log space (for values spanning orders of magnitude)."""

    @model_validator(mode="after")
    def _consistent(self) -> ParamRange:
        low, high, step = self.low, self.high, self.step
        if low > high:
            raise ValueError(f"low {_fmt(low)} is above high {_fmt(high)}")
        if self.log and low <= 0:
            raise ValueError(
                f"log: true needs low > 0 (got {_fmt(low)}); a log range cannot reach 0"
            )
        if step is not None:
            if step <= 0:
                raise ValueError(f"step must be > 0, got {_fmt(step)}")
            if self.log:
                raise ValueError("give either step or log: true, not both")
            count = (high - low) / step
            if abs(count - round(count)) > _INT_TOLERANCE * max(1.0, count):
                below = low + math.floor(count) * step
                raise ValueError(
                    f"step {_fmt(step)} does not divide the range {_fmt(low)}..{_fmt(high)} "
                    f"({_fmt(high)} - {_fmt(low)} = {_fmt(high - low)}); "
                    f"use high: {_fmt(below)} or high: {_fmt(below + step)}"
                )
        return self

    @property
    def is_int(self) -> bool:
        """Integer values (``low``, ``high`` and ``step`` written as integers)."""
        return all(isinstance(v, int) for v in (self.low, self.high, self.step or 1))

    @property
    def size(self) -> int | None:
        """How many values it has; None for a continuous float range."""
        if self.is_int:
            return (int(self.high) - int(self.low)) // int(self.step or 1) + 1
        if self.step is not None:
            return round((self.high - self.low) / self.step) + 1
        if self.low == self.high:
            return 1
        return None

    def values(self) -> list[int | float]:
        """Every value of a discrete range, in order (ValueError for a continuous one)."""
        size = self.size
        if size is None:
            raise ValueError("a continuous range has no list of values")
        if self.is_int:
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        step = self.step or 0.0
        return [round_float(self.low + i * step, step) for i in range(size)]

    def describe(self) -> str:
        text = f"{_fmt(self.low)}..{_fmt(self.high)}"
        if self.step is not None:
            text += f" step {_fmt(self.step)}"
        if self.log:
            text += " log"
        return text


def round_float(value: float, step: float | None = None) -> float:
    """A sampled float as a launch flag shows it: on the step's decimals, or 4 significant
    digits for a continuous range (0.8734512 -> 0.8735)."""
    if step:
        decimals = max(0, -math.floor(math.log10(step)) + 3)
        return round(value, decimals)
    if value == 0:
        return 0.0
    digits = 4 - 1 - math.floor(math.log10(abs(value)))
    return round(value, digits)


def _gpu_hours(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"not a number of GPU-hours: {value!r} (write e.g. gpu_hours: 40)")
    return value


class SearchBudget(FrozenModel):
    """The most a search may spend; it stops at whichever limit comes first."""

    time: Duration | None = None
    """Wall time of the sweep (``6h``, ``90m``)."""
    gpu_hours: Annotated[float, BeforeValidator(_gpu_hours)] | None = None
    """GPU-hours the trials hold: wall time × GPUs, summed over trials."""

    @model_validator(mode="before")
    @classmethod
    def _duration_alone(cls, data: Any) -> Any:
        """``budget: 6h`` is ``budget: {time: 6h}``."""
        if isinstance(data, (str, int, float)) and not isinstance(data, bool):
            try:
                parse_duration(data)
            except ValueError:
                raise ValueError(
                    f"not a duration: {data!r} (write e.g. budget: 6h, or "
                    "budget: {time: 6h, gpu_hours: 40})"
                ) from None
            return {"time": data}
        return data

    @model_validator(mode="after")
    def _positive(self) -> SearchBudget:
        if self.time is None and self.gpu_hours is None:
            raise ValueError("give 'time' (e.g. 6h) and/or 'gpu_hours' (e.g. 40)")
        if self.time is not None and self.time <= 0:
            raise ValueError("budget time must be > 0")
        if self.gpu_hours is not None and not (
            self.gpu_hours > 0 and math.isfinite(self.gpu_hours)
        ):
            raise ValueError(f"gpu_hours must be > 0, got {self.gpu_hours!r}")
        return self


class SearchSpec(FrozenModel):
    """How the configurations of ``params`` are chosen."""

    strategy: Literal["grid", "random", "tpe", "nsga2"] = "grid"
    """``grid``: every configuration in order; ``random``, ``tpe`` (Bayesian, Optuna's
    TPE) and ``nsga2`` (Pareto, several objectives) sample configurations."""
    trials: int | None = Field(default=None, ge=1)
    """Configurations to run at most."""
    budget: SearchBudget | None = None
    seed: int = 0
    """Same seed, same sequence of configurations."""
    startup_trials: int | None = Field(default=None, ge=0)
    """Random configurations before the model takes over (``tpe``; the first generation
    of ``nsga2``). Default: see docs/sweep-file.md."""
    prune: bool | None = None
    """Stop a trial's benchmark early when it can no longer win. Default: on for the
    sampling strategies, off for ``grid``."""
    predict: Literal["auto", "skip", "off"] = "auto"
    """Memory and performance prediction before each launch: ``auto`` (a sampling
    search does not launch a configuration predicted not to fit by more than the
    margin, nor one predicted not to beat the best so far; a grid launches every one),
    ``skip`` (a grid skips them too), ``off`` (no prediction)."""

    @property
    def samples(self) -> bool:
        """A sampling strategy (not the grid)."""
        return self.strategy != "grid"

    @property
    def pruning(self) -> bool:
        return self.samples if self.prune is None else self.prune

    @property
    def startup(self) -> int:
        """Random configurations before the model (0 for grid and random)."""
        if self.startup_trials is not None:
            return self.startup_trials
        return DEFAULT_STARTUP.get(self.strategy, 0)


class CapacitySpec(FrozenModel):
    """Search the highest load (rate or concurrency) at which the SLO holds for
    ``quantile`` of the requests."""

    slo: dict[str, float] = Field(min_length=1)
    """Milliseconds per request, e.g. ``{ttft_ms: 500, tpot_ms: 50}``."""
    vary: Literal["rate", "concurrency"]
    low: float = Field(gt=0)
    high: float
    tolerance: float = Field(default=0.05, gt=0, lt=1)
    """Relative width at which the search stops: the capacity found is within this of
    the true one (concurrency: at least 1)."""
    quantile: float = Field(default=0.99, gt=0, le=1)
    """Fraction of requests that must meet every SLO."""
    max_levels: int = Field(default=8, ge=2, le=64)
    """Load levels measured at most."""

    @field_validator("slo")
    @classmethod
    def _known_slos(cls, value: dict[str, float]) -> dict[str, float]:
        check_slos(value)
        return value

    @model_validator(mode="after")
    def _range(self) -> CapacitySpec:
        if self.high <= self.low:
            raise ValueError(f"high {_fmt(self.high)} must be above low {_fmt(self.low)}")
        if self.vary == "concurrency":
            for name in ("low", "high"):
                value = getattr(self, name)
                if not float(value).is_integer() or value < 1:
                    raise ValueError(
                        f"{name} must be a whole number >= 1 when varying concurrency, "
                        f"got {_fmt(value)}"
                    )
        if not math.isfinite(self.high):
            raise ValueError("high must be finite")
        return self
