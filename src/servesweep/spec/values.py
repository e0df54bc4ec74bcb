"""Value types of the sweep file: durations, sizes, SLO names, the frozen base model.

Durations accept ``30``, ``"30s"``, ``"5m"``, ``"1h30m"``, ``"250ms"``; sizes accept
``1024``, ``"512MiB"``, ``"1GiB"``, ``"2GB"``. :mod:`servesweep.spec.schema` and the
search sections (:mod:`servesweep.spec.schema_search`) build on these.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

__all__ = [
    "SLO_KEYS",
    "Duration",
    "FrozenModel",
    "Size",
    "check_slos",
    "parse_duration",
    "parse_size",
]

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def _seconds(seconds: float, value: Any) -> float:
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"not a duration: {value!r} (use seconds or e.g. '30s', '5m', '1h30m')")
    if seconds < 0:
        raise ValueError(f"duration must not be negative: {value!r}")
    return seconds


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like ``"5m"``, ``"1h30m"``, ``"250ms"``."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        return _seconds(float(value), value)
    if isinstance(value, str):
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            pass
        else:
            return _seconds(seconds, value)
        pos = 0
        total = 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos and text[pos : match.start()].strip():
                break
            total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
            pos = match.end()
        if pos and not text[pos:].strip():
            return total
    raise ValueError(f"not a duration: {value!r} (use seconds or e.g. '30s', '5m', '1h30m')")


def parse_size(value: Any) -> int:
    """Bytes from a number or a string like ``"512MiB"``, ``"1GiB"``, ``"2GB"``."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"size must not be negative: {value!r}")
        return int(value)
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            unit = (match.group(2) or "B").lower()
            return int(float(match.group(1)) * _SIZE_UNITS[unit])
    raise ValueError(f"not a size: {value!r} (use bytes or e.g. '512MiB', '1GiB')")


SLO_KEYS = frozenset({"ttft_ms", "tpot_ms", "e2e_ms", "e2el_ms"})
"""Goodput SLO names a workload's ``slo`` accepts (milliseconds; ``e2el_ms`` = ``e2e_ms``)."""

Duration = Annotated[float, BeforeValidator(parse_duration)]
Size = Annotated[int, BeforeValidator(parse_size)]


def check_slos(value: Mapping[str, float]) -> None:
    """Every key a known SLO name, every limit > 0 ms; ValueError otherwise."""
    for key, limit in value.items():
        if key not in SLO_KEYS:
            close = difflib.get_close_matches(key, sorted(SLO_KEYS), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"unknown SLO {key!r} ({hint}SLOs in ms: {', '.join(sorted(SLO_KEYS))})"
            )
        if not limit > 0:
            raise ValueError(f"SLO {key!r} must be > 0 ms, got {limit!r}")


class FrozenModel(BaseModel):
    """Base of every sweep-file model: frozen, unknown keys refused, ``key:`` without a
    value means the default."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_means_default(cls, data: Any) -> Any:
        """``key:`` written without a value means the key's default."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {
            key: value
            for key, value in data.items()
            if value is not None
            or key not in fields
            or fields[key].is_required()
            or fields[key].default is None
        }
