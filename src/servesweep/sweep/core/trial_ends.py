"""What follows the end of each trial, in the driver's thread, as the store writer
writes it: the memory predictor calibrated by what the trial measured, the performance
prediction made at its placement verified (``PredictGate.learn``); a trial that
lost its node queued once more (``rules.lost_trial``); ``--fail-fast`` and the same
environment failure twice in a row (``rules.repeated_environment``) stop the sweep;
the search told. A confirm relaunch that failed is dropped from the confirm phase.
"""

from __future__ import annotations

from servesweep.models import FailureClass, Outcome
from servesweep.spec.slots import GpuNeed
from servesweep.store import Store, TrialRecord
from servesweep.sweep.core.machines import Machines
from servesweep.sweep.core.memory_gate import MemoryGate
from servesweep.sweep.core.predict_gate import PredictGate
from servesweep.sweep.core.rules import (
    NotAgain,
    RunAgain,
    environment_failure,
    lost_trial,
    repeated_environment,
)
from servesweep.sweep.core.run_state import RunSettings, RunState
from servesweep.sweep.core.scheduler import Job
from servesweep.sweep.core.seams import TrialSource
from servesweep.sweep.core.store_writer import StoreWriter
from servesweep.sweep.events import ConfirmStep, SweepWarning, TrialFinished

__all__ = ["TrialEnds"]


class TrialEnds:
    """What follows each trial's end (see the module doc); it changes the run's
    ``state`` (stopping, the queue) and notes what it decided through ``writer``."""

    def __init__(
        self,
        store: Store,
        writer: StoreWriter,
        state: RunState,
        machines: Machines,
        memory: MemoryGate,
        need: GpuNeed,
        settings: RunSettings,
        perf: PredictGate | None = None,
    ) -> None:
        self.store = store
        self.writer = writer
        self.state = state
        self.machines = machines
        self.memory = memory
        self.need = need
        self.settings = settings
        self.perf = perf
        """The performance gate: it verifies each launched trial's prediction."""

    def finished(self, event: TrialFinished, source: TrialSource) -> None:
        """What follows trial ``event.trial``'s end (see the module doc)."""
        if event.relaunch:
            self._relaunched(event)
            return
        trial = self.store.trial(event.trial)
        checked = self.memory.learn(trial)
        if checked is not None:
            self.writer.note(checked)
        verified = self.perf.learn(trial) if self.perf is not None else None
        if verified is not None:
            self.writer.note(verified)
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
        source.tell(trial, self.store.results(trial.id, with_samples=False))

    def _stop_on_repeated_environment(self, trial: TrialRecord) -> None:
        """Stop the sweep on the same environment failure twice in a row
        (``rules.repeated_environment``)."""
        state = self.state
        failure = environment_failure(trial)
        last, state.last_environment = state.last_environment, (trial.number, failure)
        message = repeated_environment(last, trial.number, failure)
        if message is not None and not state.stopping:
            state.stopping = True
            self.writer.note(SweepWarning(message=message))

    def _retry_lost(self, trial: TrialRecord) -> bool:
        """Queue a trial whose node was lost once more, first in line
        (``rules.lost_trial``); whether it was."""
        state = self.state
        if state.stopping or trial.failure_class is not FailureClass.NODE_LOST:
            return False  # (a skipped trial may need more GPUs than the pool has)
        need = self.need.of(trial.params)
        decision = lost_trial(trial, state.retried.get(trial.id, 0), need, self.machines.largest())
        if isinstance(decision, NotAgain):
            self.writer.note(SweepWarning(trial=trial.id, message=decision.message))
        if not isinstance(decision, RunAgain):
            return False
        state.retried[trial.id] = state.retried.get(trial.id, 0) + 1
        self.store.reset_trial(trial.id)
        state.jobs.insert(0, Job(trial.id, need))
        self.writer.note(SweepWarning(trial=trial.id, message=decision.message))
        return True

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
