"""Checkers of text tasks: ``exact``, ``contains``, ``regex``, ``numeric``.

Each returns ``(passed, message)``; the message says what was expected when the
answer is wrong. Answers are compared after :func:`extract.normalize_text`
(reasoning dropped, whitespace collapsed, wrapping quotes and a final period
removed, case folded); ``regex`` searches the answer with reasoning dropped and
whitespace stripped, as written (add ``(?i)`` for case-insensitive patterns).
"""

from __future__ import annotations

import re

from servesweep.bench.evals.extract import normalize_text, strip_reasoning
from servesweep.bench.evals.suites import TextTask

__all__ = ["check_text", "last_number"]

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (``1,234.5`` and ``1e-3`` understood)."""
    found = _NUMBER.findall(strip_reasoning(text))
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_text(task: TextTask, answer: str) -> tuple[bool, str]:
    """Whether ``answer`` is right for ``task``, and why not."""
    if task.kind == "exact":
        ok = normalize_text(answer) == normalize_text(task.answer)
        return ok, "" if ok else f"expected exactly {task.answer!r}, got {_short(answer)!r}"
    if task.kind == "contains":
        ok = normalize_text(task.answer) in normalize_text(answer)
        return ok, "" if ok else f"expected the answer to contain {task.answer!r}"
    if task.kind == "regex":
        ok = re.search(task.answer, strip_reasoning(answer).strip()) is not None
        return ok, "" if ok else f"answer does not match /{task.answer}/: {_short(answer)!r}"
    expected = float(task.answer.replace(",", ""))
    got = last_number(answer)
    if got is None:
        return False, f"expected a number ({task.answer}), the answer has none"
    ok = abs(got - expected) <= task.tolerance
    return ok, "" if ok else f"expected {task.answer} ± {task.tolerance:g}, got {got:g}"
