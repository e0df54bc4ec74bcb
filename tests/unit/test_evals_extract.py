"""Answer extraction: fenced blocks, bare code, completions of the prompt, text."""

from __future__ import annotations

import pytest

from servesweep.bench.evals.extract import (
    extract_program,
    fenced_blocks,
    normalize_text,
    strip_reasoning,
)

PROMPT = (
    "from typing import List\n\n\n"
    "def helper(x: int) -> int:\n"
    "    return x * 2\n\n\n"
    "def double_all(xs: List[int]) -> List[int]:\n"
    '    """Double every number."""\n'
)
FULL = "def double_all(xs: List[int]) -> List[int]:\n    return [helper(x) for x in xs]\n"


def _run(program: str) -> list[int]:
    namespace: dict[str, object] = {}
    exec(program, namespace)
    func = namespace["double_all"]
    assert callable(func)
    result = func([1, 2])
    assert isinstance(result, list)
    return result


def test_fenced_python_block_with_prose_around() -> None:
    answer = f"Sure! Here it is:\n\n```python\n{FULL}```\n\nThis doubles each item."
    program = extract_program(answer, PROMPT, "double_all")
    assert program is not None
    # The prompt's imports and helper come first, so List and helper resolve.
    assert program.startswith("from typing import List")
    assert _run(program) == [2, 4]


def test_the_block_that_defines_the_entry_point_wins() -> None:
    answer = (
        "Example use:\n```python\nprint(double_all([1]))\n```\n"
        f"Solution:\n```py\n{FULL}```\n"
        "And a shell line:\n```bash\nrm -rf /tmp/x\n```\n"
    )
    program = extract_program(answer, PROMPT, "double_all")
    assert program is not None and "print(double_all" not in program
    assert _run(program) == [2, 4]


def test_unlabelled_and_unterminated_fences() -> None:
    assert _run(extract_program(f"```\n{FULL}```", PROMPT, "double_all") or "") == [2, 4]
    # Cut off by max_tokens: the last fence never closes.
    cut = f"```python\n{FULL}\n# trailing comm"
    assert _run(extract_program(cut, PROMPT, "double_all") or "") == [2, 4]


def test_bare_code_with_prose_is_trimmed_to_what_compiles() -> None:
    answer = f"Here is my solution.\n\n{FULL}\nIt uses a list comprehension, which is fast."
    program = extract_program(answer, PROMPT, "double_all")
    assert program is not None and "list comprehension" not in program
    assert _run(program) == [2, 4]


def test_completion_of_the_prompt_body_only() -> None:
    body = "    return [helper(x) for x in xs]\n\n\nprint('trailing code the model added')\n"
    program = extract_program(body, PROMPT, "double_all")
    assert program is not None
    assert program.startswith(PROMPT) and "trailing code" not in program
    assert _run(program) == [2, 4]


def test_flush_left_body_is_indented() -> None:
    program = extract_program("return [helper(x) for x in xs]", PROMPT, "double_all")
    assert program is not None and _run(program) == [2, 4]


def test_reasoning_is_dropped_before_extraction() -> None:
    answer = (
        "<think>maybe ```python\ndef double_all(xs):\n    return []\n```</think>\n"
        f"```python\n{FULL}```"
    )
    assert _run(extract_program(answer, PROMPT, "double_all") or "") == [2, 4]


@pytest.mark.parametrize("answer", ["", "   \n", "<think>only thinking</think>", "```python\n```"])
def test_no_code_gives_none(answer: str) -> None:
    assert extract_program(answer, PROMPT, "double_all") is None


def test_fenced_blocks_lists_language_and_code() -> None:
    blocks = fenced_blocks("a\n```Python\nx = 1\n```\nb\n~~~\ny = 2\n~~~\n")
    assert blocks == [("python", "x = 1\n"), ("", "y = 2\n")]


def test_strip_reasoning_handles_an_unclosed_section() -> None:
    assert strip_reasoning("<think>a</think>B") == "B"
    assert strip_reasoning("A<think>never closed") == "A"


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("  Paris.  ", "paris"),
        ('"Paris"', "paris"),
        ("**Paris**!", "paris"),
        ("`krowten`", "krowten"),
        ("New   York\n", "new york"),
        ("<think>hmm</think> Rome", "rome"),
    ],
)
def test_normalize_text(raw: str, normal: str) -> None:
    assert normalize_text(raw) == normal
