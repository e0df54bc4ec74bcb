"""A configuration's predicted memory: the record, the margin, the verdict and the
calibration that later measurements apply. Pure data and arithmetic, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from servesweep.decide.memory import certain_oom

__all__ = [
    "COMPONENTS",
    "Calibration",
    "Capacity",
    "MemoryPrediction",
    "Verdict",
    "margin_for",
]

Verdict = Literal["fits", "oom", "unknown"]
COMPONENTS = ("weights", "kv_cache", "draft", "workspace")
MIN_MARGIN = 256 * 2**20
MARGIN_FRACTION = 0.02


def margin_for(per_gpu: int, exact: bool = False) -> int:
    """The stated margin: the larger of 2 % of the prediction and 256 MiB (0 for the
    simulated engine, whose fake GPUs count exactly what it asks for)."""
    if exact:
        return 0
    return max(MIN_MARGIN, int(per_gpu * MARGIN_FRACTION))


@dataclass(frozen=True)
class Capacity:
    """What a trial's memory is held against, per device."""

    bytes: int | None
    """Memory of one device (the smallest of the trial's GPUs; the host's memory for a
    CPU-only engine); None when unknown."""
    device: Literal["gpu", "host"] = "gpu"
    source: str = ""
    """``NVML``, ``fake GPUs``, ``server.fake_gpus``, ``host memory``."""


@dataclass(frozen=True)
class Calibration:
    """Factors learned from measured trials: measured / predicted per component, and
    the per-device memory no component explains (CUDA context, library workspaces)."""

    weights: float = 1.0
    kv_cache: float = 1.0
    workspace: float = 1.0
    overhead: int = 0
    trials: int = 0
    """Measured trials behind these factors (0: none, the prediction is uncalibrated)."""

    def factor(self, component: str) -> float:
        return float(getattr(self, component, 1.0)) if component != "draft" else self.weights


@dataclass(frozen=True)
class MemoryPrediction:
    """One configuration's memory per device, by component (bytes)."""

    engine: str
    verdict: Verdict
    weights: int = 0
    kv_cache: int = 0
    draft: int = 0
    workspace: int = 0
    margin: int = 0
    capacity: int = 0
    """What the total is held against: the device's memory, or the share the engine
    takes of it (vLLM: ``gpu-memory-utilization`` x the GPU)."""
    device: Literal["gpu", "host"] = "gpu"
    device_bytes: int = 0
    """The device's whole memory."""
    reason: str = ""
    """Why ``oom`` or ``unknown``; what the prediction rests on for ``fits``."""
    kv_tokens: int = 0
    """Tokens of KV cache the engine allocates (0: unknown)."""
    calibrated: int = 0
    """Measured trials whose figures corrected this prediction."""
    exact: bool = False
    """The device counts exactly what the engine asks for (the fake GPUs): margin 0."""
    kv_needed: int = 0
    """Bytes of KV cache the engine needs to start, where its KV cache takes all that is
    left of its share (vLLM: one request of ``max-model-len``); 0: the KV cache is what
    the engine's settings size."""
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def per_gpu_bytes(self) -> int:
        return self.weights + self.kv_cache + self.draft + self.workspace

    @property
    def over_by(self) -> int:
        """Bytes beyond the capacity (negative: room left). Where the KV cache takes all
        that is left (``kv_needed``), the room is what is left beyond the KV cache the
        engine needs to start, not the 0 its full share would give."""
        if self.kv_needed:
            return self.weights + self.draft + self.workspace + self.kv_needed - self.capacity
        return self.per_gpu_bytes - self.capacity

    @property
    def certain_oom(self) -> bool:
        """Predicted not to fit by more than the margin: not worth a launch."""
        return certain_oom(self.verdict, self.per_gpu_bytes, self.capacity, self.margin)

    def to_json(self) -> dict[str, Any]:
        return {
            "per_gpu_bytes": self.per_gpu_bytes,
            "weights": self.weights,
            "kv_cache": self.kv_cache,
            "draft": self.draft,
            "workspace": self.workspace,
            "margin": self.margin,
            "capacity": self.capacity,
            "verdict": self.verdict,
            "device": self.device,
            "device_bytes": self.device_bytes,
            "kv_tokens": self.kv_tokens,
            "kv_needed": self.kv_needed,
            "calibrated": self.calibrated,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryPrediction:
        return cls(
            engine=str(data.get("engine", "")),
            verdict=data.get("verdict", "unknown"),
            weights=int(data.get("weights", 0)),
            kv_cache=int(data.get("kv_cache", 0)),
            draft=int(data.get("draft", 0)),
            workspace=int(data.get("workspace", 0)),
            margin=int(data.get("margin", 0)),
            capacity=int(data.get("capacity", 0)),
            device="host" if data.get("device") == "host" else "gpu",
            device_bytes=int(data.get("device_bytes", 0)),
            reason=str(data.get("reason", "")),
            kv_tokens=int(data.get("kv_tokens", 0)),
            calibrated=int(data.get("calibrated", 0)),
            kv_needed=int(data.get("kv_needed", 0)),
        )

    def with_verdict(self) -> MemoryPrediction:
        """The same prediction with its verdict (and margin) computed from the totals;
        an ``unknown`` stays unknown, an ``oom`` found by an engine rule stays oom."""
        if self.verdict == "unknown":
            return self
        margin = self.margin or margin_for(self.per_gpu_bytes, exact=self.exact)
        if self.capacity <= 0:
            return replace(self, verdict="unknown", margin=margin, reason="capacity unknown")
        if self.verdict == "oom":
            return replace(self, margin=margin)
        verdict: Verdict = "oom" if self.per_gpu_bytes > self.capacity else "fits"
        reason = self.reason
        if verdict == "oom":
            over = (self.per_gpu_bytes - self.capacity) / 2**30
            reason = f"{over:.2f} GiB over the capacity" + (f" ({reason})" if reason else "")
        return replace(self, verdict=verdict, margin=margin, reason=reason)


def unknown(engine: str, reason: str, capacity: Capacity | None = None) -> MemoryPrediction:
    return MemoryPrediction(
        engine=engine,
        verdict="unknown",
        reason=reason,
        capacity=capacity.bytes or 0 if capacity else 0,
        device=capacity.device if capacity else "gpu",
        device_bytes=capacity.bytes or 0 if capacity else 0,
    )
