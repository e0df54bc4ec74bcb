"""Correctness results across configurations: pass rates and tasks that flipped.

A configuration that is fast but wrong must not win; these views show which
configuration passes what, and which tasks pass under one configuration and fail
under another (the first thing to read when a speculative-decoding knob changes
the answers).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from servesweep.models import EvalTaskResult
from servesweep.records import SweepData, TrialRecord

__all__ = ["EvalRate", "TaskFlip", "eval_rates", "task_flips", "task_status"]


@dataclass(frozen=True)
class EvalRate:
    """One eval workload of one trial: passed samples over all samples, all repeats."""

    trial_id: int
    workload: str
    passed: int
    total: int

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


@dataclass(frozen=True)
class TaskFlip:
    """A task whose status differs between configurations."""

    workload: str
    task_id: str
    statuses: tuple[tuple[int, str], ...]
    """(trial id, status) for every trial that ran it, in trial order."""


def task_status(results: Sequence[EvalTaskResult]) -> str:
    """``pass`` when every sample passed, else the most frequent other status."""
    bad = Counter(r.status for r in results if r.status != "pass")
    if not bad:
        return "pass"
    return sorted(bad.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def _tasks(data: SweepData, trial: TrialRecord) -> dict[tuple[str, str], list[EvalTaskResult]]:
    tasks: dict[tuple[str, str], list[EvalTaskResult]] = {}
    for res in data.results.get(trial.id, ()):
        for task in res.eval_results:
            tasks.setdefault((res.workload, task.task_id), []).append(task)
    return tasks


def eval_rates(data: SweepData) -> list[EvalRate]:
    """Pass rate of every eval workload of every trial (trials in run order)."""
    out: list[EvalRate] = []
    for trial in sorted(data.trials, key=lambda t: (t.seq, t.id)):
        counts: dict[str, list[int]] = {}
        for res in data.results.get(trial.id, ()):
            if not res.eval_results:
                continue
            entry = counts.setdefault(res.workload, [0, 0])
            entry[0] += sum(1 for e in res.eval_results if e.status == "pass")
            entry[1] += len(res.eval_results)
        out.extend(EvalRate(trial.number, w, p, n) for w, (p, n) in counts.items())
    return out


def task_flips(data: SweepData, trials: Sequence[TrialRecord] | None = None) -> list[TaskFlip]:
    """Tasks that pass under some of ``trials`` (default: every trial with eval
    results) and not under others, sorted by workload and task id."""
    chosen = sorted(trials if trials is not None else data.trials, key=lambda t: (t.seq, t.id))
    per_task: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for trial in chosen:
        for key, results in _tasks(data, trial).items():
            per_task.setdefault(key, []).append((trial.number, task_status(results)))
    flips: list[TaskFlip] = []
    for (workload, task_id), statuses in sorted(per_task.items()):
        passed = {s == "pass" for _, s in statuses}
        if len(passed) > 1:
            flips.append(TaskFlip(workload, task_id, tuple(statuses)))
    return flips
