"""The results database: sweeps, trials, results, telemetry (SQLite by default)."""

from __future__ import annotations

from servesweep.records import ReopenedSkip, SweepData, SweepRecord, TelemetryPoint, TrialRecord
from servesweep.store.sqlite import Store, open_store

__all__ = [
    "ReopenedSkip",
    "Store",
    "SweepData",
    "SweepRecord",
    "TelemetryPoint",
    "TrialRecord",
    "open_store",
]
