"""How many GPUs one trial needs, and which ports the slots of a machine use.

``server.gpus`` is the pool; ``server.gpus_per_trial`` is a number or an expression
of params (``"{param.tensor-parallel-size}"``, ``"{param.tp} * {param.dp}"``: the
``when`` language, with ``{param.NAME}`` naming a param, swept or fixed in
``server.args``). Without it a trial takes the whole pool: one trial at a time.

Slot ``k`` of a machine listens on ``server.port + k``, or on ``server.ports[k]``
when the sweep file lists them (their number then caps the slots).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servesweep.errors import ConfigError
from servesweep.spec.expand import param_key, param_names
from servesweep.spec.schema import SweepSpec
from servesweep.spec.when import WhenExpr, compile_when, when_name

__all__ = ["GpuNeed", "gpu_need", "params_label", "slot_port", "slot_ports"]

_REF = re.compile(r"\{param\.([^{}]+)\}")
_KEY = "server.gpus_per_trial"


@dataclass(frozen=True)
class GpuNeed:
    """GPUs per trial: a fixed number, or an expression evaluated per configuration."""

    pool: int
    fixed: int | None = None
    expr: WhenExpr | None = None
    defaults: Mapping[str, Any] | None = None
    """``server.args``: fixed values an expression may name."""

    def of(self, params: Mapping[str, Any]) -> int:
        """GPUs the configuration ``params`` needs; ConfigError when the expression does
        not give a whole number between 1 and the pool's size."""
        if self.fixed is not None:
            return self.fixed
        assert self.expr is not None
        scope = {**(self.defaults or {}), **params}
        value = self.expr.value(scope)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise ConfigError(
                f"{self.expr.text!r} gives {value!r} for {params_label(params)}: not a whole "
                "number of GPUs",
                key=_KEY,
            )
        need = int(value)
        if not 1 <= need <= max(1, self.pool):
            raise ConfigError(
                f"{params_label(params)} needs {need} GPUs; the pool (server.gpus) has {self.pool}",
                key=_KEY,
            )
        return need

    @property
    def whole_pool(self) -> bool:
        return self.fixed is not None and self.fixed >= self.pool


def params_label(params: Mapping[str, Any]) -> str:
    """``budget=4 topk=1``: a configuration in messages (``(defaults)`` when empty)."""
    return " ".join(f"{k}={v}" for k, v in params.items()) or "(defaults)"


def gpu_need(spec: SweepSpec) -> GpuNeed:
    """The sweep's GPUs-per-trial rule, checked (see the module doc)."""
    server = spec.server
    pool = len(server.gpus)
    raw = server.gpus_per_trial
    if raw is None:
        return GpuNeed(pool=pool, fixed=max(1, pool))
    if isinstance(raw, bool):
        raise ConfigError("must be a number or an expression of params", key=_KEY)
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if isinstance(raw, int):
        if raw < 1:
            raise ConfigError(f"must be at least 1, got {raw}", key=_KEY)
        if not pool:
            raise ConfigError("needs a GPU pool: list the GPUs in server.gpus", key=_KEY)
        if raw > pool:
            raise ConfigError(
                f"{raw} GPUs per trial, but the pool (server.gpus) has only {pool}", key=_KEY
            )
        if pool % raw:
            raise ConfigError(
                f"{raw} GPUs per trial does not divide the pool of {pool}: "
                f"{pool % raw} GPU(s) would never be used (list {pool - pool % raw} GPUs "
                "in server.gpus, or choose a divisor)",
                key=_KEY,
            )
        return GpuNeed(pool=pool, fixed=raw)
    if not pool:
        raise ConfigError("needs a GPU pool: list the GPUs in server.gpus", key=_KEY)
    known = {param_key(n): n for n in [*param_names(spec.params), *server.args]}
    for name in _REF.findall(raw):
        if param_key(name) not in known:
            import difflib

            hint = difflib.get_close_matches(param_key(name), list(known), n=1)
            more = f" (did you mean {known[hint[0]]!r}?)" if hint else ""
            raise ConfigError(
                f"{raw!r} names {name!r}, which is neither a swept param nor in server.args{more}",
                key=_KEY,
            )
    text = _REF.sub(lambda m: when_name(m.group(1)), raw)
    try:
        expr = compile_when(text)
    except ConfigError as exc:
        raise ConfigError(exc.message, key=_KEY) from None
    return GpuNeed(pool=pool, expr=expr, defaults=dict(server.args))


def slot_port(spec: SweepSpec, slot: int) -> int:
    """The port slot ``slot`` of a machine listens on."""
    server = spec.server
    if server.ports:
        return server.ports[slot]
    return server.port + slot


def slot_ports(spec: SweepSpec, slots: int) -> list[int]:
    """The ports of slots ``0..slots-1``; ConfigError when they do not exist."""
    server = spec.server
    if server.ports:
        if slots > len(server.ports):
            raise ConfigError(
                f"{slots} slots need {slots} ports; server.ports lists {len(server.ports)}",
                key="server.ports",
            )
        if len(set(server.ports)) != len(server.ports):
            raise ConfigError("ports must be unique", key="server.ports")
        return list(server.ports[:slots])
    last = server.port + slots - 1
    if last > 65535:
        raise ConfigError(
            f"{slots} slots would listen on ports {server.port}-{last}, beyond 65535: lower "
            "server.port or list server.ports",
            key="server.port",
        )
    return [server.port + k for k in range(slots)]
