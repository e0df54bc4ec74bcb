"""The driver of one sweep run: it owns the results database and the queue of trials,
hands trials to slots and applies what they report.

One run, in order:

1. every machine is made ready (``sweep.slots.node``): leftovers of earlier runs of this
   database adopted or stopped, the GPU baseline taken or reused;
2. the trials to run are queued (the plan's order; a search proposes them one by one)
   and the :class:`~servesweep.sweep.core.scheduler.Scheduler` packs them onto slots —
   disjoint GPU sets, one port each — opening, reusing and tearing down slots;
3. each slot (a thread here, a Ray actor on a cluster node) runs its trial and sends
   typed events back; the driver's thread alone writes them to the store
   (``StoreWriter``) and passes them to the observers;
4. at the end every slot stops its last instance (unless ``--keep-running``) and
   gives a systemd unit back as it was.

Ctrl-C (``Interrupted``) and internal errors stop every running instance, mark the
trials in flight ``interrupted`` and give units back before the exception goes on:
the next run continues where this one stopped.

A lost machine (``NodeLost``, reported by a cluster's slots) gets no more work: its
slots are dropped and, when the node itself is gone, so is its GPU pool. A trial that
ended ``node_lost`` is run once more (on another node when its own is gone); a
second loss is its final outcome.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from servesweep.errors import ConfigError, Interrupted, ServesweepError
from servesweep.models import FailureClass, InstanceRecord, LevelResult, Outcome
from servesweep.report.screening import ScreenPolicy
from servesweep.search.prune import PrunePolicy
from servesweep.spec.schema import SweepSpec
from servesweep.spec.screening import screening_plan
from servesweep.spec.slots import GpuNeed, gpu_need, params_label, slot_port
from servesweep.store import Store, SweepRecord, TrialRecord
from servesweep.sweep.core.confirm import Done
from servesweep.sweep.core.confirm_run import ConfirmRun
from servesweep.sweep.core.health_notes import HealthNotes
from servesweep.sweep.core.memory_gate import MemoryGate
from servesweep.sweep.core.scheduler import (
    Assign,
    Decision,
    Job,
    NodePool,
    Open,
    Scheduler,
    SlotView,
    Teardown,
    distances,
)
from servesweep.sweep.core.screen_run import screen_policy
from servesweep.sweep.core.store_writer import StoreWriter
from servesweep.sweep.events import (
    ConfirmStep,
    Event,
    LeftoverAdopted,
    LevelMeasured,
    NodeLost,
    Observer,
    SlotIdle,
    SweepStarted,
    SweepWarning,
    TrialFinished,
)
from servesweep.sweep.slots.data import (
    CurrentInstance,
    NodeInfo,
    Placement,
    SweepContext,
    TrialOrder,
)
from servesweep.sweep.slots.instance import stop_timeout
from servesweep.sweep.slots.node import Leftover, NodePrepared, leftover_of

__all__ = ["Driver", "SlotHandle", "TrialSource", "max_slots"]

_POLL_S = 0.25
_CLOSE_TIMEOUT_S = 60.0
MAX_SKIPS_IN_ROW = 1000
"""A search that proposes this many configurations predicted not to fit in a row stops."""
NODE_LOST_RETRIES = 1
"""How many times a trial whose node was lost is run again."""


class SlotHandle(Protocol):
    """A slot as the driver drives it; every command ends with a ``SlotIdle`` event."""

    placement: Placement
    error: BaseException | None

    def run(self, order: TrialOrder) -> None: ...
    def teardown(self) -> None: ...
    def finish(self, keep_running: bool, restart_units: Sequence[str] = ()) -> None: ...
    def interrupt(self) -> None: ...
    def restore(self, restart_units: Sequence[str] = ()) -> None: ...
    def close(self, timeout: float = ...) -> bool: ...


class Executor(Protocol):
    """Where slots run: this machine (``sweep.executors.local``) or a Ray cluster
    (``sweep.executors.ray.executor``); built for a run by its site
    (``sweep.executors.site``). The driver never knows which."""

    def nodes(self) -> list[NodeInfo]: ...

    def check(self) -> None:
        """Before the run, when it has trials to run: ConfigError for what would fail
        every one of them (a program on a slot's port)."""
        ...

    def warnings(self) -> list[str]:
        """What to tell the user as the run starts (slots that share CPU cores)."""
        ...

    def links(self, node: NodeInfo) -> dict[tuple[int, int], int] | None: ...

    def context_for(self, node: NodeInfo) -> SweepContext:
        """The sweep as ``node`` sees it (its address, its fake GPUs): launches there,
        and so their fingerprints, follow it."""
        ...

    def prepare(
        self,
        node: NodeInfo,
        pool: Placement,
        leftovers: Sequence[Leftover],
        stored: Mapping[int, int] | None,
        service_slots: Sequence[int],
    ) -> NodePrepared:
        """Make ``node`` ready: its slots' ports checked, leftovers adopted or stopped,
        the GPU baseline taken (see ``sweep.slots.node``)."""
        ...

    def open(
        self,
        placement: Placement,
        *,
        current: CurrentInstance | None,
        baseline: Mapping[int, int],
    ) -> SlotHandle: ...

    def close(self) -> None: ...


class TrialSource(Protocol):
    """What to run: a search's proposals (``sweep.core.search_source``: the grid is one)."""

    planned: bool
    """Every trial it gives is known before the first take (a grid's plan of pending
    trials): the count of trials to run is exact, not at most."""

    def take(self, room: int) -> list[TrialRecord]:
        """Up to ``room`` more trials to queue now ([] when there is nothing more yet)."""
        ...

    def tell(self, trial: TrialRecord, results: Sequence[LevelResult]) -> None: ...

    def exhausted(self) -> bool: ...

    def prune_policy(self) -> PrunePolicy | None:
        """What a slot needs to stop a trial early that can no longer win (None: never)."""
        ...


@dataclass
class _SlotState:
    """What the driver knows of one open slot (the slot itself runs elsewhere)."""

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


@dataclass(frozen=True)
class RunSettings:
    keep_running: bool = False
    fail_fast: bool = False
    max_slots: int | None = None
    """``--slots``: at most this many slots per machine (None: the sweep file's
    ``parallel``, else as many as fit)."""
    predict: bool = True
    """Predict each configuration's memory (``run --no-predict``: False)."""


@dataclass
class _State:
    jobs: list[Job] = field(default_factory=list)
    slots: dict[tuple[str, int], _SlotState] = field(default_factory=dict)
    running: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Trials handed to a slot whose slot has not gone idle since, by trial id: the
    slot's key. Marked ``interrupted`` when the run aborts."""
    stopping: bool = False
    """No trial is queued or handed to a slot any more (``--fail-fast``, repeated
    environment failures, an abort): the trials in flight finish, the queued ones stay
    pending for the next run."""
    ran: list[int] = field(default_factory=list)
    """The trials this run started (not the confirm phase's relaunches), in order:
    what ``run`` returns; an abort marks the unfinished ones ``interrupted``."""
    dead_nodes: set[str] = field(default_factory=set)
    lost_slots: set[tuple[str, int]] = field(default_factory=set)
    """Slots whose process is gone: dropped once their command ends."""
    retried: dict[int, int] = field(default_factory=dict)
    """Trials run again after a lost node, and how often."""
    relaunch: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Trials queued by the confirm phase, and the launch numbers to measure."""
    last_environment: tuple[int, EnvironmentFailure | None] | None = None
    """The trial that finished last, and its environment failure (see
    ``environment_failure``)."""


class Driver:
    """One run of one sweep (see the module doc)."""

    def __init__(
        self,
        context: SweepContext,
        store: Store,
        sweep: SweepRecord,
        executor: Executor,
        events: queue.Queue[Event],
        observer: Observer,
        settings: RunSettings,
    ) -> None:
        self.context = context
        self.spec = context.spec
        self.store = store
        self.sweep = sweep
        self.executor = executor
        self.events = events
        self.observer = observer
        self.settings = settings
        self.need: GpuNeed = gpu_need(self.spec)
        self.writer = StoreWriter(store, sweep.id, observer, on_finished=self._finished)
        self.state = _State()
        self.health = HealthNotes(self.spec.include_unreliable)
        self._closing: list[SlotHandle] = []
        """Slots torn down whose threads may still be finishing."""
        self.prepared: dict[str, NodePrepared] = {}
        self.baselines: dict[str, dict[int, int]] = {}
        self.source: TrialSource  # set by run
        self._trials: dict[int, TrialRecord] = {}
        self.nodes: dict[str, NodeInfo] = {n.key: n for n in executor.nodes()}
        """The machines of this run, by key (see ``NodeInfo.key``)."""
        self.memory = MemoryGate(self.spec, enabled=settings.predict)
        self.screening = screening_plan(self.spec)

    # -- the run ------------------------------------------------------------------------

    def run(self, source: TrialSource, todo_count: int, total: int, done: int) -> list[int]:
        """Run until ``source`` is exhausted and every trial is final; returns the ids
        of the trials this run started."""
        self.source = source
        self.observer.event(
            SweepStarted(
                sweep=self.sweep.id,
                name=self.spec.name,
                store=self.context.store_path,
                trials=total,
                todo=todo_count,
                done=done,
                slots=self._max_slots(),
                at_most=not source.planned,
            )
        )
        self._say_executor_warnings()
        try:
            if todo_count or not source.exhausted():
                self._queue_more()
                if self.state.jobs:
                    self._prepare_nodes()
                    self._loop()
            self._confirm()
            self._finish_slots()
        except (KeyboardInterrupt, Interrupted):
            stopped = self._abort()
            raise Interrupted(
                "interrupted; "
                + ("the running instances were stopped; " if stopped else "")
                + "run the same command again to continue (what was measured is kept)"
            ) from None
        except BaseException:
            # a bug or an unusable environment ends the sweep: no server left behind and
            # no trial left "running" (the next run continues where this one stopped)
            self._abort()
            raise
        finally:
            self.executor.close()
        return list(self.state.ran)

    # -- machines -----------------------------------------------------------------------

    def _max_slots(self) -> int:
        return max_slots(self.spec, self.settings.max_slots)

    def _prepare_nodes(self) -> None:
        live = [t for t in self.store.live_instances() if t.instance is not None]
        for key, info in self.nodes.items():
            pool = Placement(info.name, 0, info.gpus, slot_port(self.spec, 0), info.node_id)
            mine = [t for t in live if t.instance is not None and _runs_on(info, t.instance)]
            leftovers = [self._leftover(t, info) for t in mine]
            stored = _stored_baseline(self.sweep, key)
            prepared = self.executor.prepare(
                info, pool, leftovers, stored, range(self._max_slots())
            )
            self._drain()
            self.prepared[key] = prepared
            self.baselines[key] = dict(prepared.baseline)
        environment = dict(self.store.sweep(self.sweep.id).environment)
        environment["baseline_bytes"] = {
            node: {str(g): v for g, v in values.items()} for node, values in self.baselines.items()
        }
        self.store.set_environment(self.sweep.id, environment)
        self._open_adopted()

    def _leftover(self, trial: TrialRecord, node: NodeInfo) -> Leftover:
        """A recorded live instance; kept for adoption when a queued trial would run
        exactly its launch on exactly its slot (``node.leftover_of``)."""
        assert trial.instance is not None
        pool = tuple(self.spec.server.gpus)
        slots = [
            Placement(node.name, k, pool, slot_port(self.spec, k), node.node_id)
            for k in range(self._max_slots())
        ]
        wanted = ((job.trial, self._trials[job.trial].params) for job in self.state.jobs)
        context = self.executor.context_for(node)
        label = params_label(trial.params)
        return leftover_of(context, trial.id, trial.instance, slots, wanted, label)

    def _slot_of_port(self, port: int | None) -> int | None:
        if port is None:
            return None
        for k in range(self._max_slots()):
            if slot_port(self.spec, k) == port:
                return k
        return None

    def _open_adopted(self) -> None:
        for key, prepared in self.prepared.items():
            info = self.nodes[key]
            for left in prepared.adopted:
                assert left.adopt_for is not None
                instance = left.instance
                slot = self._slot_of_port(instance.port)
                assert slot is not None
                placement = Placement(
                    info.name, slot, tuple(instance.gpus), instance.port or 0, info.node_id
                )
                handle = self.executor.open(
                    placement,
                    current=CurrentInstance(left.trial, instance),
                    baseline=self._baseline(key, placement.gpus),
                )
                self.writer.note(LeftoverAdopted(instance_of=left.trial, node=info.name))
                self.state.slots[placement.key] = _SlotState(
                    handle, busy=False, sched_gpus=placement.gpus or (0,)
                )
                # the scheduler gives an idle slot of the right size the next trial of
                # that size: put the adopting trial first
                job = next(j for j in self.state.jobs if j.trial == left.adopt_for)
                self.state.jobs.remove(job)
                self.state.jobs.insert(0, job)

    def _baseline(self, node: str, gpus: Sequence[int]) -> dict[int, int]:
        values = self.baselines.get(node, {})
        return {g: values[g] for g in gpus if g in values}

    def _say_executor_warnings(self) -> None:
        """What the executor says as the run starts (slots that share CPU cores)."""
        for line in self.executor.warnings():
            self.writer.note(SweepWarning(message=line))

    # -- the queue ----------------------------------------------------------------------

    def _queue_more(self) -> None:
        # a search proposes only for slots that are free (it learns from each result)
        capacity = self._max_slots() * max(1, len(self.nodes))
        room = capacity - len(self.state.running) - len(self.state.jobs)
        skips = 0
        while room > 0 and not self.state.stopping:
            skipped = [t for t in self.source.take(room) if not self._queue(t)]
            room = len(skipped)  # a search proposes again for each one not launched
            skips += room
            if skips >= MAX_SKIPS_IN_ROW:
                self.state.stopping = True
                self.writer.note(
                    SweepWarning(
                        message=f"the search proposed {skips} configurations in a row that are "
                        "predicted not to fit; it stops (see servesweep plan, or run "
                        "--no-predict)"
                    )
                )

    def _queue(self, trial: TrialRecord) -> bool:
        """Queue one trial, or finish it ``skipped`` (predicted_oom): False."""
        self._trials[trial.id] = trial
        end = self.memory.check(trial)
        if end is not None:
            self.writer.note(end)
            return False
        need = self.need.of(trial.params)
        capacity = max((len(n.gpus) for n in self._alive_nodes()), default=0) or 1
        if need > capacity:
            raise ConfigError(
                f"trial {trial.number} ({params_label(trial.params)}) needs {need} GPUs; no "
                f"machine offers more than {capacity}",
                key="server.gpus_per_trial",
            )
        self.state.jobs.append(Job(trial.id, need))
        return True

    def _alive_nodes(self) -> list[NodeInfo]:
        return [n for key, n in self.nodes.items() if key not in self.state.dead_nodes]

    def _scheduler(self) -> Scheduler:
        if not hasattr(self, "_sched"):
            pools = []
            for info in self._alive_nodes():
                key = info.key
                table = self.executor.links(info) if len(info.gpus) > 1 else None
                link = distances(table) if table else None
                pools.append(NodePool(key, info.gpus or (0,), self._max_slots(), link=link))
            self._sched = Scheduler(pools)
        return self._sched

    def _views(self) -> list[SlotView]:
        return [
            SlotView(key[0], key[1], s.sched_gpus or s.handle.placement.gpus, s.busy)
            for key, s in self.state.slots.items()
        ]

    def _loop(self) -> None:
        state = self.state
        while True:
            if not state.stopping:
                self._queue_more()
                decisions = self._scheduler().decide(state.jobs, self._views())
                if not all([self._carry_out(d) for d in decisions]):
                    continue  # a trial skipped at its start: queue and place again
            busy = any(s.busy for s in state.slots.values())
            if not busy and (state.stopping or not state.jobs):
                return
            if not busy and state.jobs:
                waiting = ", ".join(str(j.trial) for j in state.jobs)
                raise ServesweepError(
                    f"trials {waiting} cannot be placed on any machine (GPUs or slots); "
                    "check server.gpus, server.gpus_per_trial and --slots"
                )
            self._wait_event()

    def _carry_out(self, decision: Decision) -> bool:
        """Carry out one decision; False when its trial was skipped instead (predicted
        not to fit, with the predictor as the trials before it calibrated it)."""
        state = self.state
        if isinstance(decision, Teardown):
            slot = state.slots[(decision.node, decision.slot)]
            slot.busy = slot.tearing = True
            slot.handle.teardown()
            return True
        job = next(j for j in state.jobs if j.trial == decision.trial)
        state.jobs.remove(job)
        end = None
        if job.trial not in state.relaunch:  # a relaunch ran before: it fits
            end = self.memory.check(self._trials.get(job.trial) or self.store.trial(job.trial))
        if end is not None:
            self.writer.note(end)
            return False
        if isinstance(decision, Open):
            # a sweep without a GPU pool schedules on one token "GPU" per machine
            gpus = decision.gpus if self.spec.server.gpus else ()
            info = self.nodes[decision.node]
            placement = Placement(
                info.name, decision.slot, gpus, slot_port(self.spec, decision.slot), info.node_id
            )
            handle = self.executor.open(
                placement,
                current=None,
                baseline=self._baseline(decision.node, gpus),
            )
            state.slots[placement.key] = _SlotState(handle, sched_gpus=decision.gpus)
            key = placement.key
        else:
            assert isinstance(decision, Assign)
            key = (decision.node, decision.slot)
        slot = state.slots[key]
        slot.busy, slot.trial = True, decision.trial
        state.running[decision.trial] = key
        if decision.trial not in state.relaunch:
            state.ran.append(decision.trial)
        slot.handle.run(self._order(decision.trial))
        return True

    def _order(self, trial_id: int) -> TrialOrder:
        trial = self.store.trial(trial_id)
        attempt = trial.attempts + 1
        log = Path(self.context.log_root) / f"trial-{trial.id}-attempt-{attempt}" / "server.log"
        return TrialOrder(
            trial=trial.id,
            seq=trial.seq,
            attempt=attempt,
            fingerprint=trial.fingerprint,
            params=dict(trial.params),
            log_path=str(log),
            prune=None if trial.id in self.state.relaunch else self.source.prune_policy(),
            number=trial.number,
            relaunch=self.state.relaunch.get(trial.id, ()),
            screen=None if trial.id in self.state.relaunch else self._screen_policy(),
        )

    def _screen_policy(self) -> ScreenPolicy | None:
        """The screening snapshot for the next trial (None: no screening pass)."""
        if self.screening is None:
            return None
        return screen_policy(self.store, self.sweep.id, self.spec, self.screening)

    def _wait_event(self) -> None:
        try:
            event = self.events.get(timeout=_POLL_S)
        except queue.Empty:
            return
        self._handle(event)
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            self._handle(event)

    def _handle(self, event: Event) -> None:
        if isinstance(event, SlotIdle):
            self._slot_idle(event)
            return
        if isinstance(event, NodeLost):
            self._node_lost(event)
        self.writer.apply(event)
        if isinstance(event, LevelMeasured):
            line = self.health.note(event.trial, event.result)
            if line is not None:
                self.writer.note(SweepWarning(trial=event.trial, message=line))

    def _node_lost(self, event: NodeLost) -> None:
        """No more work for the lost slot, nor for its node when the node is gone."""
        state = self.state
        node = event.node_id or event.node
        state.lost_slots.add((node, event.slot))
        if not event.dead or node in state.dead_nodes:
            return
        state.dead_nodes.add(node)
        self._scheduler().pools.pop(node, None)
        for key, slot in list(state.slots.items()):
            if key[0] == node and not slot.busy:
                self._drop(key)
        self.writer.note(
            SweepWarning(message=f"node {event.node} is lost: no more trials go there")
        )

    def _slot_idle(self, event: SlotIdle) -> None:
        key = (event.node_id or event.node, event.slot)
        slot = self.state.slots.get(key)
        if slot is None:
            return
        slot.busy = False
        if slot.trial is not None:
            self.state.running.pop(slot.trial, None)
            slot.trial = None
        if key in self.state.lost_slots:
            self.state.lost_slots.discard(key)
            self._drop(key)
            return
        if event.error is not None:
            error = slot.handle.error
            if isinstance(error, BaseException):
                raise error
            raise ServesweepError(f"slot {event.slot} on {event.node} failed: {event.error}")
        if slot.tearing:
            self._drop(key)

    def _drop(self, key: tuple[str, int]) -> None:
        """Close a slot that has no more work; its thread ends on its own (closing a
        probe, a telemetry thread): never hold up the other slots for it."""
        slot = self.state.slots.pop(key)
        slot.handle.close(timeout=0.0)
        self._closing.append(slot.handle)

    def _finished(self, event: TrialFinished) -> None:
        if event.relaunch:
            self._relaunched(event)
            return
        trial = self.store.trial(event.trial)
        checked = self.memory.learn(trial)
        if checked is not None:
            self.writer.note(checked)
        while self.memory.notes:
            self.writer.note(SweepWarning(message=self.memory.notes.pop(0)))
        if self._retry_lost(trial):
            return
        if trial.outcome is Outcome.FAILED and self.settings.fail_fast:
            self.state.stopping = True
            self.writer.note(
                SweepWarning(message=f"--fail-fast: stopping after trial {trial.number}")
            )
        self._stop_on_repeated_environment(trial)
        self.source.tell(trial, self.store.results(trial.id, with_samples=False))

    def _stop_on_repeated_environment(self, trial: TrialRecord) -> None:
        """The same environment failure (class and holder) on two trials in a row: the
        machine, not the configurations, is at fault; every further trial would fail
        alike. Stop the sweep (the trials not run stay pending) with one line."""
        state = self.state
        failure = environment_failure(trial)
        last = state.last_environment
        state.last_environment = (trial.number, failure)
        if failure is None or last is None or last[1] != failure or state.stopping:
            return
        state.stopping = True
        self.writer.note(
            SweepWarning(
                message=f"trials {last[0]} and {trial.number} both failed {failure.describe()}: "
                "stopping the sweep (the trials not run stay pending); free it and run the "
                "sweep again"
            )
        )

    def _retry_lost(self, trial: TrialRecord) -> bool:
        """Queue a trial whose node was lost once more (first in line); its failed
        attempt stays in the events (``node_lost``) and the attempt count."""
        state = self.state
        if trial.failure_class is not FailureClass.NODE_LOST or state.stopping:
            return False
        if state.retried.get(trial.id, 0) >= NODE_LOST_RETRIES:
            return False
        need = self.need.of(trial.params)
        largest = max((len(n.gpus) for n in self._alive_nodes()), default=0)
        if need > largest:
            self.writer.note(
                SweepWarning(
                    trial=trial.id,
                    message=f"trial {trial.number} is not run again: it needs {need} GPUs and no "
                    f"machine left has that many (largest: {largest})",
                )
            )
            return False
        state.retried[trial.id] = state.retried.get(trial.id, 0) + 1
        self.store.reset_trial(trial.id)
        state.jobs.insert(0, Job(trial.id, need))
        lost = "node" if trial.evidence is None or trial.evidence.reason == "node_died" else "slot"
        self.writer.note(
            SweepWarning(
                trial=trial.id,
                message=f"trial {trial.number} lost its {lost} on {trial.node}: running it again",
            )
        )
        return True

    # -- the confirm phase --------------------------------------------------------------

    def _confirm(self) -> None:
        """Relaunch the tied leaders round by round until they separate or the budget
        is spent (``sweep.core.confirm`` decides; each step is stored, so a rerun goes on)."""
        spec = self.spec.confirm_phase
        if spec is None or self.state.stopping:
            return
        phase = ConfirmRun(self.store, self.sweep.id, spec, self.writer.note)
        if self.state.ran:
            phase.reset()
        while not self.state.stopping:
            step = phase.next()
            if isinstance(step, Done):
                if not phase.done_before(step):
                    phase.finish(step)
                return
            phase.begin(step)
            started = time.monotonic()
            for trial_id, more in step.more.items():
                have = phase.launches.get(trial_id, 0)
                self.state.relaunch[trial_id] = tuple(range(have, have + more))
                trial = self.store.trial(trial_id)
                self._trials[trial_id] = trial
                self.state.jobs.append(Job(trial_id, self.need.of(trial.params)))
            if not self.prepared:
                self._prepare_nodes()
            self._loop()
            self.state.relaunch.clear()
            if self.state.stopping:
                return
            phase.round_done(step, time.monotonic() - started)

    def _relaunched(self, event: TrialFinished) -> None:
        """A confirm relaunch ended; a failed one takes its trial out of the phase."""
        if event.outcome is Outcome.OK:
            return
        trial = self.store.trial(event.trial)
        why = event.failure_class.value if event.failure_class else event.outcome.value
        if event.evidence is not None:
            why += f": {event.evidence.summary()}"
        self.writer.note(ConfirmStep(trial=trial.id, step="dropped", message=why))
        self.writer.note(
            SweepWarning(
                trial=trial.id,
                message=f"trial {trial.number}: a confirm relaunch failed ({why}); it is not "
                "relaunched again (what it measured before stays)",
            )
        )

    # -- the end ------------------------------------------------------------------------

    def _restart_units(self, node: str) -> tuple[str, ...]:
        prepared = self.prepared.get(node)
        return prepared.restart_services if prepared else ()

    def _finish_slots(self) -> None:
        for key, slot in self.state.slots.items():
            slot.busy = True
            slot.handle.finish(self.settings.keep_running, self._restart_units(key[0]))
        deadline = time.monotonic() + self._finish_timeout()
        while any(s.busy for s in self.state.slots.values()):
            if time.monotonic() > deadline:
                raise ServesweepError("slots did not finish stopping their instances in time")
            self._wait_event()
        for slot in self.state.slots.values():
            slot.handle.close()
        for handle in self._closing:
            handle.close()
        self.state.slots.clear()

    def _finish_timeout(self) -> float:
        return stop_timeout(self.spec.server)

    def _abort(self) -> bool:
        """Stop everything now: instances stopped, trials in flight ``interrupted``.
        Whether there were instances to stop."""
        state = self.state
        state.stopping = True
        with contextlib.suppress(BaseException):
            self._drain()  # what slots reported before the stop is kept
        self.writer.mark_interrupted(list(state.running))
        running = bool(state.slots and self.store.live_instances(self.sweep.id))
        if running:
            # a refusal before any slot opened, or slots whose servers never started,
            # have nothing to stop
            self.observer.event(SweepWarning(message="stopping the running instances"))
        for slot in list(state.slots.values()):
            slot.handle.interrupt()
        for slot in list(state.slots.values()):
            slot.handle.close(timeout=_CLOSE_TIMEOUT_S)
        with contextlib.suppress(BaseException):
            self._drain()
        for key, slot in list(state.slots.items()):
            try:
                slot.handle.restore(self._restart_units(key[0]))
            except ServesweepError as exc:
                self.observer.event(SweepWarning(message=f"giving the unit back: {exc}"))
        self.writer.mark_interrupted(list(state.ran))
        state.slots.clear()
        return running


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


def _runs_on(node: NodeInfo, instance: InstanceRecord) -> bool:
    """Whether a recorded instance runs on ``node`` (records of older servesweeps name
    no machine: they ran here)."""
    if instance.node_id:
        return instance.node_id == node.node_id
    return instance.node in ("", node.name) and not node.node_id


def _stored_baseline(sweep: SweepRecord, node: str) -> dict[int, int] | None:
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
