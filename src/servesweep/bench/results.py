"""Results of workloads as pure data: what the load generator and the evals return,
what the store keeps and what reports read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EvalTaskResult", "LevelResult", "RequestSample"]


@dataclass(frozen=True)
class RequestSample:
    """One request as measured. Times are seconds on a monotonic clock, relative
    to the start of the level's run."""

    index: int
    ok: bool
    error: str | None = None
    """Error type when not ok: ``http_500``, ``timeout``, ``connection``, ``empty``..."""
    scheduled_at: float | None = None
    sent_at: float = 0.0
    first_token_at: float | None = None
    """When the first chunk carrying generated content arrived."""
    finished_at: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    chunk_gaps: tuple[float, ...] = ()
    """Gaps between content chunks after the first, in seconds."""
    chunk_tokens: tuple[int, ...] = ()
    """Tokens in each content chunk (first included)."""

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    @property
    def e2e(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.sent_at


@dataclass(frozen=True)
class LevelResult:
    """One workload at one load level (one repeat)."""

    workload: str
    level: str
    """``c8`` (concurrency 8) or ``r2.5`` (2.5 req/s); see models.level_label."""
    repeat: int
    metrics: Mapping[str, float]
    """Flat metric names, e.g. ``output_throughput``, ``ttft_p99_ms``, ``pass_rate``."""
    samples: tuple[RequestSample, ...] = ()
    warnings: tuple[str, ...] = ()
    info: Mapping[str, Any] = field(default_factory=dict)
    """Non-numeric facts: acceptance source, telemetry per GPU, errors by type..."""
    started_at: float = 0.0
    """Wall-clock (time.time()) start of the run."""
    duration_s: float = 0.0
    eval_results: tuple[EvalTaskResult, ...] = ()


@dataclass(frozen=True)
class EvalTaskResult:
    """One sample of one correctness task."""

    task_id: str
    sample: int
    status: str
    """``pass``, ``fail``, ``timeout``, ``crash``, ``resource_limit``, ``no_answer``, ``error``."""
    message: str = ""
    seconds: float = 0.0
