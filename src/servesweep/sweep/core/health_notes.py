"""One line per sweep about the load generator's health (``bench.health``), however
many levels it concerns: the first level with mild lag, the first one stored as
unreliable. The table and the reports mark every unreliable level; the progress
output needs only to say it once, with what to change."""

from __future__ import annotations

from servesweep.models import LevelResult

__all__ = ["HealthNotes"]

_FIX = "raise workloads[].workers (more load-generator processes) or use a less busy machine"


class HealthNotes:
    def __init__(self, include_unreliable: bool = False) -> None:
        self.include_unreliable = include_unreliable
        self._said: set[str] = set()

    def note(self, trial: int, result: LevelResult) -> str | None:
        """The line to show for this level, or None (nothing to say, or said before)."""
        health = result.info.get("generator_health")
        if not isinstance(health, dict):
            return None
        state = health.get("state")
        if state not in ("mild", "unreliable") or state in self._said:
            return None
        self._said.add(state)
        where = f"trial {trial} {result.workload} {result.level}"
        reason = str(health.get("reason", "the load generator lagged"))
        if state == "mild":
            return (
                f"{where}: {reason}; the numbers remain usable (tail latencies may carry that "
                f"lag); to remove it, {_FIX} (said once per sweep)"
            )
        use = (
            "counted all the same (include_unreliable: true)"
            if self.include_unreliable
            else "best, constraints and pruning leave such levels out (include_unreliable: "
            "true counts them)"
        )
        return (
            f"{where} is stored as unreliable: {reason}; {use}; {_FIX} (said once per "
            "sweep; the results table marks every such level)"
        )
