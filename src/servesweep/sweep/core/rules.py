"""The driver's rules as pure functions, beside the scheduler's decisions: how many
slots a machine runs, when a failure is the machine's and seen twice in a row (the
sweep stops), whether a trial that lost its node runs again, when a search that keeps
proposing what cannot fit stops, and which stored records belong to a machine. They
read plain data and return plain data; the driver carries out what they decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servesweep.models import FailureClass, InstanceRecord, Outcome
from servesweep.spec.schema import SweepSpec
from servesweep.spec.slots import gpu_need, slot_port
from servesweep.store import SweepRecord, TrialRecord
from servesweep.sweep.slots.data import NodeInfo

__all__ = [
    "MAX_SKIPS_IN_ROW",
    "NODE_LOST_RETRIES",
    "EnvironmentFailure",
    "NotAgain",
    "RunAgain",
    "environment_failure",
    "lost_trial",
    "max_slots",
    "repeated_environment",
    "runs_on",
    "skipped_too_often",
    "slot_of_port",
    "stored_baseline",
]

MAX_SKIPS_IN_ROW = 1000
"""A search that proposes this many configurations predicted not to fit in a row stops."""
NODE_LOST_RETRIES = 1
"""How many times a trial whose node was lost is run again."""


def max_slots(spec: SweepSpec, option: int | None = None) -> int:
    """How many slots a machine may run at once: ``--slots`` (``option``), else the
    sweep file's ``parallel``, capped by what fits in the GPU pool (and ``ports``)."""
    need = gpu_need(spec)
    pool = len(spec.server.gpus)
    limit = option or spec.parallel
    fit = max(1, pool)  # trials sized per configuration: at most one per GPU
    if need.fixed is not None:
        fit = max(1, pool // need.fixed) if pool else 1
    if spec.server.ports:
        fit = min(fit, len(spec.server.ports))
    return max(1, min(fit, limit or fit))


def slot_of_port(spec: SweepSpec, slots: int, port: int | None) -> int | None:
    """The slot (of the first ``slots``) whose port is ``port``; None: no slot's."""
    if port is None:
        return None
    return next((k for k in range(slots) if slot_port(spec, k) == port), None)


# -- failures of the machine --------------------------------------------------------------

_ENVIRONMENT_CLASSES = (FailureClass.PORT_IN_USE, FailureClass.GPU_BUSY, FailureClass.STOP_FAILED)


@dataclass(frozen=True)
class EnvironmentFailure:
    """A failure of the machine rather than of a configuration: its class and holder."""

    failure_class: FailureClass
    holder: tuple[int, ...]
    """The PIDs its evidence names (GPU holders, port owners, unkillable processes)."""
    names: str = field(default="", compare=False)

    def describe(self) -> str:
        return f"{self.failure_class.value} ({self.names or 'no holder named'})"


def environment_failure(trial: TrialRecord) -> EnvironmentFailure | None:
    """A failed trial's environment failure (``port_in_use``, ``gpu_busy``,
    ``stop_failed``) and who caused it; None for any other outcome."""
    if trial.outcome is not Outcome.FAILED or trial.failure_class not in _ENVIRONMENT_CLASSES:
        return None
    assert trial.failure_class is not None
    evidence = trial.evidence
    holders: dict[int, str] = {}
    if evidence is not None:
        holders.update({h.pid: h.describe() for h in evidence.gpu_holders})
        holders.update({p.pid: p.describe() for p in evidence.processes})
    names = "; ".join(holders[p] for p in sorted(holders)[:3])
    if len(holders) > 3:
        names += f" and {len(holders) - 3} more"
    return EnvironmentFailure(trial.failure_class, tuple(sorted(holders)), names)


def repeated_environment(
    last: tuple[int, EnvironmentFailure | None] | None,
    number: int,
    failure: EnvironmentFailure | None,
) -> str | None:
    """The same environment failure (class and holder) on two trials in a row (``last``:
    the number and failure of the trial before trial ``number``): the machine, not the
    configurations, is at fault and every further trial would fail alike. The line that
    stops the sweep (the trials not run stay pending); None: go on."""
    if failure is None or last is None or last[1] != failure:
        return None
    return (
        f"trials {last[0]} and {number} both failed {failure.describe()}: "
        "stopping the sweep (the trials not run stay pending); free it and run the "
        "sweep again"
    )


# -- a lost node ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunAgain:
    """Queue the trial once more, first in line (its failed attempt stays in the events
    and the attempt count)."""

    message: str


@dataclass(frozen=True)
class NotAgain:
    """The trial lost its node but cannot run again: no machine left is large enough."""

    message: str


def lost_trial(
    trial: TrialRecord, retried: int, need: int, largest: int
) -> RunAgain | NotAgain | None:
    """What follows a finished trial that ``retried`` times ran again already, needs
    ``need`` GPUs, with ``largest`` GPUs on the largest machine left: None when it did
    not lose its node, or lost it more than ``NODE_LOST_RETRIES`` times (final)."""
    if trial.failure_class is not FailureClass.NODE_LOST or retried >= NODE_LOST_RETRIES:
        return None
    if need > largest:
        return NotAgain(
            f"trial {trial.number} is not run again: it needs {need} GPUs and no "
            f"machine left has that many (largest: {largest})"
        )
    lost = "node" if trial.evidence is None or trial.evidence.reason == "node_died" else "slot"
    return RunAgain(f"trial {trial.number} lost its {lost} on {trial.node}: running it again")


def skipped_too_often(skips: int) -> str | None:
    """The line that stops a search whose last ``skips`` proposals in a row were
    predicted not to fit or not to beat the best (None: it goes on)."""
    if skips < MAX_SKIPS_IN_ROW:
        return None
    return (
        f"the search proposed {skips} configurations in a row that are "
        "predicted not to fit or not to beat the best so far; it stops (see servesweep "
        "plan, or run --no-predict)"
    )


# -- what earlier runs left -----------------------------------------------------------------


def runs_on(node: NodeInfo, instance: InstanceRecord) -> bool:
    """Whether a recorded instance runs on ``node`` (records of older servesweeps name
    no machine: they ran here)."""
    if instance.node_id:
        return instance.node_id == node.node_id
    return instance.node in ("", node.name) and not node.node_id


def stored_baseline(sweep: SweepRecord, node: str) -> dict[int, int] | None:
    """The baseline an earlier run of this sweep took on ``node`` (None when none)."""
    stored = sweep.environment.get("baseline_bytes")
    if not isinstance(stored, dict) or not stored:
        return None
    values: Any = stored.get(node)
    if values is None and all(str(k).isdigit() for k in stored):
        # written by an older servesweep: one machine, the sweep's own
        values = stored if sweep.environment.get("hostname") in (None, node) else None
    if not isinstance(values, dict) or not values:
        return None
    return {int(k): int(v) for k, v in values.items()}
