"""Swept parameters a trial's server did not run as asked (``config_mismatch``, found
once the server was ready: :mod:`servesweep.servers.config_check`), as the reports
say them: the measurement is of another configuration than its label."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from servesweep.records import SweepData, TrialRecord

__all__ = ["describe", "mismatch_notes", "trial_mismatches"]


def trial_mismatches(
    found: SweepData | Iterable[Mapping[str, Any]], trial: TrialRecord
) -> list[Mapping[str, Any]]:
    """The mismatches (of a sweep, or ``config_mismatch`` events as stored) found in
    the trial's latest attempt (a rerun starts over)."""
    since = trial.started_at or 0.0
    events = found.mismatches if isinstance(found, SweepData) else found
    return [
        m for m in events if m.get("trial") == trial.id and float(m.get("t") or 0.0) >= since - 1.0
    ]


def describe(mismatch: Mapping[str, Any]) -> str:
    """``ctx-size asked 8192, the engine runs 2048 (/props default_generation_settings.n_ctx)``."""
    return (
        f"{mismatch.get('param')} asked {mismatch.get('asked')}, the engine runs "
        f"{mismatch.get('engine')} ({mismatch.get('source')})"
    )


def mismatch_notes(data: SweepData, trials: Iterable[TrialRecord]) -> list[str]:
    """One note per trial whose server did not run what was asked."""
    notes = []
    for trial in trials:
        found = trial_mismatches(data, trial)
        if found:
            notes.append(
                f"config_mismatch: #{trial.number}'s server does not run what was asked: "
                + "; ".join(describe(m) for m in found)
                + " — its figures are of what it ran"
            )
    return notes
