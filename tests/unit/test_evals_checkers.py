"""Text checkers: exact, contains, regex, numeric within tolerance."""

from __future__ import annotations

import pytest

from servesweep.bench.evals.checkers import check_text, last_number
from servesweep.bench.evals.suites import TextKind, TextTask, load_suite


def _task(kind: TextKind, answer: str, tolerance: float = 0.0) -> TextTask:
    return TextTask("t/1", "question", kind, answer, tolerance)


@pytest.mark.parametrize(
    ("kind", "answer", "tolerance", "reply", "ok"),
    [
        ("exact", "Paris", 0, "Paris", True),
        ("exact", "Paris", 0, " paris. ", True),
        ("exact", "Paris", 0, "The capital is Paris.", False),
        ("exact", "Paris", 0, "Lyon", False),
        ("contains", "iron", 0, "The element is Iron (Fe).", True),
        ("contains", "carbon dioxide", 0, "Plants take in carbon\n  dioxide.", True),
        ("contains", "iron", 0, "It is copper.", False),
        ("regex", r"\b404\b", 0, "The code is 404.", True),
        ("regex", r"\b404\b", 0, "It is 4040.", False),
        ("regex", r"(?i)^yes\b", 0, "YES, it is", True),
        ("numeric", "300", 0.5, "It generates 300 tokens.", True),
        ("numeric", "300", 0.5, "300.4", True),
        ("numeric", "300", 0.5, "301", False),
        ("numeric", "391", 0, "17 × 23 = 391", True),
        ("numeric", "1.414", 0.001, "about 1.4142", True),
        ("numeric", "1234567", 0, "1,234,567", True),
        ("numeric", "-2.5", 0, "x = -2.5", True),
        ("numeric", "0.001", 0, "1e-3", True),
        ("numeric", "300", 0.5, "no idea", False),
    ],
)
def test_checkers(kind: TextKind, answer: str, tolerance: float, reply: str, ok: bool) -> None:
    passed, message = check_text(_task(kind, answer, tolerance), reply)
    assert passed is ok
    assert (message == "") is ok


def test_failure_messages_say_what_was_expected() -> None:
    assert "expected exactly 'Paris'" in check_text(_task("exact", "Paris"), "Lyon")[1]
    assert "contain 'iron'" in check_text(_task("contains", "iron"), "gold")[1]
    assert "/\\d+/" in check_text(_task("regex", r"\d+"), "none")[1]
    msg = check_text(_task("numeric", "300", 0.5), "310")[1]
    assert "300" in msg and "310" in msg
    assert "has none" in check_text(_task("numeric", "300"), "none")[1]


def test_last_number() -> None:
    assert last_number("between 3 and 4.5") == 4.5
    assert last_number("<think>42</think> 7") == 7
    assert last_number("nothing") is None


def test_builtin_text_references_pass_and_a_wrong_answer_fails() -> None:
    wrong = "I am not sure; my best guess is that no answer exists."
    for task in load_suite("builtin:text").tasks:
        assert isinstance(task, TextTask)
        assert task.reference is not None
        assert check_text(task, task.reference)[0], task.task_id
        assert not check_text(task, wrong)[0], task.task_id
