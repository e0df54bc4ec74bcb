"""The draft length per concurrency and the engine's schedule
(:mod:`servesweep.decide.schedule`) written out for ``servesweep best``: text and
JSON. It renders; the choices and their reasons are the decision's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servesweep.decide.schedule import DraftChoice, DraftSchedule
from servesweep.decide.stats import format_number, printable

__all__ = ["PREDICTED_MARK", "format_schedule", "schedule_to_json"]

PREDICTED_MARK = "[predicted, never launched]"


def _figure(choice: DraftChoice) -> str:
    if choice.value is None:
        return f"unknown (too far from what was measured) {PREDICTED_MARK}"
    text = format_number(choice.value)
    if choice.low is not None and choice.high is not None:
        kind = "predicted" if choice.predicted else "95% interval"
        text += f" ({kind} {format_number(choice.low)}..{format_number(choice.high)})"
    if choice.predicted:
        return f"{text} {PREDICTED_MARK}"
    return f"{text} measured #{choice.trial}"


def format_schedule(schedule: DraftSchedule, launches: Mapping[str, str]) -> str:
    """Lines for the terminal; ``launches`` the launch command of the schedule
    (``schedule``) and of each level's own draft length (by level), where known."""
    name = schedule.draft_param
    lines = [
        f"draft length per concurrency ({schedule.direction} {schedule.metric}; "
        "every other knob as the best's):"
    ]
    for lv in schedule.levels:
        lines.append(f"  {lv.level}: {name}={lv.chosen.draft}  {_figure(lv.chosen)}")
        others = [c for c in (*lv.measured, *lv.predicted) if c.draft != lv.chosen.draft]
        for c in others:
            lines.append(f"      {name}={c.draft}: {_figure(c)}")
        if lv.why:
            lines.append(f"      why: {lv.why}")
        if lv.open:
            listed = ", ".join(str(d) for d in lv.open)
            lines.append(
                f"      open: {name}={listed} predicted, could still beat it: launch to know"
            )
    last = len(schedule.ranges) - 1  # the last range holds for every larger batch
    ranges = ", ".join(
        f"{a}+: {d}" if i == last else f"{a}-{b}: {d}"
        for i, (a, b, d) in enumerate(schedule.ranges)
    )
    if schedule.expressed:
        lines.append(f"schedule ({schedule.engine}, batch size: draft length): {ranges}")
        lines.append(f"  {schedule.schedule_param}={_compact(schedule.ranges)}")
        top = schedule.params.get(name)
        lines.append(f"  {name}={top} (the largest: vLLM caps every entry at it)")
        if "schedule" in launches:
            lines.append(f"  schedule launch: {launches['schedule']}")
    else:
        lines.append(f"schedule ({schedule.engine}, batch size: draft length): {ranges}")
        if len(schedule.ranges) == 1 and "schedule" in launches:
            lines.append(f"  schedule launch: {launches['schedule']}")
        for lv in schedule.levels:
            if len(schedule.ranges) > 1 and lv.level in launches:
                lines.append(f"  launch for {lv.level}: {launches[lv.level]}")
    for draft, why in sorted(schedule.ruled_out.items()):
        lines.append(f"  note: {name}={draft} neither measured nor predicted: {why}")
    for limit in schedule.limits:
        lines.append(f"  note: {limit}")
    return "\n".join(printable(" ".join(line.splitlines())) for line in lines)


def _compact(ranges: tuple[tuple[int, int, int], ...]) -> str:
    return "[" + ",".join(f"[{a},{b},{d}]" for a, b, d in ranges) + "]"


def schedule_to_json(
    schedule: DraftSchedule | None, launches: Mapping[str, str]
) -> dict[str, Any] | None:
    """``best --json``'s ``draft_schedule`` (None: the sweep has none)."""
    if schedule is None:
        return None
    return {
        **schedule.to_dict(),
        "launch": launches.get("schedule"),
        "level_launch": {lv.level: launches.get(lv.level) for lv in schedule.levels},
    }
