"""The simulated engine's speculative-decoding model (formulas in docs/sim.md).

A draft tree of ``budget`` tokens with ``topk`` candidates per level has depth
``D = budget / topk``. One candidate is accepted with probability
``a = A_MAX * Weff / (Weff + W0)`` where ``Weff`` is the draft's attention window
(``window``, or the nominal context ``C`` when 0); a level is accepted when one of
its ``topk`` candidates is, ``p = 1 - (1 - a) ** topk``. A step emits the accepted
prefix plus the verified bonus token: ``E[L] = (1 - p ** (D + 1)) / (1 - p)``.
A step costs ``step_ms * (1 + CB * budget + CD * D * (0.25 + Weff / C))``: verifying
more draft tokens costs more, each draft level costs a draft forward whose
attention grows with the window. Throughput ``E[L] / step`` therefore has an
interior optimum in every knob (about budget 14, topk 3, window 2048).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["A_MAX", "CB", "CD", "CONTEXT", "W0", "SpecModel"]

A_MAX = 0.6
W0 = 300.0
CB = 0.08
CD = 0.15
CONTEXT = 8192.0


@dataclass(frozen=True)
class SpecModel:
    budget: int = 0
    topk: int = 1
    window: int = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    @property
    def effective_window(self) -> float:
        return min(float(self.window), CONTEXT) if self.window > 0 else CONTEXT

    @property
    def depth(self) -> float:
        return self.budget / max(self.topk, 1)

    @property
    def level_acceptance(self) -> float:
        """``p``: probability that one tree level is accepted."""
        w = self.effective_window
        a = A_MAX * w / (w + W0)
        return 1.0 - (1.0 - a) ** max(self.topk, 1)

    @property
    def step_factor(self) -> float:
        """Step time relative to ``--step-ms`` (1.0 without speculation)."""
        if not self.enabled:
            return 1.0
        return 1.0 + CB * self.budget + CD * self.depth * (0.25 + self.effective_window / CONTEXT)

    @property
    def expected_tokens_per_step(self) -> float:
        """``E[L]``: accepted draft tokens plus the bonus token, per decode step."""
        if not self.enabled:
            return 1.0
        p = self.level_acceptance
        return float((1.0 - p ** (self.depth + 1.0)) / (1.0 - p))

    def sample_step(self, rng: random.Random) -> int:
        """Accepted draft tokens of one step (the step emits this + 1 tokens)."""
        if not self.enabled:
            return 0
        whole = math.floor(self.depth)
        depth = whole + (1 if rng.random() < self.depth - whole else 0)
        p = self.level_acceptance
        accepted = 0
        while accepted < depth and rng.random() < p:
            accepted += 1
        return accepted
