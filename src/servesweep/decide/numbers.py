"""How every report writes a number: significant digits, one rule everywhere.

The terminal table, Markdown, the HTML report (tables, hovers, heatmap cells), the
``best`` and ``compare`` texts use :func:`format_number`; the live progress lines of
``servesweep run`` can too (``from servesweep.report import format_number``).
Machine formats (CSV, JSON) keep full precision.
"""

from __future__ import annotations

import math
from typing import Protocol

__all__ = ["DIGITS", "format_number", "format_stats"]

DIGITS = 4
"""Significant digits of a reported number."""


def format_number(value: float | None, digits: int = DIGITS) -> str:
    """``value`` with ``digits`` significant digits, trailing zeros dropped:
    ``1447``, ``36.25``, ``4.004``, ``0.0123``. Integer digits are never dropped
    (``123457``); exponents only below 0.001 or from 10^15 (``1.234e-05``).
    None is ``-``; NaN and infinities are ``nan``, ``inf``, ``-inf``."""
    if value is None:
        return "-"
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e15 or magnitude < 1e-3:
        return _strip_exponent(f"{value:.{digits - 1}e}")
    decimals = digits - 1 - math.floor(math.log10(magnitude))
    if decimals <= 0:
        return str(round(value))
    text = f"{value:.{decimals}f}"
    text = text.rstrip("0").rstrip(".") if "." in text else text
    return "0" if text in ("-0", "") else text


def _strip_exponent(text: str) -> str:
    mantissa, _, exponent = text.partition("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{exponent}"


class _Stats(Protocol):
    @property
    def mean(self) -> float: ...
    @property
    def stdev(self) -> float | None: ...
    @property
    def n(self) -> int: ...
    @property
    def half_width(self) -> float | None: ...


def format_stats(stats: _Stats | None) -> str:
    """``123.4`` or, for a metric with a confidence interval, ``123.4 ±2.1`` (half
    the interval's width, two significant digits)."""
    if stats is None:
        return "-"
    text = format_number(stats.mean)
    half = stats.half_width
    if half is not None and math.isfinite(half):
        text += f" ±{format_number(half, digits=2)}"
    return text
