"""The judge and the candidate's side, in one process over two pipes (no sandbox):
HumanEval and MBPP style tests keep their meaning when every call of the answer
crosses as plain data, and only the judge decides."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import IO

import pytest

from servesweep.bench.evals import sandboxed_candidate, wire
from servesweep.bench.evals.sandboxed_judge import Link, judge

LIMITS = {"memory_bytes": 1 << 30}


def _check(
    program: str,
    test: str,
    entry: str = "f",
    prompt: str = "",
    candidate: Callable[[str, IO[bytes], IO[bytes]], None] = sandboxed_candidate.run,
) -> dict[str, str]:
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    requests, replies = os.fdopen(requests_r, "rb"), os.fdopen(replies_w, "wb")

    def serve() -> None:
        with requests, replies:
            candidate(program, requests, replies)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    to_candidate, answers = os.fdopen(requests_w, "wb"), os.fdopen(replies_r, "rb")
    try:
        verdict = judge(
            {"test": test, "prompt": prompt, "entry_point": entry, "limits": LIMITS},
            Link(to_candidate, answers),
        )
    finally:
        answers.close()
        with contextlib.suppress(BrokenPipeError):  # what a candidate that left did not read
            to_candidate.close()
    thread.join(timeout=10)
    assert not thread.is_alive()
    return verdict


PROMPT_POLY = '''import math


def poly(xs: list, x: float):
    return sum(coeff * math.pow(x, i) for i, coeff in enumerate(xs))


def find_zero(xs: list):
    """Find x such that poly(xs, x) = 0."""
'''
TEST_POLY = """
def check(candidate):
    for coeffs in ([1, 2], [-6, 11, -6, 1]):
        solution = candidate(list(coeffs))
        assert math.fabs(poly(coeffs, solution)) < 1e-4
"""
BISECT = """
    lo, hi = -1000.0, 1000.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if (poly(xs, lo) > 0) == (poly(xs, mid) > 0):
            lo = mid
        else:
            hi = mid
    return lo
"""


def test_humaneval_tests_use_the_prompts_own_helpers() -> None:
    assert _check(PROMPT_POLY + BISECT, TEST_POLY, "find_zero", PROMPT_POLY)["status"] == "pass"


def test_an_answer_cannot_redefine_a_helper_the_tests_rely_on() -> None:
    """HumanEval/32 checks poly(coeffs, answer) == 0: an answer that redefines
    poly to return 0 fooled the old in-process tests, not the judge's own poly."""
    cheat = PROMPT_POLY + "    return 12345.0\n\n\ndef poly(xs, x):\n    return 0\n"
    verdict = _check(cheat, TEST_POLY, "find_zero", PROMPT_POLY)
    assert verdict["status"] == "fail" and "poly(coeffs, solution)" in verdict["message"]


def test_mbpp_tests_name_the_function_and_its_modules() -> None:
    program = "import math\n\ndef area(r):\n    return math.pi * r * r\n"
    test = (
        "def check(candidate):\n"
        "    assert math.isclose(area(1), 3.14159, rel_tol=1e-3)\n"
        "    assert area(0) == 0\n"
    )
    assert _check(program, test, "area")["status"] == "pass"
    wrong = program.replace("r * r", "2 * r")
    assert _check(wrong, test, "area")["status"] == "fail"


def test_data_of_the_answer_is_read_as_plain_data() -> None:
    program = "TABLE = {'a': (1, 2)}\n\ndef f():\n    return TABLE\n"
    test = "def check(candidate):\n    assert candidate() == TABLE == {'a': (1, 2)}\n"
    assert _check(program, test)["status"] == "pass"


def test_types_keep_their_meaning() -> None:
    test = "def check(candidate):\n    assert candidate() == (1, 2)\n"
    assert _check("def f():\n    return (1, 2)\n", test)["status"] == "pass"
    assert _check("def f():\n    return [1, 2]\n", test)["status"] == "fail"
    test_bool = "def check(candidate):\n    assert candidate() is True\n"
    assert _check("def f():\n    return True\n", test_bool)["status"] == "pass"
    assert _check("def f():\n    return 1\n", test_bool)["status"] == "fail"


def test_a_call_that_mutates_its_argument_mutates_the_tests_value() -> None:
    program = "def f(xs, seen):\n    xs.sort()\n    seen['n'] = len(xs)\n"
    test = (
        "def check(candidate):\n"
        "    xs, seen = [3, 1, 2], {}\n"
        "    assert candidate(xs, seen=seen) is None\n"
        "    assert xs == [1, 2, 3] and seen == {'n': 3}\n"
    )
    assert _check(program, test)["status"] == "pass"


NODE = (
    "class Node:\n"
    "    def __init__(self, data):\n"
    "        self.data = data\n"
    "        self.left = None\n"
    "        self.right = None\n\n"
)


def test_objects_of_the_answers_own_classes_stay_in_its_process() -> None:
    """MBPP's tree tasks build their input with the answer's own Node class in
    test_setup_code, then pass it to the function."""
    program = NODE + (
        "def height(node):\n"
        "    return 0 if node is None else 1 + max(height(node.left), height(node.right))\n"
        "class Pair:\n"
        "    def __init__(self, a, b):\n"
        "        self.a, self.b = a, b\n"
        "    def span(self):\n"
        "        return self.b - self.a\n"
    )
    test = (
        "def check(candidate):\n"
        "    root = Node(1)\n"
        "    root.left = Node(2)\n"
        "    root.left.left = Node(3)\n"
        "    assert height(root) == 3 and root.left.data == 2\n"
        "    assert root.left is root.left and root.left != root\n"
        "    assert [p.span() for p in [Pair(1, 5), Pair(2, 3)]] == [4, 1]\n"
    )
    assert _check(program, test, "height")["status"] == "pass"


def test_builtin_types_cross_as_arguments() -> None:
    program = "def drop(items, kind):\n    return [x for x in items if not isinstance(x, kind)]\n"
    test = "def check(candidate):\n    assert candidate((4, 7.7, 'a'), int) == [7.7, 'a']\n"
    assert _check(program, test, "drop")["status"] == "pass"


def test_an_object_of_its_own_is_never_a_value() -> None:
    """A class instance the tests made compares equal only to itself; a function
    that returns one does not answer with data at all."""
    cheat = "class attack:\n    def __eq__(self, other):\n        return True\n"
    test = "def check(candidate):\n    assert candidate() == 'secret'\n"
    assert _check(cheat, test, "attack")["status"] == "fail"
    returns = NODE + "def attack():\n    return Node(1)\n"
    verdict = _check(returns, test, "attack")
    assert verdict["status"] == "fail" and "value of type Node" in verdict["message"]


def test_an_expected_exception_is_caught_by_the_test() -> None:
    program = "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n"
    test = (
        "def check(candidate):\n"
        "    try:\n"
        "        candidate(-1)\n"
        "    except ValueError as exc:\n"
        "        assert str(exc) == 'negative'\n"
        "    else:\n"
        "        raise AssertionError('no ValueError')\n"
    )
    assert _check(program, test)["status"] == "pass"


@pytest.mark.parametrize(
    ("program", "status", "words"),
    [
        ("def f(x):\n    return x + 3\n", "fail", "f(2) should be 4 (at test line 2"),
        ("def f(x):\n    return undefined\n", "fail", "NameError: name 'undefined' is not"),
        ("def f(x):\n    return [][1]\n", "fail", "(at candidate line 2: return [][1])"),
        ("def f(x):\n    return x +\n", "fail", "SyntaxError"),
        ("def g(x):\n    return 4\n", "fail", "defines no function 'f'"),
        ("import sys\nsys.exit(3)\n", "crash", "exited with 3 before the tests finished"),
        ("import sys\ndef f(x):\n    sys.exit(0)\n", "crash", "exited with 0"),
        ("def f(x):\n    raise MemoryError\n", "resource_limit", "out of memory"),
        ("def f(x):\n    open('/nonexistent/x')\n", "fail", "FileNotFoundError: [Errno 2]"),
        ("def f(x):\n    return lambda: 4\n", "fail", "returned a value of type function"),
        ("def f(x):\n    return f(x)\n", "fail", "RecursionError"),
    ],
)
def test_statuses_and_messages(program: str, status: str, words: str) -> None:
    verdict = _check(
        program, "def check(candidate):\n    assert candidate(2) == 4, 'f(2) should be 4'\n"
    )
    assert verdict["status"] == status, verdict
    assert words in verdict["message"]


def test_a_test_cannot_swallow_an_answer_that_is_not_data() -> None:
    program = (
        "class Anything:\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "def f():\n"
        "    return Anything()\n"
    )
    test = (
        "def check(candidate):\n"
        "    try:\n"
        "        candidate()\n"
        "    except Exception:\n"
        "        pass\n"
    )
    verdict = _check(program, test)
    assert verdict["status"] == "fail" and "not plain data" in verdict["message"]


def _garbage(source: str, requests: IO[bytes], replies: IO[bytes]) -> None:
    replies.write(b'{"status": "pass"}\n')
    replies.flush()


def _greets_then_lies(source: str, requests: IO[bytes], replies: IO[bytes]) -> None:
    wire.send(replies, {"hello": {"names": {"f": "callable"}}})
    wire.receive(requests)
    replies.write(b"PASS\n")
    replies.flush()


def _greets_then_leaves(source: str, requests: IO[bytes], replies: IO[bytes]) -> None:
    wire.send(replies, {"hello": {"names": {"f": "callable"}}})


@pytest.mark.parametrize(
    ("candidate", "words"),
    [
        (_garbage, "not a greeting"),
        (_greets_then_lies, "not a reply"),
        (_greets_then_leaves, "ended before answering"),
    ],
)
def test_a_candidate_that_breaks_the_protocol_is_gone(
    candidate: Callable[[str, IO[bytes], IO[bytes]], None], words: str
) -> None:
    verdict = _check(
        "", "def check(candidate):\n    assert candidate() == 1\n", candidate=candidate
    )
    assert verdict["status"] == "gone" and words in verdict["message"]
