"""The empirical model over every knob: additive in the log of the metric.

Each knob is a few features of its normalized value (a numeric one on a log scale when
its values span a factor of 4 or more, quadratic when it takes three values or more; a
draft length as "speculation on" and ``log2(1 + k)``; any other value one-hot), and the
metric's log is their sum, fitted by least squares. A configuration is predicted only
when the measurements identify it: its features lie in the span of the measured ones
(otherwise the answer would be the fit's guess, and the prediction says unknown). The
interval is two standard errors of the prediction, from the residuals with two
pseudo-observations of the measurement noise (so that an exact fit of few trials is
not taken as exact), and the leverage of the configuration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Features", "fit_predict"]

PSEUDO = 2.0
"""Pseudo-observations of the measurement noise in the residual variance."""


@dataclass(frozen=True)
class Features:
    """How each knob's value becomes features, built from the sweep's configurations."""

    knobs: tuple[str, ...]
    numeric: Mapping[str, tuple[float, float, bool, int]]
    """Knob -> (low, high, log scale, distinct values)."""
    levels: Mapping[str, tuple[str, ...]]
    """Non-numeric knob -> its values (the first is the reference)."""
    draft: str | None

    @staticmethod
    def of(configs: Sequence[Mapping[str, Any]], draft: str | None) -> Features:
        knobs = sorted({k for c in configs for k in c})
        varying = [k for k in knobs if len({repr(c.get(k)) for c in configs}) > 1]
        numeric: dict[str, tuple[float, float, bool, int]] = {}
        levels: dict[str, tuple[str, ...]] = {}
        for k in varying:
            values = [c.get(k) for c in configs]
            if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                nums = [float(v) for v in values]  # type: ignore[arg-type]
                low, high = min(nums), max(nums)
                log = k != draft and low > 0 and high / low >= 4
                numeric[k] = (low, high, log, len(set(nums)))
            else:
                levels[k] = tuple(sorted({repr(v) for v in values}))
        return Features(tuple(varying), numeric, levels, draft)

    def row(self, params: Mapping[str, Any]) -> list[float]:
        out = [1.0]
        for k in self.knobs:
            if k in self.numeric:
                low, high, log, distinct = self.numeric[k]
                v = float(params.get(k, low))
                if k == self.draft:
                    u = math.log2(1 + max(v, 0)) / max(math.log2(1 + high), 1e-9)
                    out += [float(v > 0), u] if distinct >= 3 else [u]
                    continue
                u = math.log(v / low) / math.log(high / low) if log else (v - low) / (high - low)
                out += [u, u * u] if distinct >= 3 else [u]
            else:
                out += [float(repr(params.get(k)) == v) for v in self.levels[k][1:]]
        return out


def fit_predict(
    features: Features,
    data: Sequence[tuple[Mapping[str, Any], float]],
    targets: Sequence[Mapping[str, Any]],
    noise: float,
) -> list[tuple[float, float, float] | None]:
    """(value, low, high) per target configuration, or None where the measurements
    ``data`` (params, value) do not identify it."""
    if not data:
        return [None] * len(targets)
    log = all(v > 0 for _, v in data)
    x = np.array([features.row(p) for p, _ in data])
    y = np.array([math.log(v) if log else v for _, v in data])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    rss = float(((x @ coef - y) ** 2).sum())
    rank = int(np.linalg.matrix_rank(x))
    scale = 1.0 if log else max(abs(float(y.mean())), 1e-9)
    floor = noise * scale
    variance = (rss + PSEUDO * floor**2) / (max(len(data) - rank, 0) + PSEUDO)
    gram = np.linalg.pinv(x.T @ x)
    projector = np.linalg.pinv(x) @ x
    out: list[tuple[float, float, float] | None] = []
    for params in targets:
        row = np.array(features.row(params))
        if np.linalg.norm(row - row @ projector) > 1e-6 * max(1.0, float(np.linalg.norm(row))):
            out.append(None)
            continue
        mu = float(row @ coef)
        half = 2 * math.sqrt(variance * (1 + float(row @ gram @ row)))
        if log:
            out.append((math.exp(mu), math.exp(mu - half), math.exp(mu + half)))
        else:
            out.append((mu, mu - half, mu + half))
    return out
