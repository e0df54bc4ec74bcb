"""The search space of a sampling search: what ``params`` means when configurations
are drawn instead of expanded.

- Each ``grid`` param is a dimension: a list is categorical (its values, unordered),
  a range ``{low, high, step, log}`` is an int or float range.
- ``zip`` is one categorical dimension over its rows (:data:`ZIP_DIMENSION`): a row's
  values always go together.
- ``points`` are explicit configurations, proposed first, in order.
- ``exclude`` and ``when`` forbid configurations: a forbidden one is never launched.

Sampled values become a :class:`~servesweep.models.ServerConfig` through
:meth:`SearchSpace.config` (floats rounded as a flag would show them, so two samples
that differ in the 10th digit are one configuration). Nothing here knows a sampler;
:mod:`servesweep.search` maps dimensions to Optuna's distributions.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servesweep.errors import ConfigError
from servesweep.models import ServerConfig
from servesweep.spec.expand import (
    MAX_CONFIGS,
    check_sections,
    compile_whens,
    is_excluded,
    param_key,
    same_value,
    whens_hold,
)
from servesweep.spec.schema import ParamRange, ParamsSpec
from servesweep.spec.schema_search import round_float
from servesweep.spec.when import WhenExpr

__all__ = ["ZIP_DIMENSION", "Dimension", "SearchSpace", "build_space", "describe_dimensions"]

ZIP_DIMENSION = "(zip)"
"""The name of the dimension whose values are the rows of ``params.zip``."""

_STEP_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Dimension:
    """One axis of the space: categorical ``choices`` or a ``range``."""

    name: str
    choices: tuple[Any, ...] = ()
    range: ParamRange | None = None

    @property
    def categorical(self) -> bool:
        return self.range is None

    @property
    def size(self) -> int | None:
        """Number of values; None for a continuous range."""
        return len(self.choices) if self.range is None else self.range.size

    def value(self, sampled: Any) -> Any:
        """The param value of a sampled one: a choice by its index, a range value as
        an int or a rounded float."""
        if self.range is None:
            return self.choices[int(sampled)]
        if self.range.is_int:
            return int(sampled)
        return round_float(float(sampled), self.range.step)

    def sample_of(self, value: Any) -> Any | None:
        """The inverse of :meth:`value`: what a sampler would have drawn to give
        ``value``, or None when ``value`` is not in this dimension."""
        if self.range is None:
            for index, choice in enumerate(self.choices):
                if same_value(choice, value):
                    return index
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        low, high, step = self.range.low, self.range.high, self.range.step
        if not low - _STEP_TOLERANCE <= value <= high + _STEP_TOLERANCE:
            return None
        if step is not None:
            count = (value - low) / step
            if abs(count - round(count)) > _STEP_TOLERANCE * max(1.0, abs(count)):
                return None
        if self.range.is_int:
            return int(value) if float(value).is_integer() else None
        return float(value)

    def describe(self) -> str:
        if self.range is not None:
            return self.range.describe()
        if self.name == ZIP_DIMENSION:
            return f"{len(self.choices)} zipped rows"
        return "[" + ", ".join(repr(c) for c in self.choices) + "]"


@dataclass(frozen=True)
class SearchSpace:
    """The dimensions, points, exclusions and ``when`` rules of a sampling search."""

    dimensions: tuple[Dimension, ...]
    points: tuple[ServerConfig, ...]
    exclusions: tuple[Mapping[str, Any], ...]
    whens: tuple[WhenExpr, ...]

    @property
    def size(self) -> int | None:
        """Configurations the dimensions span (before ``exclude``/``when``; points not
        counted); None when a range is continuous."""
        if not self.dimensions:
            return 0 if self.points else 1
        sizes = [d.size for d in self.dimensions]
        if any(s is None for s in sizes):
            return None
        return math.prod(s for s in sizes if s is not None)

    @property
    def enumerable(self) -> bool:
        """Finite and small enough to list every configuration."""
        size = self.size
        return size is not None and size <= MAX_CONFIGS

    def config(self, sampled: Mapping[str, Any]) -> ServerConfig:
        """The configuration of one sample (dimension name -> drawn value)."""
        params: dict[str, Any] = {}
        for dim in self.dimensions:
            value = dim.value(sampled[dim.name])
            if dim.name == ZIP_DIMENSION:
                params.update(value)
            else:
                params[dim.name] = value
        return ServerConfig.of(params)

    def sample_of(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """The sample that gives exactly ``params``, or None when ``params`` is not a
        point of the dimensions (a param missing or extra, a value not in its range)."""
        given = {param_key(k): v for k, v in params.items()}
        used: set[str] = set()
        out: dict[str, Any] = {}
        for dim in self.dimensions:
            if dim.name == ZIP_DIMENSION:
                found = None
                for index, row in enumerate(dim.choices):
                    keys = {param_key(k): v for k, v in row.items()}
                    if all(k in given and same_value(given[k], v) for k, v in keys.items()):
                        found = index
                        used.update(keys)
                        break
                if found is None:
                    return None
                out[dim.name] = found
                continue
            key = param_key(dim.name)
            if key not in given:
                return None
            sample = dim.sample_of(given[key])
            if sample is None:
                return None
            out[dim.name] = sample
            used.add(key)
        if set(given) != used:
            return None
        return out

    def forbidden(self, config: ServerConfig) -> str | None:
        """Why ``exclude`` or ``when`` forbids the configuration, or None."""
        if is_excluded(config.params, self.exclusions):
            return "excluded by params.exclude"
        try:
            if not whens_hold(self.whens, config.params):
                return "removed by params.when"
        except ConfigError as exc:
            return f"params.when cannot be computed: {exc.message}"
        return None

    def configs(self) -> Iterator[ServerConfig]:
        """Every configuration of the dimensions in grid order (the last dimension
        varies fastest), forbidden ones included; ValueError when not enumerable."""
        if not self.enumerable:
            raise ValueError("the space is continuous or too large to list")
        if not self.dimensions and self.points:
            return
        axes = [range(d.size or 0) if d.categorical else _range_samples(d) for d in self.dimensions]
        names = [d.name for d in self.dimensions]
        for combo in itertools.product(*axes):
            yield self.config(dict(zip(names, combo, strict=True)))

    def allowed(self) -> list[ServerConfig]:
        """Every configuration no rule forbids, points first, without duplicates."""
        seen: set[str] = set()
        out: list[ServerConfig] = []
        for config in itertools.chain(self.points, self.configs()):
            if config.fingerprint in seen or self.forbidden(config) is not None:
                continue
            seen.add(config.fingerprint)
            out.append(config)
        return out


def _range_samples(dim: Dimension) -> list[Any]:
    assert dim.range is not None
    return list(dim.range.values())


def build_space(params: ParamsSpec) -> SearchSpace:
    """The search space of ``params`` (ConfigError with the key for a mistake)."""
    check_sections(params, grid=False)
    whens = compile_whens(params)
    dimensions: list[Dimension] = []
    for name, values in params.grid.items():
        if isinstance(values, ParamRange):
            dimensions.append(Dimension(name, range=values))
        else:
            dimensions.append(Dimension(name, choices=tuple(values)))
    if params.zip:
        names = list(params.zip)
        rows = tuple(
            dict(zip(names, row, strict=True)) for row in zip(*params.zip.values(), strict=True)
        )
        dimensions.append(Dimension(ZIP_DIMENSION, choices=rows))
    points: list[ServerConfig] = []
    for index, point in enumerate(params.points):
        try:
            points.append(ServerConfig.of(point))
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"a param value is not plain data: {exc}", key=f"params.points.{index}"
            ) from None
    return SearchSpace(
        dimensions=tuple(dimensions),
        points=tuple(points),
        exclusions=tuple(params.exclude),
        whens=whens,
    )


def describe_dimensions(space: SearchSpace) -> Sequence[tuple[str, str, str]]:
    """(name, kind, values) per dimension, for plans and reports."""
    out = []
    for dim in space.dimensions:
        if dim.range is None:
            kind = "categorical"
        else:
            kind = "int range" if dim.range.is_int else "float range"
        out.append((dim.name, kind, dim.describe()))
    return out
