"""Live progress for ``servesweep run``: an Observer that draws on the terminal.

On a TTY it keeps one status line (trial, phase, time in phase, ETA, the last
line of the server log while it loads) and prints a line per finished trial.
Elsewhere (a pipe, CI) it prints one plain line per state change. ``NO_COLOR``
is respected by the console the CLI passes in.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from servesweep.spec.plan import format_duration

__all__ = ["ProgressDisplay"]


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
        self._index = 0
        self._trial: int | None = None
        self._params = ""
        self._phase = ""
        self._phase_started = time.monotonic()
        self._line = ""
        self._trial_times: list[float] = []
        self._trial_started = time.monotonic()
        self._history = dict(history or {})

    # -- Observer -------------------------------------------------------------------

    def event(self, kind: str, data: Mapping[str, Any]) -> None:
        if self.quiet and kind != "warning":
            return
        handler = getattr(self, f"_on_{kind}", None)
        if handler is not None:
            handler(data)
        self._refresh()

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    # -- handlers -------------------------------------------------------------------

    def _print(self, text: str | Text) -> None:
        if self._live is not None:
            self._live.console.print(text)
        else:
            self.console.print(text, soft_wrap=True, highlight=False, markup=False)

    def _on_sweep_started(self, data: Mapping[str, Any]) -> None:
        self._total = int(data["todo"])
        done = int(data["done"])
        self._print(
            f"sweep {data['name']}: {data['trials']} trials, {done} already done, "
            f"{self._total} to run (results: {data['store']})"
        )
        if self.live_mode and self._total:
            self._live = Live(Text(""), console=self.console, refresh_per_second=8, transient=True)
            self._live.start()

    def _on_trial_started(self, data: Mapping[str, Any]) -> None:
        self._index += 1
        self._trial = int(data["trial"])
        params = data.get("params") or {}
        self._params = " ".join(f"{k}={v}" for k, v in params.items()) or "(defaults)"
        self._trial_started = time.monotonic()
        self._line = ""
        if not self.live_mode:
            self._print(f"[{self._index}/{self._total}] trial {self._trial}: {self._params}")

    def _on_phase(self, data: Mapping[str, Any]) -> None:
        self._phase = str(data["phase"])
        self._phase_started = time.monotonic()
        if not self.live_mode:
            self._print(f"  trial {data['trial']}: {self._phase}")

    def _on_progress(self, data: Mapping[str, Any]) -> None:
        line = data.get("line") or data.get("message")
        if line:
            self._line = str(line)

    def _on_workload_done(self, data: Mapping[str, Any]) -> None:
        levels = data.get("levels") or {}
        parts = []
        for level, metrics in levels.items():
            bits = [f"{k}={v:.4g}" for k, v in metrics.items()]
            parts.append(f"{level}: {', '.join(bits)}")
        self._print(f"  trial {data['trial']} {data['workload']}: " + "; ".join(parts))

    def _on_trial_finished(self, data: Mapping[str, Any]) -> None:
        self._trial_times.append(time.monotonic() - self._trial_started)
        outcome = data["outcome"]
        style = "green" if outcome == "ok" else "red"
        text = Text(f"trial {data['trial']} ")
        text.append(outcome, style=style)
        if data.get("failure_class"):
            text.append(f" {data['failure_class']}", style=style)
        if data.get("message"):
            text.append(f": {data['message']}")
        seconds = data.get("phase_seconds") or {}
        if seconds:
            text.append(
                "  (" + ", ".join(f"{k} {v:.1f}s" for k, v in seconds.items()) + ")", style="dim"
            )
        self._print(text)
        self._phase = ""

    def _on_warning(self, data: Mapping[str, Any]) -> None:
        text = Text(f"warning: {data['message']}", style="yellow")
        if self._live is not None or self.err_console is self.console:
            self._print(text)
        else:
            self.err_console.print(text, soft_wrap=True, highlight=False, markup=False)

    # -- the status line ------------------------------------------------------------

    def _eta(self) -> str:
        left = self._total - self._index + (0 if self._phase == "" else 1)
        if self._trial_times:
            per = sum(self._trial_times) / len(self._trial_times)
        elif self._history:
            per = sum(self._history.values())
        else:
            return "?"
        return format_duration(
            max(
                0.0,
                per * max(0, left - 1) + max(0.0, per - (time.monotonic() - self._trial_started)),
            )
        )

    def _refresh(self) -> None:
        if self._live is None or self._trial is None:
            return
        elapsed = time.monotonic() - self._phase_started
        text = Text()
        text.append(f"[{self._index}/{self._total}] trial {self._trial} ", style="bold")
        text.append(f"{self._params}  ")
        text.append(f"{self._phase or 'starting'} {elapsed:.1f}s", style="cyan")
        text.append(f"  ETA {self._eta()}", style="dim")
        if self._line and self._phase in ("load", "ready", "bench"):
            text.append(f"\n  {self._line[-150:]}", style="dim")
        self._live.update(text)
