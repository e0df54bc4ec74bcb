"""Glue for ``servesweep best``'s draft-length schedule: what the sweep's engine can
express (its preset) and the launch commands of the schedule's params, around the
decision of :mod:`servesweep.decide.schedule`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servesweep.decide.best import BestResult
from servesweep.decide.refs import stored_spec
from servesweep.decide.schedule import DraftSchedule, ScheduleForm, draft_schedule
from servesweep.errors import ServesweepError
from servesweep.records import SweepData
from servesweep.servers.engine_args import launch_command_text
from servesweep.servers.engines import build_launch, get_preset
from servesweep.spec.schema import SweepSpec

__all__ = ["schedule_of"]


def _launch(spec: SweepSpec, params: Mapping[str, Any]) -> str | None:
    try:
        argv, env = build_launch(spec.server, params)
    except ServesweepError:
        return None  # the engine would refuse it: no command to show
    return launch_command_text(argv, env)


def schedule_of(
    data: SweepData, result: BestResult, include_unreliable: bool | None = None
) -> tuple[DraftSchedule | None, dict[str, str]]:
    """The draft length per concurrency of the sweep's best and the launch commands
    (``schedule``: the schedule's; by level: that level's draft length alone);
    ``include_unreliable`` as ``best`` was given it."""
    spec = stored_spec(data)
    if spec is None:
        return None, {}
    try:
        preset = get_preset(spec.server.engine)
    except ServesweepError:
        return None, {}
    form = ScheduleForm(spec.server.engine, preset.draft_length_param, preset.draft_schedule_param)
    schedule = draft_schedule(data, result, form, include_unreliable=include_unreliable)
    if schedule is None:
        return None, {}
    launches: dict[str, str] = {}
    found = _launch(spec, schedule.params)
    if found is not None:
        launches["schedule"] = found
    for level in schedule.levels:
        found = _launch(spec, level.params)
        if found is not None:
            launches[level.level] = found
    return schedule, launches
