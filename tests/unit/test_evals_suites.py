"""Suites: the builtin files, user JSONL (HumanEval, MBPP, text) and bad files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servesweep.bench.evals.suites import CodingTask, TextTask, load_suite, parse_tasks
from servesweep.errors import DatasetError


def test_builtin_coding_suite_shape() -> None:
    suite = load_suite("builtin:coding")
    assert len(suite.tasks) >= 24
    ids = [t.task_id for t in suite.tasks]
    assert len(set(ids)) == len(ids)
    for task in suite.tasks:
        assert isinstance(task, CodingTask)
        assert f"def {task.entry_point}(" in task.prompt
        assert '"""' in task.prompt, "prompt has a docstring"
        assert "def check(candidate):" in task.test
        assert task.test.count("assert ") >= 4, task.task_id
        assert task.reference is not None and task.reference.startswith(task.prompt)


def test_builtin_text_suite_shape() -> None:
    tasks = load_suite("builtin:text").tasks
    assert len(tasks) >= 12
    kinds = {t.kind for t in tasks if isinstance(t, TextTask)}
    assert kinds == {"exact", "contains", "regex", "numeric"}
    assert all(isinstance(t, TextTask) and t.reference for t in tasks)


def test_builtin_files_have_the_fields_the_simulated_engine_reads() -> None:
    data = Path(__file__).parents[2] / "src/servesweep/bench/evals/data"
    for line in (data / "coding.jsonl").read_text().splitlines():
        assert set(json.loads(line)) == {"task_id", "prompt", "entry_point", "test", "reference"}
    for line in (data / "text.jsonl").read_text().splitlines():
        keys = set(json.loads(line))
        assert {"task_id", "prompt", "kind", "answer", "reference"} <= keys
        assert keys <= {"task_id", "prompt", "kind", "answer", "tolerance", "reference"}


def _jsonl(*rows: Any) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def test_humaneval_row_with_canonical_solution() -> None:
    row = {
        "task_id": "HumanEvalLike/0",
        "prompt": "def inc(x):\n    '''Add one.'''\n",
        "canonical_solution": "    return x + 1\n",
        "test": "def check(candidate):\n    assert candidate(1) == 2\n",
        "entry_point": "inc",
    }
    (task,) = parse_tasks(_jsonl(row), "he.jsonl")
    assert isinstance(task, CodingTask)
    assert task.reference == row["prompt"] + row["canonical_solution"]


def test_mbpp_row_is_converted() -> None:
    row = {
        "task_id": 601,
        "text": "Write a function to find the larger of two numbers.",
        "code": "def larger(a, b):\n    return a if a > b else b\n",
        "test_list": ["assert larger(1, 2) == 2", "assert larger(5, 3) == 5"],
        "test_setup_code": "import math",
        "challenge_test_list": [],
    }
    (task,) = parse_tasks(_jsonl(row), "mbpp.jsonl")
    assert isinstance(task, CodingTask)
    assert task.task_id == "601" and task.entry_point == "larger"
    assert "assert larger(1, 2) == 2" in task.prompt
    assert task.reference == row["code"]
    namespace: dict[str, Any] = {}
    exec(task.reference + task.test, namespace)
    namespace["check"](namespace["larger"])
    wrong: dict[str, Any] = {}
    exec("def larger(a, b):\n    return a\n" + task.test, wrong)
    with pytest.raises(AssertionError):
        wrong["check"](wrong["larger"])


def test_text_rows_and_a_mixed_file() -> None:
    rows = _jsonl(
        {"task_id": "n", "prompt": "2+2?", "kind": "numeric", "answer": "4", "tolerance": 0.1},
        {"task_id": "r", "prompt": "code?", "kind": "regex", "answer": r"\d{3}"},
        {
            "task_id": "c",
            "prompt": "def f():\n",
            "entry_point": "f",
            "test": "def check(candidate):\n    assert candidate() is None\n",
        },
    )
    tasks = parse_tasks(rows, "mixed.jsonl")
    assert [type(t).__name__ for t in tasks] == ["TextTask", "TextTask", "CodingTask"]
    assert isinstance(tasks[0], TextTask) and tasks[0].tolerance == 0.1


def test_relative_path_is_taken_from_base_dir(tmp_path: Path) -> None:
    (tmp_path / "s.jsonl").write_text(
        _jsonl({"task_id": "a", "prompt": "p", "kind": "exact", "answer": "x"})
    )
    suite = load_suite("s.jsonl", base_dir=tmp_path)
    assert suite.name == str(tmp_path / "s.jsonl") and len(suite.tasks) == 1


GOOD_CODE = {
    "task_id": "ok",
    "prompt": "def f():\n",
    "entry_point": "f",
    "test": "def check(candidate):\n    assert candidate() == 1\n",
}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"bad\.jsonl:2: not a JSON object"),
        ("[1, 2]", r"bad\.jsonl:2: expected a JSON object, got list"),
        ({**GOOD_CODE, "task_id": "b", "entry_point": None}, r":2: missing field 'entry_point'"),
        ({**GOOD_CODE, "task_id": "b", "entry_point": "not a name"}, r"not a Python name"),
        ({**GOOD_CODE, "task_id": "b", "test": "def check(:"}, r"'test' is not valid Python"),
        ({**GOOD_CODE, "task_id": "b", "test": "assert True\n"}, r"must define check"),
        (GOOD_CODE, r":2: task_id 'ok' repeats line 1"),
        ({"task_id": "t", "prompt": "p", "kind": "fuzzy", "answer": "a"}, r"kind 'fuzzy'"),
        ({"task_id": "t", "prompt": "p", "kind": "regex", "answer": "("}, r"not a valid regex"),
        ({"task_id": "t", "prompt": "p", "kind": "numeric", "answer": "ten"}, r"not a number"),
        (
            {"task_id": "t", "prompt": "p", "kind": "numeric", "answer": "1", "tolerance": -1},
            r"tolerance must be a number >= 0",
        ),
        ({"task_id": "t", "prompt": ["p"], "kind": "exact", "answer": "a"}, r"'prompt' must be"),
        ({"task_id": "m", "text": "t", "test_list": []}, r"test_list must be a non-empty"),
        ({"task_id": "m", "text": "t", "test_list": ["assert True"]}, r"cannot tell the function"),
    ],
)
def test_bad_lines_name_file_and_line(line: Any, message: str) -> None:
    with pytest.raises(DatasetError, match=message):
        parse_tasks(_jsonl(GOOD_CODE, line), "bad.jsonl")


def test_empty_missing_and_unknown_suites(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no tasks"):
        parse_tasks("\n\n", "empty.jsonl")
    with pytest.raises(DatasetError, match="cannot read the eval suite"):
        load_suite(str(tmp_path / "absent.jsonl"))
    with pytest.raises(DatasetError, match="builtin suites are builtin:coding, builtin:text"):
        load_suite("builtin:math")
