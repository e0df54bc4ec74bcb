"""The predictor's plain records: what it is given and what it answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from servesweep.decide.stats import MetricStats

__all__ = ["Measured", "Prediction", "Setting", "Trust"]


@dataclass(frozen=True)
class Measured:
    """One measured configuration: its parameters and its level metrics, named
    ``workload.level.metric`` (``chat.c8.output_throughput``)."""

    params: Mapping[str, Any]
    metrics: Mapping[str, float]
    rates: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """Per level (``chat.c8``), the cumulative acceptance rate per draft position the
    engine counted (``accepted_per_pos`` over ``drafts``), when it did."""
    stats: Mapping[str, MetricStats] = field(default_factory=dict)
    """Per metric, its stats over the level's repeats and launches (the interval of its
    mean, the launches and their spread), where the results give them: what a decision
    reads of it (``decide.uncertainty.decision_se``), and the relaunches the noise is
    learned from (``learned_launch_sd``)."""


@dataclass(frozen=True)
class Setting:
    """What the predictor is told about the sweep."""

    metrics: tuple[str, ...]
    """The metrics to predict: the objective's and the constraints'."""
    draft_param: str | None = None
    """The parameter that sets the draft length (absent or 0: no speculation)."""
    concurrency: Mapping[str, float] = field(default_factory=dict)
    """Per level (``chat.c8``), the requests in flight: the batch of the step-cost model."""
    invariant: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Per metric name (``acceptance_length``), the parameters known not to change it.
    The acceptance curve is shared only across the parameters named here for
    :attr:`acceptance`: trials that differ in any other (but the draft length) have
    curves of their own."""
    drafter: frozenset[str] = frozenset()
    """The parameters that change what is drafted and nothing else (the engine's
    speculative parameters but the draft length: the draft model, its minimum
    probability, the ngram lookup sizes): without speculation (draft length 0) they do
    nothing, so a trial without speculation gives the step cost of no drafting to every
    configuration that agrees with it on the other parameters."""
    follows: frozenset[str] = frozenset()
    """The parameters whose value is set by the draft length, one value per draft length
    and the other way round (llama-server's ``--spec-synth-rates``, which must list one
    rate per drafted position): they tell nothing the draft length does not, so
    configurations that differ only there and in the draft length share their drafter's
    acceptance curve and step cost."""
    draft_models: frozenset[str] = frozenset()
    """The swept parameters that name a draft model (``EnginePreset.draft_model_params``):
    a configuration that sets one drafts with a model."""
    model_drafts: bool = False
    """Whether the server's own arguments name a draft model: every configuration that
    speculates drafts with it, unless a swept :attr:`draft_models` parameter says
    otherwise."""
    cpu: bool = False
    """Whether the server runs on CPUs (``server.gpu_backend: none``). There a draft
    model's tokens are drafted one forward pass each and verified at a cost per token
    (the passes are bound by compute), so a step costs per drafted token as well as for
    switching speculation on; on a GPU at a small batch both are bound by memory and
    the step grows slowly with the draft length (on an H100, as ``log2(1 + k)``), and a
    drafter without a model (ngram lookup) costs next to nothing to draft anywhere
    (:func:`~servesweep.decide.perf.speculative.fit_step_cost`'s ``sequential``)."""
    throughput: str = "output_throughput"
    acceptance: str = "acceptance_length"
    tpot: str = "tpot_mean_ms"
    """A level's time per output token after the first (ms): with :attr:`ttft` and
    :attr:`tokens`, the decode step apart from the first token's time."""
    ttft: str = "ttft_mean_ms"
    """A level's time to the first token (ms): the prompt's prefill (the draft's too)."""
    tokens: str = "completion_tokens_mean"
    """A level's tokens per answer."""
    noise: float = 0.02
    """The stated relative standard deviation between launches of one configuration
    (``decision.launch_sd``): the noise of one launch's figure until the sweep's own
    relaunches measure it. :func:`~servesweep.decide.perf.predict` learns the noise of
    each metric from them by the rule ``best`` decides with
    (:func:`~servesweep.decide.uncertainty.learned_launch_sd`, this as its prior)."""


BASES = ("measured", "invariant", "speculative", "empirical", "unknown")


@dataclass(frozen=True)
class Prediction:
    """A metric's predicted value and interval, or unknown (``value`` None)."""

    metric: str
    value: float | None = None
    low: float | None = None
    high: float | None = None
    basis: str = "unknown"
    """Which model answered: one of :data:`BASES`."""

    @property
    def known(self) -> bool:
        return self.value is not None

    def reaches(self, target: float, maximize: bool) -> bool:
        """Whether the interval reaches ``target`` (an unknown one reaches anything)."""
        if self.low is None or self.high is None:
            return True
        return self.high >= target if maximize else self.low <= target

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "basis": self.basis,
        }


@dataclass(frozen=True)
class Trust:
    """How much wider than its own estimate each metric's interval is drawn: a factor
    per metric, at least 1, that only grows (:func:`servesweep.decide.perf.verify`)."""

    widen: Mapping[str, float] = field(default_factory=dict)

    def factor(self, metric: str) -> float:
        return self.widen.get(metric, 1.0)
