"""Eval suites: the builtin ones and the JSONL files users bring.

Two kinds of task:

* :class:`CodingTask`, HumanEval-style: ``task_id``, ``prompt`` (signature and
  docstring), ``entry_point``, ``test`` (code defining ``check(candidate)``) and an
  optional ``reference`` solution (HumanEval's ``prompt + canonical_solution`` is
  taken as the reference too). MBPP rows (``text``, ``code``, ``test_list``,
  optional ``test_setup_code``) are converted to the same shape.
* :class:`TextTask`: ``task_id``, ``prompt``, ``kind`` (``exact``, ``contains``,
  ``regex``, ``numeric``), ``answer``, optional ``tolerance`` (numeric, absolute)
  and ``reference``.

A suite is ``builtin:coding``, ``builtin:text`` or a path to a JSONL file; a file
may mix both kinds. A bad line raises :class:`DatasetError` naming file and line.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, cast

from servesweep.errors import DatasetError

__all__ = [
    "BUILTIN_SUITES",
    "CodingTask",
    "Suite",
    "Task",
    "TextKind",
    "TextTask",
    "load_suite",
    "parse_tasks",
]

TextKind = Literal["exact", "contains", "regex", "numeric"]
_TEXT_KINDS = ("exact", "contains", "regex", "numeric")
BUILTIN_SUITES = {"builtin:coding": "coding.jsonl", "builtin:text": "text.jsonl"}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MBPP_CALL = re.compile(r"^\s*assert\s+(?:not\s+)?\(?\s*(?:set\()?\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_DEF = re.compile(r"^def\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.MULTILINE)


@dataclass(frozen=True)
class CodingTask:
    task_id: str
    prompt: str
    entry_point: str
    test: str
    """Python code defining ``check(candidate)``."""
    reference: str | None = None


@dataclass(frozen=True)
class TextTask:
    task_id: str
    prompt: str
    kind: TextKind
    answer: str
    tolerance: float = 0.0
    reference: str | None = None


Task = CodingTask | TextTask


@dataclass(frozen=True)
class Suite:
    name: str
    """``builtin:coding`` or the file's path."""
    tasks: tuple[Task, ...]


def load_suite(name: str, base_dir: str | Path | None = None) -> Suite:
    """Load a suite by name: ``builtin:coding``, ``builtin:text`` or a JSONL path
    (relative paths are taken from ``base_dir``, e.g. the sweep file's folder)."""
    if name in BUILTIN_SUITES:
        entry = resources.files("servesweep.bench.evals") / "data" / BUILTIN_SUITES[name]
        return Suite(name, parse_tasks(entry.read_text(encoding="utf-8"), name))
    if name.startswith("builtin:"):
        known = ", ".join(BUILTIN_SUITES)
        raise DatasetError(f"unknown eval suite {name!r}; builtin suites are {known}")
    path = Path(name).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read the eval suite: {exc}") from exc
    return Suite(str(path), parse_tasks(text, str(path)))


def parse_tasks(text: str, source: str) -> tuple[Task, ...]:
    """Tasks of a JSONL text; ``source`` names it in errors (``FILE:LINE: ...``)."""
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise DatasetError(f"{where}: not a JSON object: {exc}") from exc
        if not isinstance(row, dict):
            raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
        task = _task(row, where)
        if task.task_id in seen:
            raise DatasetError(
                f"{where}: task_id {task.task_id!r} repeats line {seen[task.task_id]}"
            )
        seen[task.task_id] = number
        tasks.append(task)
    if not tasks:
        raise DatasetError(f"{source}: no tasks in the eval suite")
    return tuple(tasks)


def _task(row: dict[str, Any], where: str) -> Task:
    if "kind" in row or "answer" in row:
        return _text_task(row, where)
    if "test_list" in row:
        return _mbpp_task(row, where)
    return _coding_task(row, where)


def _str(row: dict[str, Any], key: str, where: str, *, required: bool = True) -> str | None:
    value = row.get(key)
    if value is None:
        if required:
            raise DatasetError(f"{where}: missing field {key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DatasetError(f"{where}: field {key!r} must be a string")
    return str(value)


def _compiles(code: str, what: str, where: str) -> None:
    try:
        compile(code, what, "exec")
    except (SyntaxError, ValueError) as exc:
        raise DatasetError(f"{where}: field {what!r} is not valid Python: {exc}") from exc


def _coding_task(row: dict[str, Any], where: str) -> CodingTask:
    task_id = _str(row, "task_id", where) or ""
    prompt = _str(row, "prompt", where) or ""
    entry = _str(row, "entry_point", where) or ""
    test = _str(row, "test", where) or ""
    if not _IDENT.match(entry):
        raise DatasetError(f"{where}: entry_point {entry!r} is not a Python name")
    _compiles(test, "test", where)
    if not re.search(r"^def\s+check\s*\(", test, re.MULTILINE):
        raise DatasetError(f"{where}: field 'test' must define check(candidate)")
    reference = _str(row, "reference", where, required=False)
    if reference is None and isinstance(row.get("canonical_solution"), str):
        reference = prompt + row["canonical_solution"]
    return CodingTask(task_id, prompt, entry, test, reference)


def _mbpp_task(row: dict[str, Any], where: str) -> CodingTask:
    task_id = _str(row, "task_id", where) or ""
    text = _str(row, "prompt", where, required=False) or _str(row, "text", where) or ""
    tests = row["test_list"]
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise DatasetError(f"{where}: test_list must be a non-empty list of strings")
    entry = _str(row, "entry_point", where, required=False)
    if entry is None:
        match = _MBPP_CALL.match(tests[0])
        code = row.get("code")
        found = _DEF.findall(code) if isinstance(code, str) else []
        entry = match.group(1) if match else (found[-1] if found else None)
    if not entry or not _IDENT.match(entry):
        raise DatasetError(f"{where}: cannot tell the function name; add 'entry_point'")
    setup = row.get("test_setup_code") or ""
    body = "\n".join([*str(setup).splitlines(), *tests])
    test = "def check(candidate):\n" + "".join(f"    {ln}\n" for ln in body.splitlines())
    _compiles(test, "test_list", where)
    prompt = f"{text}\nYour code should pass these tests:\n" + "\n".join(tests) + "\n"
    code = row.get("code")
    return CodingTask(task_id, prompt, entry, test, code if isinstance(code, str) else None)


def _text_task(row: dict[str, Any], where: str) -> TextTask:
    task_id = _str(row, "task_id", where) or ""
    prompt = _str(row, "prompt", where) or ""
    kind = _str(row, "kind", where) or ""
    answer = _str(row, "answer", where) or ""
    if kind not in _TEXT_KINDS:
        raise DatasetError(f"{where}: kind {kind!r} is not one of {', '.join(_TEXT_KINDS)}")
    tolerance = row.get("tolerance", 0.0)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or tolerance < 0:
        raise DatasetError(f"{where}: tolerance must be a number >= 0")
    if kind == "regex":
        try:
            re.compile(answer)
        except re.error as exc:
            raise DatasetError(f"{where}: answer is not a valid regex: {exc}") from exc
    if kind == "numeric":
        try:
            value = float(answer.replace(",", ""))
        except ValueError as exc:
            raise DatasetError(f"{where}: numeric answer {answer!r} is not a number") from exc
        if not math.isfinite(value):
            raise DatasetError(f"{where}: numeric answer {answer!r} is not finite")
    reference = _str(row, "reference", where, required=False)
    return TextTask(task_id, prompt, cast(TextKind, kind), answer, float(tolerance), reference)
