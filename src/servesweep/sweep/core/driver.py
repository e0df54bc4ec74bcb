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

Its pieces: what it is given (``seams``: an executor of slots, a source of trials), the
pure rules it follows (``scheduler``: where trials go; ``rules``: when to stop, retry,
skip), the gates at placement (``memory_gate``, ``predict_gate``: not launched as
predicted not to fit, or worse than the best), its bookkeeping (``run_state``), its
machines (``machines``) and what follows a trial's end (``trial_ends``).
"""

from __future__ import annotations

import contextlib
import queue
import time
from dataclasses import replace
from pathlib import Path

from servesweep.decide.confirm import Done
from servesweep.decide.screening import ScreenPolicy
from servesweep.errors import Interrupted, ServesweepError
from servesweep.models import Evidence, Outcome, Phase
from servesweep.spec.screening import screening_plan
from servesweep.spec.slots import GpuNeed, gpu_need, params_label, slot_port
from servesweep.store import Store, SweepRecord, TrialRecord
from servesweep.sweep.core.confirm_run import ConfirmRun
from servesweep.sweep.core.health_notes import HealthNotes
from servesweep.sweep.core.machines import Machines
from servesweep.sweep.core.memory_gate import MemoryGate
from servesweep.sweep.core.predict_gate import PredictGate
from servesweep.sweep.core.rules import max_slots, skipped_too_often
from servesweep.sweep.core.run_state import RunSettings, RunState, SlotKey, SlotState
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
from servesweep.sweep.core.seams import Executor, SlotHandle, TrialSource
from servesweep.sweep.core.store_writer import StoreWriter
from servesweep.sweep.core.trial_ends import TrialEnds
from servesweep.sweep.events import (
    Event,
    LeftoverAdopted,
    LevelMeasured,
    NodeLost,
    Observer,
    PhaseEntered,
    SlotIdle,
    SweepStarted,
    SweepWarning,
    TelemetrySampled,
    TrialFinished,
)
from servesweep.sweep.slots.data import CurrentInstance, Placement, SweepContext, TrialOrder
from servesweep.sweep.slots.instance import stop_timeout

__all__ = ["Driver"]

_POLL_S = 0.25
_CLOSE_TIMEOUT_S = 60.0


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
        self.state = RunState()
        self.health = HealthNotes(self.spec.include_unreliable)
        self._closing: list[SlotHandle] = []
        """Slots torn down whose threads may still be finishing."""
        self.machines = Machines(self.spec, executor, max_slots(self.spec, settings.max_slots))
        self.source: TrialSource  # set by run
        self._trials: dict[int, TrialRecord] = {}
        self._sched: Scheduler | None = None
        self.memory = MemoryGate.of_sweep(self.spec, store, sweep.id, settings.predict)
        self.perf = PredictGate(self.spec, store, sweep, enabled=settings.predict)
        ends = (self.state, self.machines, self.memory, self.need, settings, self.perf)
        self.ends = TrialEnds(store, self.writer, *ends)
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
                slots=self.machines.slots,
                at_most=not source.planned,
            )
        )
        # slots that share CPU cores; which earlier sweeps start the prediction warm
        for line in [*self.executor.warnings(), *self.perf.notes]:
            self.writer.note(SweepWarning(message=line))
        try:
            if todo_count or not source.exhausted():
                self._queue_more()
                if self.state.jobs:
                    self._prepare_nodes()
                    self._loop()
            self._launch_open()
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

    def _prepare_nodes(self) -> None:
        wanted = [(job.trial, self._trials[job.trial].params) for job in self.state.jobs]
        self.machines.prepare(self.store, self.sweep, wanted, self._drain)
        for key, left, placement in self.machines.adopted():
            handle = self.executor.open(
                placement,
                current=CurrentInstance(left.trial, left.instance),
                baseline=self.machines.baseline(key, placement.gpus),
            )
            self.writer.note(LeftoverAdopted(instance_of=left.trial, node=placement.node))
            self.state.slots[placement.key] = SlotState(
                handle, busy=False, sched_gpus=placement.gpus or (0,)
            )
            # the scheduler gives an idle slot of the right size the next trial of that
            # size: put the adopting trial first
            assert left.adopt_for is not None
            self.state.first(left.adopt_for)

    # -- the queue ----------------------------------------------------------------------

    def _queue_more(self) -> None:
        # a search proposes only for free slots (it learns from each result); the gates
        # decide at placement (_carry_out): a skip frees room for the next proposal
        capacity = self.machines.slots * max(1, len(self.machines.nodes))
        room = capacity - len(self.state.running) - len(self.state.jobs)
        if room > 0 and not self.state.stopping:
            for trial in self.source.take(room):
                self._queue(trial)

    def _queue(self, trial: TrialRecord) -> None:  # the gates decide when it is placed
        self._trials[trial.id] = trial
        need = replace(self.need, pool=2**31).of(trial.params)  # checked against machines
        capacity = self.machines.largest() or 1
        if need > capacity:
            # skipped with the reason, as a predicted OOM is: the rest of the sweep runs
            message = (
                f"{params_label(trial.params)} needs {need} GPUs; no machine offers more "
                f"than {capacity}: not launched"
            )
            ev = Evidence(message=message, reason="too_few_gpus")
            self.writer.note(TrialFinished(trial=trial.id, outcome=Outcome.SKIPPED, evidence=ev))
            return
        self.state.jobs.append(Job(trial.id, need))

    def _scheduler(self) -> Scheduler:
        if self._sched is None:
            pools = []
            for info in self.machines.alive():
                table = self.executor.links(info) if len(info.gpus) > 1 else None
                link = distances(table) if table else None
                pools.append(NodePool(info.key, info.gpus or (0,), self.machines.slots, link=link))
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
            busy = state.busy
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
        job = state.take_job(decision.trial)
        if job.trial not in state.relaunch and self._skipped(job.trial):
            return False  # a relaunch ran before: it fits
        if isinstance(decision, Open):
            # a sweep without a GPU pool schedules on one token "GPU" per machine
            gpus = decision.gpus if self.spec.server.gpus else ()
            info = self.machines.nodes[decision.node]
            placement = Placement(
                info.name, decision.slot, gpus, slot_port(self.spec, decision.slot), info.node_id
            )
            handle = self.executor.open(
                placement,
                current=None,
                baseline=self.machines.baseline(decision.node, gpus),
            )
            state.slots[placement.key] = SlotState(handle, sched_gpus=decision.gpus)
            key = placement.key
        else:
            assert isinstance(decision, Assign)
            key = (decision.node, decision.slot)
        state.handed(key, decision.trial)
        state.slots[key].handle.run(self._order(decision.trial))
        return True

    def _skipped(self, trial_id: int) -> bool:
        """The memory and performance gates' decision for a trial about to be placed,
        with what the trials measured so far give now (a grid queues its plan at the
        start): True when it is finished ``skipped`` (predicted_oom, predicted_worse)
        instead. A search that keeps proposing what it skips stops (``rules``)."""
        trial = self._trials.get(trial_id) or self.store.trial(trial_id)
        end = self.memory.check(trial) or self.perf.check(trial)
        if end is None:
            self.state.skips_in_row = 0
            return False
        self.writer.note(end)
        self.state.skips_in_row += 1
        message = None if self.source.planned else skipped_too_often(self.state.skips_in_row)
        if message is not None and not self.state.stopping:
            self.state.stopping = True
            self.writer.note(SweepWarning(message=message))
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

    def _screen_policy(self) -> ScreenPolicy | None:  # None: no screening pass
        plan = self.screening
        return None if plan is None else screen_policy(self.store, self.sweep.id, self.spec, plan)

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
        self._memory_seen(event)
        self.writer.apply(event)
        if isinstance(event, LevelMeasured):
            line = self.health.note(event.trial, event.result)
            if line is not None:
                self.writer.note(SweepWarning(trial=event.trial, message=line))

    def _memory_seen(self, event: Event) -> None:
        """A trial's server start and its slot's GPU samples go to the memory gate
        (before its end calibrates the predictor): what the server held on its GPUs
        above the machine's baseline."""
        if isinstance(event, PhaseEntered) and event.phase is Phase.START:
            self.memory.started(event.trial, event.at)
        elif isinstance(event, TelemetrySampled):
            key = self.state.running.get(event.trial)
            slot = self.state.slots.get(key) if key is not None else None
            if key is not None and slot is not None:
                baseline = self.machines.baseline(key[0], slot.handle.placement.gpus)
                self.memory.saw(event.trial, event.points, baseline)

    def _node_lost(self, event: NodeLost) -> None:
        """No more work for the lost slot, nor for its node when the node is gone."""
        state = self.state
        node = event.node_id or event.node
        state.lost_slots.add((node, event.slot))
        if not event.dead or node in self.machines.dead:
            return
        self.machines.dead.add(node)
        self._scheduler().pools.pop(node, None)
        for key, slot in list(state.slots.items()):
            if key[0] == node and not slot.busy:
                self._drop(key)
        self.writer.note(
            SweepWarning(message=f"node {event.node} is lost: no more trials go there")
        )

    def _slot_idle(self, event: SlotIdle) -> None:
        key = (event.node_id or event.node, event.slot)
        slot = self.state.went_idle(key)
        if slot is None:
            return
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

    def _drop(self, key: SlotKey) -> None:
        """Close a slot that has no more work; its thread ends on its own (closing a
        probe, a telemetry thread): never hold up the other slots for it."""
        slot = self.state.slots.pop(key)
        slot.handle.close(timeout=0.0)
        self._closing.append(slot.handle)

    def _finished(self, event: TrialFinished) -> None:
        self.ends.finished(event, self.source)

    def _launch_open(self) -> None:
        """Launch the skipped trials that could still win (``PredictGate.still_open``)."""
        while not self.state.stopping and (again := self.perf.still_open()):
            for trial in map(self.perf.reopen, again):
                self._trials[trial.id] = trial
                self.state.jobs.append(Job(trial.id, self.need.of(trial.params)))
            if not self.machines.prepared:
                self._prepare_nodes()
            self._loop()

    # -- the confirm phase --------------------------------------------------------------

    def _confirm(self) -> None:
        """Relaunch the tied leaders round by round until they separate or the budget
        is spent (``decide.confirm`` decides; each step is stored, so a rerun goes on)."""
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
            if not self.machines.prepared:
                self._prepare_nodes()
            self._loop()
            self.state.relaunch.clear()
            if self.state.stopping:
                return
            phase.round_done(step, time.monotonic() - started)

    # -- the end ------------------------------------------------------------------------

    def _finish_slots(self) -> None:
        for key, slot in self.state.slots.items():
            slot.busy = True
            slot.handle.finish(self.settings.keep_running, self.machines.restart_units(key[0]))
        deadline = time.monotonic() + stop_timeout(self.spec.server)
        while self.state.busy:
            if time.monotonic() > deadline:
                raise ServesweepError("slots did not finish stopping their instances in time")
            self._wait_event()
        for slot in self.state.slots.values():
            slot.handle.close()
        for handle in self._closing:
            handle.close()
        self.state.slots.clear()

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
                slot.handle.restore(self.machines.restart_units(key[0]))
            except ServesweepError as exc:
                self.observer.event(SweepWarning(message=f"giving the unit back: {exc}"))
        self.writer.mark_interrupted(list(state.ran))
        state.slots.clear()
        return running
