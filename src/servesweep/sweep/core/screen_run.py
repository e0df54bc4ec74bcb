"""The screening pass as the driver runs it: the snapshot each trial's order carries
(:class:`~servesweep.decide.screening.ScreenPolicy`), read from the store when the trial
is handed to a slot. The slot decides on its own short levels
(:func:`servesweep.decide.screening.screen_reason`) and stores the decision as a
``Screened`` fact; the trial's outcome (``pruned``, reason ``screened``, or the full
measurement's) is stored like any other, so a rerun continues with the trials not
decided yet."""

from __future__ import annotations

from servesweep.decide.best import find_best
from servesweep.decide.screening import Figure, Reference, ScreenPolicy, figure_of, screening_stats
from servesweep.errors import ConfigError
from servesweep.models import usable
from servesweep.spec.constraints import resolve_objectives, validate_constraints
from servesweep.spec.schema import SweepSpec
from servesweep.spec.screening import ScreeningPlan
from servesweep.store import Store

__all__ = ["screen_policy"]


def screen_policy(
    store: Store, sweep_id: int, spec: SweepSpec, plan: ScreeningPlan
) -> ScreenPolicy:
    """The snapshot for the next trial: the sweep's objectives and constraints, and as
    references the candidates of ``best`` now (measured in full, meeting the
    constraints) by their own screening figures."""
    objectives = resolve_objectives(spec)
    confidence = spec.decision.confidence
    references: list[Reference] = []
    data = store.load_sweep_data(sweep_id, with_samples=False, with_telemetry=False)
    try:
        ranking = find_best(data).ranking
    except ConfigError:
        # nothing measured yet to rank (no objective can be found); never an Interrupted
        # (Ctrl-C raises it wherever the run is: it must stop the run, not the references)
        ranking = ()
    for cand in ranking:
        levels = usable(data.screening.get(cand.trial.id, ()), spec.include_unreliable)
        figures: list[Figure] = []
        for ref, _ in objectives:
            stats = screening_stats(levels, ref, cand.trial.phase_seconds)
            if stats is None:
                break
            figures.append(figure_of(stats, confidence))
        else:
            references.append(Reference(cand.trial.id, cand.trial.id, tuple(figures)))
    return ScreenPolicy(
        objectives=tuple(objectives),
        constraints=validate_constraints(spec),
        references=tuple(references),
        confidence=confidence,
        threshold=plan.threshold,
        include_unreliable=spec.include_unreliable,
    )
