"""Where a workload sends its requests: one OpenAI-compatible server."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Target"]


@dataclass(frozen=True)
class Target:
    base_url: str
    """``http://127.0.0.1:8000`` (no trailing ``/v1``)."""
    model: str
    """The model name to put in requests."""
    api_key: str | None = field(default=None, repr=False)
    """Sent as a Bearer token; never stored, never logged (hidden from repr)."""
    request_extras: Mapping[str, Any] = field(default_factory=dict)
    """Fields the engine preset adds to every request."""
    supports_ignore_eos: bool = True
    metrics_path: str | None = "/metrics"
    tokenize_path: str | None = None
    spec_decode_counters: Mapping[str, str] = field(default_factory=dict)
    """Prometheus counter names, see ``servers.engines.EnginePreset``."""
    spec_counters_when_speculating: bool = False
    """The engine's /metrics has those counters whenever it speculates: where they are
    missing or count no draft, no speculation ran (no acceptance is estimated)."""
    timeout_s: float = 600.0

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + path
