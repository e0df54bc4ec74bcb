"""What the screening pass decided and what it saved, from the sweep's own records.

Every decision is a stored ``screening`` event (``kept`` true or false, the reason,
the trial and its attempt; the latest of the trial's latest attempt counts: a trial
interrupted and run again is screened again); the screening levels are stored apart from
the full measurement (``SweepData.screening``). The saving is measured, not assumed:

* a full measurement costs what the configurations measured in full spent on it:
  their full levels' requests and durations (launches a trial has of its own,
  never the confirm phase's relaunches), times the GPUs each held. A configuration
  screened out did not spend the mean of their requests, and the mean of their
  GPU-seconds scaled by how much longer (or shorter) its own screening levels took
  than theirs: the same short levels, so the same ratio as its full levels would have
  shown (a slower configuration takes longer for the same requests);
* screening itself costs every screening level's requests and duration, the kept
  configurations' too: the saving is net of it;
* launches not started: each screened-out configuration's own launches after the
  first (``launches`` above 1).

Warm-up runs once per launch either way and is in neither figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from servesweep.decide.numbers import format_number
from servesweep.decide.refs import stored_spec
from servesweep.metrics_catalog import COMPLETED, FAILED
from servesweep.models import LevelResult, Outcome
from servesweep.records import SweepData, TrialRecord

__all__ = ["ScreeningSummary", "decisions", "screening_note", "summarise_screening"]


def decisions(events: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """The latest stored screening decision of each trial, by trial id."""
    out: dict[int, Mapping[str, Any]] = {}
    for event in events:
        trial = event.get("trial")
        if trial is not None:
            out[int(trial)] = event
    return out


def _requests(results: Iterable[LevelResult]) -> int:
    return int(
        sum(r.metrics.get(COMPLETED.name, 0.0) + r.metrics.get(FAILED.name, 0.0) for r in results)
    )


def _gpus(trial: TrialRecord) -> int:
    return max(1, len(trial.gpus))


def _seconds(trial: TrialRecord, levels: Iterable[LevelResult]) -> float:
    """GPU-seconds of ``levels`` of ``trial``."""
    return sum(r.duration_s for r in levels) * _gpus(trial)


@dataclass(frozen=True)
class ScreeningSummary:
    """The screening pass of a sweep, as far as it went."""

    screened: tuple[int, ...]
    """Trial ids screening decided on, in run order."""
    out: tuple[int, ...]
    """Those screened out (not measured in full)."""
    kept: tuple[int, ...]
    """Those measured in full."""
    screening_requests: int
    """Requests of every screening level (kept configurations' too)."""
    screening_gpu_s: float
    full_requests: float | None
    """Mean requests of one full measurement (None: none finished yet)."""
    full_gpu_s: float | None
    """Mean GPU-seconds of one full measurement's levels (of those measured in full)."""
    out_gpu_s: float | None
    """GPU-seconds the screened-out configurations' full measurements would have
    taken (each scaled by its screening time against the kept ones')."""
    launches_saved: int
    reasons: Mapping[int, str]

    @property
    def requests_saved(self) -> float | None:
        """Requests not spent, net of screening's own."""
        if self.full_requests is None:
            return None
        return len(self.out) * self.full_requests - self.screening_requests

    @property
    def gpu_s_saved(self) -> float | None:
        """GPU-seconds of measurement not spent, net of screening's own."""
        if self.out_gpu_s is None:
            return None
        return self.out_gpu_s - self.screening_gpu_s

    @property
    def unscreened_gpu_s(self) -> float | None:
        """What measuring every screened configuration in full would have taken."""
        if self.full_gpu_s is None or self.out_gpu_s is None:
            return None
        return len(self.kept) * self.full_gpu_s + self.out_gpu_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "screened": list(self.screened),
            "screened_out": list(self.out),
            "measured_in_full": list(self.kept),
            "screening_requests": self.screening_requests,
            "screening_gpu_seconds": self.screening_gpu_s,
            "full_measurement_requests": self.full_requests,
            "full_measurement_gpu_seconds": self.full_gpu_s,
            "screened_out_gpu_seconds": self.out_gpu_s,
            "requests_saved": self.requests_saved,
            "gpu_seconds_saved": self.gpu_s_saved,
            "launches_saved": self.launches_saved,
            "reasons": {str(k): v for k, v in self.reasons.items()},
        }


def summarise_screening(data: SweepData) -> ScreeningSummary | None:
    """The screening pass of ``data`` (None: it had none)."""
    trials = {t.id: t for t in data.trials}
    found = decisions(
        e
        for e in data.screened
        if e.get("trial") in trials
        and int(e.get("attempt", trials[int(e["trial"])].attempts))
        == trials[int(e["trial"])].attempts
    )
    if not found:
        return None
    order = sorted(found, key=lambda t: (trials[t].seq, t))
    out = tuple(t for t in order if not found[t].get("kept"))
    kept = tuple(t for t in order if found[t].get("kept"))
    spec = stored_spec(data)
    own_launches = spec.max_launches if spec is not None else None
    requests: list[float] = []
    seconds: list[float] = []
    kept_screening: list[float] = []
    for t in kept:
        trial = trials[t]
        if trial.outcome is not Outcome.OK:
            continue
        full = [
            r for r in data.results.get(t, ()) if own_launches is None or r.launch < own_launches
        ]
        if not full:
            continue
        requests.append(float(_requests(full)))
        seconds.append(sum(r.duration_s for r in full) * _gpus(trial))
        kept_screening.append(_seconds(trial, data.screening.get(t, ())))
    screening = [(trials[t], data.screening.get(t, ())) for t in order]
    full_gpu_s = statistics.fmean(seconds) if seconds else None
    out_gpu_s = None
    if full_gpu_s is not None:
        per = statistics.fmean(kept_screening)
        out_gpu_s = sum(
            full_gpu_s * (_seconds(trials[t], data.screening.get(t, ())) / per if per > 0 else 1.0)
            for t in out
        )
    return ScreeningSummary(
        screened=tuple(order),
        out=out,
        kept=kept,
        screening_requests=sum(_requests(levels) for _, levels in screening),
        screening_gpu_s=sum(_seconds(t, levels) for t, levels in screening),
        full_requests=statistics.fmean(requests) if requests else None,
        full_gpu_s=full_gpu_s,
        out_gpu_s=out_gpu_s,
        launches_saved=len(out) * max(0, (own_launches or 1) - 1),
        reasons={t: str(found[t].get("reason", "")) for t in out},
    )


def _ids(trials: Iterable[int], numbers: Mapping[int, int]) -> str:
    return ", ".join(f"#{numbers.get(t, t)}" for t in trials)


def screening_note(summary: ScreeningSummary, numbers: Mapping[int, int] | None = None) -> str:
    """One line: ``screening: 6 configurations on short levels, 4 screened out (#2, #3,
    #5, #6), 2 measured in full; not spent: 410 requests, 96.3 GPU-s of measurement
    (net of screening's 96 requests, 21.8 GPU-s; 57% of measuring all 6 in full)``.
    ``numbers``: trial id -> the number people read (``#N``)."""
    nums = numbers or {}
    n = len(summary.screened)
    parts = [
        f"screening: {n} configuration{'s' if n != 1 else ''} on short levels, "
        f"{len(summary.out)} screened out"
        + (f" ({_ids(summary.out, nums)})" if summary.out else "")
        + f", {len(summary.kept)} measured in full"
    ]
    requests, gpu_s, total = summary.requests_saved, summary.gpu_s_saved, summary.unscreened_gpu_s
    if requests is None or gpu_s is None or total is None:
        parts.append("no full measurement finished yet to measure the saving against")
    else:
        share = f"; {gpu_s / total:.0%} of measuring all {n} in full" if total > 0 else ""
        launches = (
            f", {summary.launches_saved} launch{'es' if summary.launches_saved != 1 else ''}"
            if summary.launches_saved
            else ""
        )
        word = "not spent" if gpu_s >= 0 else "cost more than it saved"
        parts.append(
            f"{word}: {format_number(requests)} requests, {format_number(gpu_s)} GPU-s of "
            f"measurement{launches} (net of screening's {summary.screening_requests} "
            f"requests, {format_number(summary.screening_gpu_s)} GPU-s{share})"
        )
    return "; ".join(parts)
