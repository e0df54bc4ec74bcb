"""Find the highest load at which an SLO holds: pure functions, no I/O.

A level's **score** is the ``quantile`` of the requests' SLO ratios, where a request's
ratio is the largest of ``ttft / ttft_ms``, ``tpot / tpot_ms`` and ``e2e / e2e_ms``
over the SLOs given (a failed request: infinite; TPOT is not defined for one token).
The SLO holds at a level when its score is <= 1, i.e. when at least ``quantile`` of
the requests met every SLO. The score grows with the load, so the capacity is where
it crosses 1.

:func:`next_load` says which load to measure next from the levels measured so far
(stateless: a list of :class:`Probe` in, a load or None out):

- bracket: the lowest load that failed (else ``high``, not measured) and the highest
  load below it that held (else ``low``, not measured);
- inside the bracket, in log-load space: regula falsi on ``log(score)`` when both ends
  are measured (Illinois-weighted when the last probes fell on the same side; an
  overloaded level's score counts as 4, the queue and not the server's speed sets
  it), else a step that assumes the score grows in proportion to the load (at least
  to the middle of the bracket); bisection
  instead when the bracket did not halve over the last two levels (as Brent's method
  does). The point is kept at least the tolerance away from both ends, so a good
  estimate closes the bracket on the next level; an end the answer depends on that
  was never measured is measured;
- it stops when the bracket is within ``tolerance`` (concurrency: no integer between),
  when ``max_levels`` are measured, or when the SLO fails at ``low`` / holds at
  ``high``.

:func:`estimate` gives the capacity: the highest load measured to hold below the lowest
that failed (``0`` when even ``low`` fails; ``high`` with ``at_least`` when ``high``
holds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servesweep.models import RequestSample
from servesweep.samples import SampleColumns, columns_of
from servesweep.spec.schema_search import CapacitySpec

__all__ = ["CapacityEstimate", "Probe", "estimate", "next_load", "slo_score"]

FloatArray = npt.NDArray[np.float64]

_SLO_SECONDS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2e_ms": "e2e", "e2el_ms": "e2e"}
_EDGE = 0.95
"""Share of the tolerance kept between a new point and a bracket end."""
_OVERLOAD = math.log(4.0)
"""Scores above 4 mean an overloaded server whose queue, not its speed, sets the
latency: they count as 4 when interpolating."""


@dataclass(frozen=True)
class Probe:
    """One measured load level."""

    load: float
    score: float
    """The quantile of the requests' SLO ratios (<= 1: the SLO holds)."""
    attainment: float = 0.0
    """Fraction of requests that met every SLO."""

    @property
    def ok(self) -> bool:
        return self.score <= 1.0


@dataclass(frozen=True)
class CapacityEstimate:
    capacity: float
    """The highest load measured to meet the SLO (0 when ``low`` already fails)."""
    probe: Probe | None
    """The level measured at the capacity."""
    upper: float | None
    """The lowest load measured to fail (None: none failed)."""
    bound: str | None = None
    """``below_low`` (fails at ``low``), ``at_least_high`` (holds at ``high``), or
    ``max_levels`` (stopped before the bracket closed); None when found within the
    tolerance."""


def _ratios(samples: SampleColumns, slo: Mapping[str, float]) -> FloatArray:
    """Each request's worst latency over its SLO (inf: failed, or without a value an
    SLO needs; TPOT is not judged for one token or without a first token)."""
    ttft = samples.ttft
    e2e = samples.e2e
    worst = np.zeros(len(samples), dtype=np.float64)
    bad = ~samples.ok | np.isnan(e2e)
    for key, limit in slo.items():
        kind = _SLO_SECONDS[key]
        if kind == "ttft":
            value = ttft
            bad |= np.isnan(ttft)
        elif kind == "e2e":
            value = e2e
        else:
            tokens = np.maximum(samples.completion_tokens, 0)
            judged = (tokens > 1) & ~np.isnan(ttft)
            with np.errstate(invalid="ignore", divide="ignore"):
                value = np.where(judged, (e2e - ttft) / (tokens - 1), np.nan)
        worst = np.fmax(worst, value * 1000.0 / limit)
    return np.where(bad, np.inf, worst)


def slo_score(
    samples: Sequence[RequestSample], slo: Mapping[str, float], quantile: float
) -> tuple[float, float]:
    """(score, attainment) of one level's requests (see the module docstring)."""
    if not samples:
        return math.inf, 0.0
    ratios = np.sort(_ratios(columns_of(samples), slo))
    attainment = int((ratios <= 1.0).sum()) / len(ratios)
    rank = max(0, math.ceil(quantile * len(ratios) - 1e-9) - 1)
    return float(ratios[rank]), attainment


def _bracket(probes: Sequence[Probe]) -> tuple[Probe | None, Probe | None]:
    bad = min((p for p in probes if not p.ok), key=lambda p: p.load, default=None)
    good = [p for p in probes if p.ok and (bad is None or p.load < bad.load)]
    return max(good, key=lambda p: p.load, default=None), bad


def _closed(spec: CapacitySpec, low: float, high: float) -> bool:
    if spec.vary == "concurrency":
        return math.floor(high) - math.ceil(low) <= 1 or high <= low * (1 + spec.tolerance)
    return high <= low * (1 + spec.tolerance)


def _measured(probes: Sequence[Probe], load: float) -> bool:
    return any(math.isclose(p.load, load, rel_tol=1e-9) for p in probes)


def _f(probe: Probe) -> float | None:
    """log(score), or None where it says nothing about distance (inf, 0)."""
    if not math.isfinite(probe.score) or probe.score <= 0:
        return None
    return math.log(probe.score)


def _same_side_run(probes: Sequence[Probe]) -> int:
    """How many of the last probes in a row fell on the same side (held / failed)."""
    if not probes:
        return 0
    last = probes[-1].ok
    run = 0
    for probe in reversed(probes):
        if probe.ok != last:
            break
        run += 1
    return run


def _estimate_log(
    probes: Sequence[Probe], good: Probe | None, bad: Probe | None, lo: float, hi: float
) -> float | None:
    """Where log(load) crosses score 1, as far as the measured ends tell (None: they
    tell nothing)."""
    u_lo, u_hi = math.log(lo), math.log(hi)
    f_lo = _f(good) if good is not None else None
    f_hi = _f(bad) if bad is not None else None
    if f_hi is not None:
        f_hi = min(f_hi, _OVERLOAD)
    if f_lo is not None and f_hi is not None and f_hi > f_lo:
        run = _same_side_run(probes)
        if run >= 2 and probes[-1].ok:
            f_hi *= 0.5 ** (run - 1)
        elif run >= 2:
            f_lo *= 0.5 ** (run - 1)
        return u_lo + (u_hi - u_lo) * (-f_lo) / (f_hi - f_lo)
    middle = (u_lo + u_hi) / 2
    if f_lo is not None and f_lo < 0:
        return max(u_lo - f_lo, middle)  # as if the score grew in proportion to the load
    if f_hi is not None and f_hi > 0:
        return min(u_hi - f_hi, middle)
    return None


def _widths(spec: CapacitySpec, probes: Sequence[Probe]) -> list[float]:
    """The bracket's log width before any probe and after each."""
    out = []
    for count in range(len(probes) + 1):
        good, bad = _bracket(probes[:count])
        lo = good.load if good is not None else spec.low
        hi = bad.load if bad is not None else spec.high
        out.append(math.log(hi) - math.log(lo))
    return out


def _round(spec: CapacitySpec, load: float) -> float:
    if spec.vary == "concurrency":
        return float(round(load))
    digits = 3 - 1 - math.floor(math.log10(load))
    return round(load, max(0, digits))


def next_load(spec: CapacitySpec, probes: Sequence[Probe]) -> float | None:
    """The next load to measure, or None when the capacity is known well enough."""
    if len(probes) >= spec.max_levels:
        return None
    good, bad = _bracket(probes)
    if bad is not None and bad.load <= spec.low * (1 + 1e-9):
        return None  # fails at low: below the range
    if good is not None and good.load >= spec.high * (1 - 1e-9):
        return None  # holds at high: at least high
    lo = good.load if good is not None else spec.low
    hi = bad.load if bad is not None else spec.high
    if _closed(spec, lo, hi):
        if good is None and not _measured(probes, spec.low):
            return spec.low
        if bad is None and not _measured(probes, spec.high):
            return spec.high
        return None
    width = math.log(hi) - math.log(lo)
    edge = min(_EDGE * math.log(1 + spec.tolerance), width / 2)
    target = _estimate_log(probes, good, bad, lo, hi)
    widths = _widths(spec, probes)
    slow = len(widths) >= 3 and widths[-1] > 0.5 * widths[-3]
    if target is None or slow:
        target = (math.log(lo) + math.log(hi)) / 2  # bisect
    target = min(max(target, math.log(lo) + edge), math.log(hi) - edge)
    load = _round(spec, math.exp(target))
    if spec.vary == "concurrency":
        load = min(max(load, math.floor(lo) + 1), math.ceil(hi) - 1)
    elif not lo < load < hi:
        load = math.exp(target)
    return load


def estimate(spec: CapacitySpec, probes: Sequence[Probe]) -> CapacityEstimate:
    """The capacity the probes show (see the module docstring)."""
    good, bad = _bracket(probes)
    if good is None:
        at_low = bad is not None and bad.load <= spec.low * (1 + 1e-9)
        return CapacityEstimate(
            0.0, None, bad.load if bad else None, "below_low" if at_low else "max_levels"
        )
    if bad is None and good.load >= spec.high * (1 - 1e-9):
        return CapacityEstimate(good.load, good, None, "at_least_high")
    hi = bad.load if bad is not None else spec.high
    bound = None if _closed(spec, good.load, hi) else "max_levels"
    return CapacityEstimate(good.load, good, bad.load if bad else None, bound)
