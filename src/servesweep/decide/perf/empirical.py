"""The empirical model over every knob: additive in the log of the metric.

Each knob is a few features of its normalized value (a numeric one on a log scale when
its values span a factor of 4 or more, quadratic when it takes three values or more; a
draft length as "speculation on" and ``log2(1 + k)``; any other value one-hot), and the
metric's log is their sum: a Bayesian linear regression with a prior on each effect
(:data:`PRIOR_SD`), so a few measurements already give a trend near them and nothing
far from them. The interval is two standard deviations of the prediction, from the
residuals (with two pseudo-observations of the measurement noise, so that an exact fit
of few trials is not taken as exact) and the posterior of the effects; where it would
be wider than :data:`UNKNOWN_SD` allows, the prediction says unknown instead of
guessing.
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
PRIOR_SD = 0.5
"""Prior standard deviation of each feature's effect on the log of the metric: a knob
moved over its whole range changes the metric by a factor within ``e**(+-1)`` (0.37 to
2.7) at two standard deviations. The intercept has no prior (flat)."""
UNKNOWN_SD = 0.25
"""A prediction whose standard deviation (log scale) is above this is ``unknown``: its
two-standard-deviation interval would span more than a factor of ``e**(+-0.5)``."""


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
    ``data`` (params, value) leave it too uncertain (:data:`UNKNOWN_SD`)."""
    if not data:
        return [None] * len(targets)
    log = all(v > 0 for _, v in data)
    x = np.array([features.row(p) for p, _ in data])
    y = np.array([math.log(v) if log else v for _, v in data])
    scale = 1.0 if log else max(abs(float(y.mean())), 1e-9)
    floor = noise * scale
    prior = np.diag([1e6] + [(PRIOR_SD * scale) ** 2] * (x.shape[1] - 1))
    prior_inv = np.linalg.inv(prior)

    def posterior(sigma2: float) -> tuple[np.ndarray, np.ndarray]:
        cov = np.linalg.inv(x.T @ x / sigma2 + prior_inv)
        return cov @ x.T @ y / sigma2, cov

    mean, cov = posterior(floor**2)
    used = float(np.trace(x @ cov @ x.T)) / floor**2  # the parameters the data pinned
    rss = float(((x @ mean - y) ** 2).sum())
    sigma2 = (rss + PSEUDO * floor**2) / (max(len(data) - used, 0.0) + PSEUDO)
    mean, cov = posterior(sigma2)
    out: list[tuple[float, float, float] | None] = []
    for params in targets:
        row = np.array(features.row(params))
        sd = math.sqrt(sigma2 + float(row @ cov @ row))
        if sd > UNKNOWN_SD * scale:
            out.append(None)
            continue
        mu, half = float(row @ mean), 2 * sd
        if log:
            out.append((math.exp(mu), math.exp(mu - half), math.exp(mu + half)))
        else:
            out.append((mu, mu - half, mu + half))
    return out
