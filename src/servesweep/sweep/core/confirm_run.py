"""The confirm phase as the driver runs it: what the store says (the rounds so far,
the launches stored, the tie set) turned into the inputs of
:func:`servesweep.decide.confirm.decide`, and each step written back as a
:class:`~servesweep.sweep.events.ConfirmStep` (committed, so a rerun continues)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from servesweep.decide.best import find_best
from servesweep.decide.confirm import Done, Relaunch, Round, cost, decide
from servesweep.decide.confirmed import steps_since_reset
from servesweep.errors import Interrupted, ServesweepError
from servesweep.spec.schema import ConfirmSpec
from servesweep.store import Store
from servesweep.sweep.events import ConfirmStep, Event

__all__ = ["ConfirmRun"]


class ConfirmRun:
    """One sweep's confirm phase, read from and written to its store."""

    def __init__(
        self,
        store: Store,
        sweep_id: int,
        spec: ConfirmSpec,
        note: Callable[[Event], None],
    ) -> None:
        self.store = store
        self.sweep_id = sweep_id
        self.spec = spec
        self.note = note
        self.launches: dict[int, int] = {}
        """Launches stored per candidate trial (the next launch's number)."""
        self.tied: list[int] = []
        self.equivalent: list[int] = []
        """Of ``tied``, those equivalent to the leader within the threshold."""
        self.threshold = 0.0

    def _steps(self) -> list[Mapping[str, Any]]:
        return steps_since_reset(self.store.events(self.sweep_id, "confirm"))

    def reset(self) -> None:
        """Trials ran since the stored rounds: they no longer count."""
        if self._steps():
            self.note(ConfirmStep(step="reset", message="trials ran since: confirming anew"))

    def next(self) -> Relaunch | Done:
        steps = self._steps()
        rounds: list[Round] = []
        dropped: set[int] = set()
        elapsed = 0.0
        for step in steps:
            if step["step"] == "round":
                targets = {int(k): int(v) for k, v in step.get("targets", {}).items()}
                relaunches = int(step.get("relaunches", 0))
                rounds.append(Round(int(step["round"]), targets, relaunches=relaunches))
            elif step["step"] == "round_done" and rounds:
                seconds = float(step.get("seconds", 0.0))
                rounds[-1] = dataclasses.replace(rounds[-1], done=True, seconds=seconds)
                elapsed += seconds
            elif step["step"] == "dropped" and step.get("trial") is not None:
                dropped.add(int(step["trial"]))
        try:
            self._standing()
        except Interrupted:
            raise  # Ctrl-C raises it wherever the run is: it stops the run, decides nothing
        except ServesweepError as exc:
            return Done(f"undecidable: {exc}")
        return decide(
            self.spec,
            self.tied,
            self.launches,
            rounds,
            dropped=frozenset(dropped),
            elapsed_s=elapsed,
            equivalent=frozenset(self.equivalent),
        )

    def _standing(self) -> None:
        data = self.store.load_sweep_data(self.sweep_id, with_samples=False)
        result = find_best(data)
        tied = {c.trial.id for c in result.ties}
        if result.winner is not None:
            tied.add(result.winner.trial.id)
        self.tied = [c.trial.id for c in result.ranking if c.trial.id in tied]
        self.equivalent = [c.trial.id for c in result.equivalent]
        self.threshold = result.rules.threshold
        self.launches = {
            t.id: max((r.launch for r in data.results.get(t.id, ())), default=-1) + 1
            for t in data.trials
        }

    def done_before(self, done: Done) -> bool:
        """Whether the stored phase already ended this way (nothing to write again)."""
        steps = self._steps()
        return (
            bool(steps) and steps[-1]["step"] == "done" and steps[-1].get("reason") == done.reason
        )

    def begin(self, step: Relaunch) -> None:
        if step.new:
            self.note(
                ConfirmStep(
                    step="round",
                    round=step.round,
                    targets={str(k): v for k, v in step.targets.items()},
                    tied=tuple(self.tied),
                    relaunches=cost(step),
                )
            )

    def round_done(self, step: Relaunch, seconds: float) -> None:
        self.note(ConfirmStep(step="round_done", round=step.round, seconds=seconds))

    def finish(self, done: Done) -> None:
        steps = self._steps()
        relaunches = sum(int(s.get("relaunches", 0)) for s in steps if s["step"] == "round")
        rounds = sum(1 for s in steps if s["step"] == "round")
        message = ""
        if done.reason == "equivalent" and self.tied:
            who = " and ".join(f"#{t}" for t in (self.tied[0], *self.equivalent))
            message = f"{who} equivalent within ±{self.threshold:.1%}".replace(".0%", "%")
        self.note(
            ConfirmStep(
                step="done",
                reason=done.reason,
                round=rounds,
                relaunches=relaunches,
                message=message,
            )
        )
