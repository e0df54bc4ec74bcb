"""Which earlier sweeps of the results database start a sweep's performance prediction
warm: the one rule for the performance gate (``predict_gate``), the sampling search's
guide (given the gate's measurements) and ``servesweep plan``.

An earlier sweep counts when all of these hold (:func:`why_not_earlier`):

1. it has the sweep's name (a sweep of another name may sweep other knobs, or the same
   knobs for another purpose; its trials are not taken for this sweep's past);
2. what its trials measured is what this sweep's measure, read from the sweep file it
   stored (``identity.changes`` finds nothing): the same engine, executable, model,
   fixed args and environment, launcher, GPUs per trial, and every workload the two
   share defined the same (the predictions are per ``workload.level.metric``);
3. it ran on GPUs of the same names (``gpu.gpu_names`` of the sweep's environment,
   where both sweeps recorded them: a sweep not run yet has not).

A sweep started ``--fresh`` after its file changed the model or the GPUs changed under
it is therefore not this sweep's past. The engine's version may differ (an upgrade is
what a new sweep of the same name often follows): what it changed shows as
measurements outside their predicted intervals, which widen the intervals for the rest
of the sweep (``decide.perf.verify``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servesweep.errors import ConfigError
from servesweep.spec.load import load_sweep_text
from servesweep.spec.schema import SweepSpec
from servesweep.store import Store, SweepRecord
from servesweep.sweep.core.identity import changes

__all__ = ["GPU_NAMES", "EarlierSweeps", "earlier_sweeps", "why_not_earlier"]

GPU_NAMES = "gpu.gpu_names"
"""The environment key the local site records the GPUs' names under."""

RULE = "same name, engine, model, GPUs and workloads"
"""The rule in a few words, for what the user is told."""


def why_not_earlier(
    spec: SweepSpec,
    environment: Mapping[str, Any],
    earlier: SweepRecord,
    earlier_spec: SweepSpec | None,
) -> str | None:
    """Why ``earlier`` (its sweep file read back as ``earlier_spec``; None: it cannot
    be read) is not a past of the sweep of ``spec`` run in ``environment``; None: it
    counts (see the module doc)."""
    if earlier.name != spec.name:
        return f"another name ({earlier.name!r})"
    if earlier_spec is None:
        return "its sweep file cannot be read by this servesweep"
    changed = changes(earlier_spec, spec)
    if changed:
        return f"it measured under other settings: {'; '.join(changed)}"
    mine, theirs = environment.get(GPU_NAMES), earlier.environment.get(GPU_NAMES)
    if mine and theirs and mine != theirs:
        return f"it ran on other GPUs ({theirs} -> {mine})"
    return None


@dataclass(frozen=True)
class EarlierSweeps:
    """The earlier sweeps that count, and those of the same name left out with why."""

    used: tuple[SweepRecord, ...] = ()
    left_out: tuple[tuple[SweepRecord, str], ...] = ()

    @property
    def ids(self) -> list[int]:
        return [s.id for s in self.used]

    def describe(self) -> str:
        """``#1, #3`` (``none``)."""
        return ", ".join(f"#{s.id}" for s in self.used) or "none"

    def notes(self, measured: int) -> list[str]:
        """What the user is told: the sweeps used (with ``measured`` trials of them)
        and each one of the same name left out; nothing when there is none."""
        out = []
        if self.used:
            out.append(
                f"the performance prediction starts warm from {measured} measured trial(s) "
                f"of earlier sweep(s) {self.describe()} ({RULE})"
            )
        for sweep, why in self.left_out:
            out.append(
                f"earlier sweep #{sweep.id} of the same name does not start the "
                f"performance prediction: {why}"
            )
        return out


def _spec_of(sweep: SweepRecord) -> SweepSpec | None:
    try:
        return load_sweep_text(sweep.spec_text, sweep.spec_path).spec
    except ConfigError:
        return None


def earlier_sweeps(store: Store, spec: SweepSpec, current: SweepRecord | None) -> EarlierSweeps:
    """The sweeps of ``store`` that start the prediction of the sweep of ``spec`` warm,
    ``current`` being its own record (None: not created yet), with those of its name
    left out and why."""
    environment = current.environment if current is not None else {}
    used: list[SweepRecord] = []
    left: list[tuple[SweepRecord, str]] = []
    for sweep in store.sweeps():
        if sweep.name != spec.name or (current is not None and sweep.id >= current.id):
            continue  # this sweep, or one created after it
        why = why_not_earlier(spec, environment, sweep, _spec_of(sweep))
        if why is None:
            used.append(sweep)
        else:
            left.append((sweep, why))
    return EarlierSweeps(tuple(used), tuple(left))
