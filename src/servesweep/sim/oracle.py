"""The correctness oracle: known eval tasks answered right with probability ``rate``.

When a request's prompt contains a task's ``prompt`` text, the simulated engine
answers with the task's ``reference`` (coding tasks in a fenced ``python`` block)
if :func:`oracle_correct` says so, else with a deterministic wrong answer.
``oracle_correct`` is a pure hash, so tests can predict the exact pass rate.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

__all__ = ["BUILTIN_TASK_FILES", "Oracle", "OracleTask", "oracle_correct"]

BUILTIN_TASK_FILES = ("coding.jsonl", "text.jsonl")


def oracle_correct(seed: int, task_id: str, sample: int, rate: float) -> bool:
    """Whether the ``sample``-th answer (0, 1, ...) to ``task_id`` is correct.

    ``sha256(f"{seed}:{task_id}:{sample}")``'s first 8 bytes as a fraction of 2**64,
    compared with ``rate``.
    """
    if rate <= 0.0:
        return False
    if rate >= 1.0:
        return True
    digest = hashlib.sha256(f"{seed}:{task_id}:{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


@dataclass(frozen=True)
class OracleTask:
    task_id: str
    prompt: str
    reference: str
    coding: bool
    entry_point: str | None = None

    def answer(self, correct: bool) -> str:
        if self.coding:
            if correct:
                code = self.reference.strip("\n")
                return code if "```" in code else f"```python\n{code}\n```"
            name = self.entry_point or "solution"
            return (
                f"```python\ndef {name}(*args, **kwargs):\n"
                '    raise NotImplementedError("wrong answer from the simulated engine")\n```'
            )
        if correct:
            return self.reference
        return "I am not sure; my best guess is that no answer exists (simulated wrong answer)."


def _builtin_files() -> list[Path]:
    data = resources.files("servesweep") / "bench" / "evals" / "data"
    found = []
    for name in BUILTIN_TASK_FILES:
        entry = data / name
        if entry.is_file():
            found.append(Path(str(entry)))
    return found


def load_tasks(path: Path) -> list[OracleTask]:
    """Tasks of one JSONL file; lines without a prompt and reference are skipped."""
    tasks = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict):
                continue
            prompt, reference = row.get("prompt"), row.get("reference")
            if not isinstance(prompt, str) or not prompt or not isinstance(reference, str):
                continue
            entry = row.get("entry_point")
            tasks.append(
                OracleTask(
                    task_id=str(row.get("task_id", prompt[:40])),
                    prompt=prompt,
                    reference=reference,
                    coding="test" in row or "entry_point" in row or "coding" in path.name,
                    entry_point=entry if isinstance(entry, str) else None,
                )
            )
    return tasks


class Oracle:
    """Known tasks of this process, with how many times each was asked."""

    def __init__(self, tasks: Iterable[OracleTask], seed: int, rate: float) -> None:
        # Longest prompt first, so a task whose prompt contains another's wins. The
        # prompt is matched without its surrounding whitespace (clients strip it).
        self.tasks = sorted(tasks, key=lambda t: len(t.prompt), reverse=True)
        self._keys = [t.prompt.strip() for t in self.tasks]
        self.seed = seed
        self.rate = rate
        self.asked: dict[str, int] = {}

    @classmethod
    def from_files(cls, files: Iterable[str] | None, seed: int, rate: float) -> Oracle:
        """``files`` None: the builtin eval task files, skipped when absent."""
        paths = [Path(f) for f in files] if files is not None else _builtin_files()
        tasks: list[OracleTask] = []
        for p in paths:
            tasks.extend(load_tasks(p))
        return cls(tasks, seed, rate)

    def match(self, text: str) -> OracleTask | None:
        for key, task in zip(self._keys, self.tasks, strict=True):
            if key in text:
                return task
        return None

    def respond(self, text: str) -> tuple[str, OracleTask, bool] | None:
        """The answer to a known task (and which, and whether correct), or None."""
        task = self.match(text)
        if task is None:
            return None
        sample = self.asked.get(task.task_id, 0)
        self.asked[task.task_id] = sample + 1
        correct = oracle_correct(self.seed, task.task_id, sample, self.rate)
        return task.answer(correct), task, correct
