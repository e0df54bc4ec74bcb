"""Expand the ``params`` section of a sweep file into server configs.

Order: the grid's product in the order the keys are written (the last key varies
fastest), each combined with every row of ``zip`` when both are given
(``grid × zip``), or the zip rows alone; then the explicit ``points`` in order.
Then ``exclude`` removes configs (an exclusion matches a config when every one of
its keys matches; ``a-b`` and ``a_b`` are the same key), ``when`` keeps only the
configs where every expression holds, and duplicates (same fingerprint) are
dropped, the first kept. A sweep without params has one config: the defaults.

Ranges (``{low, high}``) are for sampling searches (:mod:`servesweep.spec.space`); a
grid with a range is a ConfigError that says so.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servesweep.errors import ConfigError
from servesweep.models import ServerConfig
from servesweep.spec.schema import ParamRange, ParamsSpec, SweepSpec
from servesweep.spec.when import WhenExpr, compile_when

__all__ = [
    "MAX_CONFIGS",
    "Expansion",
    "check_sections",
    "compile_whens",
    "expand_configs",
    "expand_params",
    "is_excluded",
    "param_key",
    "param_names",
    "range_needs_sampling",
    "same_value",
    "whens_hold",
]

MAX_CONFIGS = 100_000
"""More candidate configs than this is a mistake in the sweep file, not a plan."""


def param_key(name: str) -> str:
    """The dash/underscore-blind form of a param name (``a_b`` -> ``a-b``)."""
    return name.replace("_", "-")


def same_value(a: Any, b: Any) -> bool:
    """Equality of param values that does not confuse ``True`` with ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        ka = {param_key(str(k)): v for k, v in a.items()}
        kb = {param_key(str(k)): v for k, v in b.items()}
        return ka.keys() == kb.keys() and all(same_value(ka[k], kb[k]) for k in ka)
    return bool(a == b)


def param_names(params: ParamsSpec) -> tuple[str, ...]:
    """Every param name the sweep varies, as first written: grid, zip, then points."""
    seen: dict[str, str] = {}
    sources: list[Sequence[str]] = [list(params.grid), list(params.zip)]
    sources += [list(point) for point in params.points]
    for names in sources:
        for name in names:
            seen.setdefault(param_key(name), name)
    return tuple(seen.values())


@dataclass(frozen=True)
class Expansion:
    """The configs of a sweep and how many candidates each step removed."""

    configs: tuple[ServerConfig, ...]
    candidates: int
    excluded: int
    filtered: int
    """Removed by ``when``."""
    duplicates: int


def _check_unique(names: Sequence[str], key: str) -> None:
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(param_key(name), name)
        if other != name:
            raise ConfigError(
                f"param {name!r} is the same as {other!r} (dashes and underscores are equal)",
                key=f"{key}.{name}",
            )


def check_sections(params: ParamsSpec, *, grid: bool = True) -> None:
    """Check how the parts of ``params`` fit together (names, lengths, exclusions);
    ``grid``: the configs will be expanded, so their number is bounded too."""
    _check_unique(list(params.grid), "params.grid")
    _check_unique(list(params.zip), "params.zip")
    for name, values in params.grid.items():
        if isinstance(values, list) and not values:
            raise ConfigError("empty list: give at least one value", key=f"params.grid.{name}")
    grid_keys = {param_key(n): n for n in params.grid}
    lengths = {name: len(values) for name, values in params.zip.items()}
    for name, values in params.zip.items():
        if param_key(name) in grid_keys:
            raise ConfigError(
                f"param {name!r} is both in grid and in zip; keep it in one",
                key=f"params.zip.{name}",
            )
        if not values:
            raise ConfigError("empty list: give at least one value", key=f"params.zip.{name}")
    if len(set(lengths.values())) > 1:
        first = next(iter(lengths))
        for name, length in lengths.items():
            if length != lengths[first]:
                raise ConfigError(
                    f"zip lists must have equal lengths: {name!r} has {length} values, "
                    f"{first!r} has {lengths[first]}",
                    key=f"params.zip.{name}",
                )
    for index, point in enumerate(params.points):
        _check_unique(list(point), f"params.points.{index}")
    known = {param_key(n) for n in param_names(params)}
    for index, exclusion in enumerate(params.exclude):
        key = f"params.exclude.{index}"
        if not exclusion:
            raise ConfigError("an empty exclusion would remove every config", key=key)
        for name in exclusion:
            if param_key(name) not in known:
                raise ConfigError(_unknown_param(name, params), key=f"{key}.{name}")
    if not grid:
        return
    size = math.prod(_grid_size(v) for v in params.grid.values()) * max(lengths.values(), default=1)
    if size + len(params.points) > MAX_CONFIGS:
        raise ConfigError(
            f"the params expand to {size + len(params.points)} configs "
            f"(more than {MAX_CONFIGS}); sweep fewer values or use 'points'",
            key="params",
        )


def _grid_size(values: list[Any] | ParamRange) -> int:
    return len(values) if isinstance(values, list) else (values.size or MAX_CONFIGS + 1)


def range_needs_sampling(params: ParamsSpec) -> ConfigError | None:
    """The error for a range in a grid (a grid runs lists of values only)."""
    for name, value in params.ranges.items():
        return ConfigError(
            f"a range ({value.describe()}) needs a sampling search: add "
            "'search: {strategy: tpe, trials: N}' (or random), or list the values to run "
            "them all as a grid",
            key=f"params.grid.{name}",
        )
    return None


def _unknown_param(name: str, params: ParamsSpec) -> str:
    import difflib

    names = param_names(params)
    hint = difflib.get_close_matches(name, list(names), n=1)
    if hint:
        return f"unknown param {name!r} (did you mean {hint[0]!r}?)"
    listed = ", ".join(names) or "none"
    return f"unknown param {name!r} (swept params: {listed})"


def compile_whens(params: ParamsSpec) -> tuple[WhenExpr, ...]:
    """Parse every ``when`` expression; errors carry the key ``params.when.N``."""
    names = frozenset(param_names(params))
    out = []
    for index, text in enumerate(params.when):
        try:
            out.append(compile_when(text, names))
        except ConfigError as exc:
            raise ConfigError(exc.message, key=f"params.when.{index}") from None
    return tuple(out)


def _candidates(params: ParamsSpec) -> Iterator[dict[str, Any]]:
    lists = {k: v for k, v in params.grid.items() if isinstance(v, list)}
    grid_names, grid_lists = list(lists), list(lists.values())
    zip_names = list(params.zip)
    zip_rows = [
        dict(zip(zip_names, row, strict=True)) for row in zip(*params.zip.values(), strict=True)
    ]
    if grid_names or zip_rows:
        for combo in itertools.product(*grid_lists):
            base = dict(zip(grid_names, combo, strict=True))
            for row in zip_rows or [{}]:
                yield {**base, **row}
    elif not params.points:
        yield {}
    for point in params.points:
        yield dict(point)


def is_excluded(config: Mapping[str, Any], exclusions: Sequence[Mapping[str, Any]]) -> bool:
    """Whether one of ``exclusions`` matches ``config`` (every key of it equal)."""
    norm = {param_key(k): v for k, v in config.items()}
    for exclusion in exclusions:
        if all(
            param_key(k) in norm and same_value(norm[param_key(k)], v) for k, v in exclusion.items()
        ):
            return True
    return False


def expand_params(params: ParamsSpec) -> Expansion:
    """Expand params into configs, with counts of what each step removed (a range in
    the grid is a ConfigError: ranges are for sampling searches)."""
    check_sections(params)
    error = range_needs_sampling(params)
    if error is not None:
        raise error
    whens = compile_whens(params)
    configs: list[ServerConfig] = []
    seen: set[str] = set()
    candidates = excluded = filtered = duplicates = 0
    for values in _candidates(params):
        candidates += 1
        if is_excluded(values, params.exclude):
            excluded += 1
            continue
        if not whens_hold(whens, values):
            filtered += 1
            continue
        try:
            config = ServerConfig.of(values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"a param value is not plain data (numbers, strings, booleans, lists, "
                f"mappings): {exc}",
                key="params",
            ) from None
        if config.fingerprint in seen:
            duplicates += 1
            continue
        seen.add(config.fingerprint)
        configs.append(config)
    return Expansion(tuple(configs), candidates, excluded, filtered, duplicates)


def whens_hold(whens: Sequence[WhenExpr], values: Mapping[str, Any]) -> bool:
    """Whether every ``when`` holds for ``values`` (ConfigError naming the expression
    when one cannot be computed)."""
    for index, expr in enumerate(whens):
        try:
            if not expr.evaluate(values):
                return False
        except ConfigError as exc:
            raise ConfigError(exc.message, key=f"params.when.{index}") from None
    return True


def expand_configs(spec: SweepSpec) -> list[ServerConfig]:
    """The sweep's server configs in run order (see the module docstring).

    Only a grid has a fixed list: a sampling search (``search.strategy`` other than
    ``grid``) proposes its configs while it runs (:class:`servesweep.search.Search`),
    and asking it for a list is a ConfigError."""
    if spec.search.samples:
        raise ConfigError(
            f"strategy {spec.search.strategy!r} proposes configurations while it runs; "
            "only a grid has a fixed list of them",
            key="search.strategy",
        )
    return list(expand_params(spec.params).configs)
