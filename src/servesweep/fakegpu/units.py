"""Memory sizes as people write them on command lines: ``512MiB``, ``2GiB``, ``80GB``."""

from __future__ import annotations

import re

__all__ = ["format_bytes", "parse_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in ``text`` (``1GiB``, ``512MiB``, ``1.5GB``, ``4096``).

    Raises ``ValueError`` with a message naming the accepted units.
    """
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"invalid size {text!r}: use a number with an optional unit "
            "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 512MiB or 2GiB"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(n: int | float) -> str:
    """``2.00 GiB`` style, like PyTorch's CUDA OOM messages."""
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.2f} {unit}" if unit != "bytes" else f"{int(value)} bytes"
        value /= 1024
    return f"{value:.2f} GiB"  # pragma: no cover - loop always returns
