"""What the driver knows during a run, as plain data: its settings, each open slot
(:class:`SlotState`; the slot itself runs elsewhere) and the run's bookkeeping
(:class:`RunState`: the queue of jobs, the trials in flight, what the run started).
Only the driver's thread reads or changes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servesweep.sweep.core.rules import EnvironmentFailure
from servesweep.sweep.core.scheduler import Job
from servesweep.sweep.core.seams import SlotHandle

__all__ = ["RunSettings", "RunState", "SlotKey", "SlotState"]

SlotKey = tuple[str, int]
"""A slot by its machine's key (``NodeInfo.key``) and its number there."""


@dataclass(frozen=True)
class RunSettings:
    keep_running: bool = False
    fail_fast: bool = False
    max_slots: int | None = None
    """``--slots``: at most this many slots per machine (None: the sweep file's
    ``parallel``, else as many as fit)."""
    predict: bool = True
    """Predict each configuration's memory and performance, and skip what cannot fit
    or cannot win (``run --no-predict``: False, everything runs)."""


@dataclass
class SlotState:
    """What the driver knows of one open slot (the slot itself runs elsewhere).

    ``busy`` and ``tearing`` together: idle (``busy`` False) is the only state in which
    the scheduler decides for the slot; busy with a trial (``trial`` set), with a
    teardown (``tearing``: dropped when it goes idle) or with the finish."""

    handle: SlotHandle
    busy: bool = True
    """A command was sent and its ``SlotIdle`` has not come back yet: a run, a
    teardown or the finish. Only an idle slot gets a new decision; it starts busy
    (opened for a trial), except a slot opened for an adopted instance."""
    trial: int | None = None
    """The trial it runs (None while idle, or busy with a teardown or the finish)."""
    tearing: bool = False
    """A teardown was sent: dropped when its ``SlotIdle`` comes back (it gets no more
    work, although it is busy only until then)."""
    sched_gpus: tuple[int, ...] = ()
    """The GPUs the scheduler placed it on (a token GPU when the sweep has no pool)."""


@dataclass
class RunState:
    """The run's bookkeeping (see the module doc)."""

    jobs: list[Job] = field(default_factory=list)
    """The queue: trials not yet handed to a slot, in the order the scheduler places
    them (a trial whose node was lost goes first)."""
    slots: dict[SlotKey, SlotState] = field(default_factory=dict)
    running: dict[int, SlotKey] = field(default_factory=dict)
    """Trials handed to a slot whose slot has not gone idle since, by trial id: the
    slot's key. Marked ``interrupted`` when the run aborts."""
    stopping: bool = False
    """No trial is queued or handed to a slot any more (``--fail-fast``, repeated
    environment failures, an abort): the trials in flight finish, the queued ones stay
    pending for the next run. Never set back."""
    ran: list[int] = field(default_factory=list)
    """The trials this run started (not the confirm phase's relaunches), in order:
    what ``run`` returns; an abort marks the unfinished ones ``interrupted``."""
    lost_slots: set[SlotKey] = field(default_factory=set)
    """Slots whose process is gone: dropped once their command ends."""
    retried: dict[int, int] = field(default_factory=dict)
    """Trials run again after a lost node, and how often."""
    skips_in_row: int = 0
    """Trials the memory gate finished ``skipped`` since the last one placed."""
    relaunch: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Trials queued by the confirm phase, and the launch numbers to measure."""
    last_environment: tuple[int, EnvironmentFailure | None] | None = None
    """The trial that finished last (its number), and its environment failure (see
    ``rules.environment_failure``)."""

    @property
    def busy(self) -> bool:
        """Whether any slot has a command under way."""
        return any(s.busy for s in self.slots.values())

    def take_job(self, trial: int) -> Job:
        """The queued job of ``trial``, out of the queue."""
        job = next(j for j in self.jobs if j.trial == trial)
        self.jobs.remove(job)
        return job

    def first(self, trial: int) -> None:
        """Put the queued job of ``trial`` first in line."""
        self.jobs.insert(0, self.take_job(trial))

    def handed(self, key: SlotKey, trial: int) -> None:
        """``trial`` was handed to the slot ``key``."""
        slot = self.slots[key]
        slot.busy, slot.trial = True, trial
        self.running[trial] = key
        if trial not in self.relaunch:
            self.ran.append(trial)

    def went_idle(self, key: SlotKey) -> SlotState | None:
        """The slot ``key`` ended its command (None: a slot already dropped)."""
        slot = self.slots.get(key)
        if slot is None:
            return None
        slot.busy = False
        if slot.trial is not None:
            self.running.pop(slot.trial, None)
            slot.trial = None
        return slot
