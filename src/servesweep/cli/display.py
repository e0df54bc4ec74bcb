"""Live progress for ``servesweep run``: an Observer that draws on the terminal.

On a TTY it keeps one status line per running trial — its slot (machine, slot, GPUs),
the trial, its phase and time in phase, and the last line of the server log while it
loads — under a header with the sweep's progress and ETA, and prints a line per
finished trial. Elsewhere (a pipe, CI) it prints one plain line per state change.
``NO_COLOR`` is respected by the console the CLI passes in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from servesweep.report import format_number
from servesweep.spec.plan import format_duration
from servesweep.sweep.events import (
    ConfirmStep,
    Event,
    PhaseEntered,
    Progress,
    Screened,
    SweepStarted,
    SweepWarning,
    TrialFinished,
    TrialStarted,
    WorkloadDone,
)

__all__ = ["ProgressDisplay"]


@dataclass
class _Running:
    trial: int
    params: str
    where: str
    started: float = field(default_factory=time.monotonic)
    phase: str = ""
    phase_started: float = field(default_factory=time.monotonic)
    line: str = ""


def _number(value: float) -> str:
    """Numbers as the reports write them (significant digits)."""
    return format_number(value)


def _seconds(value: float) -> str:
    """A phase's duration, to the millisecond."""
    return f"{format_number(round(value, 3))}s"


class ProgressDisplay:
    def __init__(
        self,
        console: Console,
        *,
        quiet: bool = False,
        history: Mapping[str, float] | None = None,
        err_console: Console | None = None,
    ) -> None:
        self.console = console
        self.err_console = err_console or console
        self.quiet = quiet
        self.live_mode = console.is_terminal and not quiet
        self._live: Live | None = None
        self._total = 0
        self._started = 0
        self._finished = 0
        self._slots = 1
        self._running: dict[int, _Running] = {}
        self._numbers: dict[int, int] = {}
        """Trial id -> its number in the sweep (what the lines show)."""
        self._index: dict[int, int] = {}
        """Trial id -> its place in this run's count (``[3/7]``), kept on a retry."""
        self._trial_times: list[float] = []
        self._history = dict(history or {})
        self._lock = threading.Lock()

    # -- Observer -------------------------------------------------------------------

    def event(self, event: Event) -> None:
        if self.quiet and not isinstance(event, SweepWarning):
            return
        with self._lock:
            if isinstance(event, SweepStarted):
                self._on_sweep_started(event)
            elif isinstance(event, TrialStarted):
                self._on_trial_started(event)
            elif isinstance(event, PhaseEntered):
                self._on_phase(event)
            elif isinstance(event, Progress):
                self._on_progress(event)
            elif isinstance(event, WorkloadDone):
                self._on_workload_done(event)
            elif isinstance(event, TrialFinished):
                self._on_trial_finished(event)
            elif isinstance(event, SweepWarning):
                self._on_warning(event)
            elif isinstance(event, ConfirmStep):
                self._on_confirm(event)
            elif isinstance(event, Screened):
                self._on_screened(event)
            self._refresh()

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    # -- handlers -------------------------------------------------------------------

    def _n(self, trial: int) -> int:
        """The number a person reads for the trial with this id."""
        return self._numbers.get(trial, trial)

    def _print(self, text: str | Text) -> None:
        if self._live is not None:
            self._live.console.print(text)
        else:
            self.console.print(text, soft_wrap=True, highlight=False, markup=False)

    def _on_sweep_started(self, event: SweepStarted) -> None:
        self._total = event.todo
        self._slots = max(1, event.slots)
        slots = f", up to {event.slots} at once" if event.slots > 1 else ""
        bound = "at most " if event.at_most else ""
        so_far = " so far" if event.at_most else ""
        self._print(
            f"sweep {event.name}: {event.trials} trials{so_far}, {event.done} already done, "
            f"{bound}{self._total} to run{slots} (results: {event.store})"
        )
        if self.live_mode:
            self._live = Live(Text(""), console=self.console, refresh_per_second=8, transient=True)
            self._live.start()

    def _on_trial_started(self, event: TrialStarted) -> None:
        again = event.trial in self._numbers  # a retry (after a lost node): same count
        if not again and not event.relaunch:
            self._started += 1
            self._index[event.trial] = self._started
        params = " ".join(f"{k}={v}" for k, v in event.params.items()) or "(defaults)"
        gpus = ",".join(str(g) for g in event.gpus)
        where = f"slot {event.slot}" + (f" gpus {gpus}" if gpus else "")
        if event.node_id:
            where = f"{event.node} {where}"  # a cluster's node
        elif self._slots == 1:
            where = ""
        self._numbers[event.trial] = event.number or event.trial
        self._running[event.trial] = _Running(self._n(event.trial), params, where)
        if not self.live_mode:
            at = f" on {where}" if where else ""
            total = str(self._total) if self._total else "?"
            count = self._index.get(event.trial, self._started)
            retry = f" again (attempt {event.attempt})" if again else ""
            if event.relaunch:
                self._print(f"confirm: trial {self._n(event.trial)} relaunched{at}: {params}")
                return
            self._print(f"[{count}/{total}] trial {self._n(event.trial)}{retry}{at}: {params}")

    def _on_phase(self, event: PhaseEntered) -> None:
        running = self._running.get(event.trial)
        if running is not None:
            running.phase = event.phase.value
            running.phase_started = time.monotonic()
        if not self.live_mode:
            self._print(f"  trial {self._n(event.trial)}: {event.phase.value}")

    def _on_progress(self, event: Progress) -> None:
        running = self._running.get(event.trial)
        if running is not None and event.line:
            running.line = event.line

    def _on_workload_done(self, event: WorkloadDone) -> None:
        parts = []
        for level, metrics in event.levels.items():
            bits = [f"{k}={_number(v)}" for k, v in metrics.items()]
            parts.append(f"{level}: {', '.join(bits)}")
        self._print(f"  trial {self._n(event.trial)} {event.workload}: " + "; ".join(parts))

    def _on_trial_finished(self, event: TrialFinished) -> None:
        running = self._running.pop(event.trial, None)
        if event.relaunch:  # the confirm phase: not one of the run's trials to count
            self._running.pop(event.trial, None)
            outcome = event.outcome.value
            text = Text(f"confirm: trial {self._n(event.trial)} relaunch ")
            text.append(outcome, style="green" if outcome == "ok" else "red")
            if event.evidence is not None:
                text.append(f": {event.evidence.summary()}")
            self._print(text)
            return
        if running is not None:
            self._trial_times.append(time.monotonic() - running.started)
        self._finished += 1
        outcome = event.outcome.value
        style = "green" if outcome == "ok" else "red"
        text = Text(f"trial {self._n(event.trial)} ")
        text.append(outcome, style=style)
        if event.failure_class is not None:
            text.append(f" {event.failure_class.value}", style=style)
        if event.evidence is not None:
            text.append(f": {event.evidence.summary()}")
        if event.phase_seconds:
            text.append(
                "  ("
                + ", ".join(f"{k} {_seconds(v)}" for k, v in event.phase_seconds.items())
                + ")",
                style="dim",
            )
        self._print(text)

    def _on_screened(self, event: Screened) -> None:
        """What screening decided on a trial's short levels (docs/sweep-file.md)."""
        trial = self._n(event.trial) if event.trial is not None else "?"
        if event.kept:
            self._print(f"screening: trial {trial} can still win: measured in full")
        else:
            self._print(f"screening: trial {trial} screened out: {event.reason}")

    def _on_confirm(self, event: ConfirmStep) -> None:
        """The confirm phase's rounds and end (docs/sweep-file.md, ``confirm``)."""
        if event.step == "round":
            who = ", ".join(f"#{self._n(int(t))}" for t in event.targets)
            self._print(
                f"confirm round {event.round}: relaunching {who} (tied with the leader), "
                f"{event.relaunches} launch{'es' if event.relaunches != 1 else ''}"
            )
        elif event.step == "done":
            ends = {
                "no_tie": "nothing to confirm (no tie after the sweep)",
                "separated": "the candidates separated",
                "equivalent": event.message or "the candidates are equivalent",
                "budget": "budget spent",
                "failed": "too few candidates could be relaunched",
            }
            why = ends.get(event.reason, event.reason)
            if not event.round:
                self._print(f"confirm: {why}")
                return
            self._print(
                f"confirm: {why} after {event.round} round{'s' if event.round != 1 else ''} "
                f"and {event.relaunches} relaunch{'es' if event.relaunches != 1 else ''} "
                "(servesweep best says what it changed)"
            )

    def _on_warning(self, event: SweepWarning) -> None:
        text = Text(f"warning: {event.message}", style="yellow")
        if self._live is not None or self.err_console is self.console:
            self._print(text)
        else:
            self.err_console.print(text, soft_wrap=True, highlight=False, markup=False)

    # -- the status lines ---------------------------------------------------------------

    def _eta(self) -> str:
        if not self._total:
            return "?"
        left = self._total - self._finished
        if self._trial_times:
            per = sum(self._trial_times) / len(self._trial_times)
        elif self._history:
            per = sum(self._history.values())
        else:
            return "?"
        slots = max(1, min(self._slots, left))
        elapsed = max((time.monotonic() - r.started for r in self._running.values()), default=0.0)
        return format_duration(max(0.0, per * left / slots - min(elapsed, per)))

    def _refresh(self) -> None:
        if self._live is None or not self._running:
            return
        now = time.monotonic()
        header = Text()
        total = str(self._total) if self._total else "?"
        header.append(f"[{self._finished}/{total} done] ", style="bold")
        header.append(f"{len(self._running)} running", style="cyan")
        header.append(f"  ETA {self._eta()}", style="dim")
        lines: list[Text] = [header]
        for running in sorted(self._running.values(), key=lambda r: r.where):
            text = Text("  ")
            if running.where:
                text.append(f"{running.where}  ", style="dim")
            text.append(f"trial {running.trial} ", style="bold")
            text.append(f"{running.params}  ")
            text.append(
                f"{running.phase or 'starting'} {now - running.phase_started:.1f}s", style="cyan"
            )
            lines.append(text)
            if running.line and running.phase in ("load", "ready", "bench"):
                lines.append(Text(f"    {running.line[-150:]}", style="dim"))
        self._live.update(Group(*lines))
