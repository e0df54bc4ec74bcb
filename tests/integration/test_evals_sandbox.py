"""The sandbox with real programs: the builtin suite's references pass, wrong answers
fail, each status is reported with its reason, and runs go in parallel up to the
limit, each timed on its own.

Timing assertions compare a run with itself or with other runs (its own time, how
many overlapped), never with a fixed number of seconds: the machine may be busy."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servesweep.bench.evals import (
    CodingTask,
    Sandbox,
    SandboxLimits,
    SandboxResult,
    extract_program,
    load_suite,
)

CODING = [t for t in load_suite("builtin:coding").tasks if isinstance(t, CodingTask)]
CHECK_F = "def check(candidate):\n    assert candidate(2) == 4, 'f(2) should be 4'\n"


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    sandbox = Sandbox(SandboxLimits(timeout_s=5), backend="bwrap", parallel=4)
    yield sandbox
    sandbox.close()


async def _all(box: Sandbox, programs: list[tuple[str, CodingTask]]) -> list[SandboxResult]:
    return list(await asyncio.gather(*(box.run(p, t.test, t.entry_point) for p, t in programs)))


def test_every_builtin_reference_passes(box: Sandbox) -> None:
    programs = []
    for task in CODING:
        assert task.reference is not None
        program = extract_program(f"```python\n{task.reference}```", task.prompt, task.entry_point)
        assert program is not None
        programs.append((program, task))
    started = time.monotonic()
    results = asyncio.run(_all(box, programs))
    elapsed = time.monotonic() - started
    failed = {
        t.task_id: r.message
        for (_, t), r in zip(programs, results, strict=True)
        if r.status != "pass"
    }
    assert failed == {}
    # Four at a time: the whole suite takes less than its runs one after the other.
    assert elapsed < sum(r.seconds for r in results), f"{len(CODING)} runs took {elapsed:.1f} s"


def test_wrong_answers_fail_every_hidden_test(box: Sandbox) -> None:
    """Proof that the hidden tests can fail: a stub and an off-by-one body."""
    stubs = [(f"def {t.entry_point}(*args, **kwargs):\n    return None\n", t) for t in CODING]
    results = asyncio.run(_all(box, stubs))
    assert [r.status for r in results] == ["fail"] * len(CODING)
    assert all("AssertionError" in r.message and "test line" in r.message for r in results)


def test_body_completion_with_prompt(box: Sandbox) -> None:
    task = next(t for t in CODING if t.entry_point == "digital_root")
    body = "    while n >= 10:\n        n = sum(int(d) for d in str(n))\n    return n\n"
    program = extract_program(body, task.prompt, task.entry_point)
    assert program is not None
    assert asyncio.run(box.run(program, task.test, task.entry_point)).status == "pass"
    wrong = extract_program("    return n % 9\n", task.prompt, task.entry_point)
    assert wrong is not None
    result = asyncio.run(box.run(wrong, task.test, task.entry_point))
    assert result.status == "fail" and "assert candidate(" in result.message


@pytest.mark.parametrize(
    ("program", "status", "words"),
    [
        ("def f(x):\n    return x * 2\n", "pass", ""),
        ("def f(x):\n    return x + 3\n", "fail", "f(2) should be 4 (at test line 2"),
        ("def f(x):\n    return x +\n", "fail", "SyntaxError"),
        ("def f(x):\n    return undefined_name\n", "fail", "NameError"),
        ("def g(x):\n    return 4\n", "fail", "defines no function 'f'"),
        ("import sys\nsys.exit(3)\n", "crash", "exited with 3"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "crash", "SIGSEGV"),
        ("x = ' ' * (2 ** 33)\n", "resource_limit", "out of memory"),
        ("open('big', 'wb').write(b'0' * (32 << 20))\n", "resource_limit", "File too large"),
        ("fs = [open('/dev/null') for _ in range(1000)]\n", "resource_limit", "Too many open"),
        ("def f(x):\n    return f(x)\n", "fail", "RecursionError"),
        # A demo block of the answer does not run (it would wait on stdin).
        ("def f(x):\n    return 4\nif __name__ == '__main__':\n    f(input())\n", "pass", ""),
    ],
)
def test_statuses_and_messages(box: Sandbox, program: str, status: str, words: str) -> None:
    result = asyncio.run(box.run(program, CHECK_F, "f"))
    assert result.status == status, (result.message, result.stderr[-300:])
    assert words in result.message


def test_cpu_limit_before_the_wall_clock() -> None:
    """One CPU second ends the program, long before the (generous) wall clock: on
    a busy machine a CPU second may take several seconds of wall clock."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    box = Sandbox(SandboxLimits(timeout_s=120, cpu_seconds=1), backend="bwrap")
    try:
        result = asyncio.run(box.run("while True:\n    pass\n", CHECK_F, "f"))
    finally:
        box.close()
    assert result.status == "resource_limit" and "CPU time limit (1 s)" in result.message
    assert result.seconds < 120


@pytest.fixture(scope="module", params=["bwrap", "unshare"])
def walled(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """A sandbox of each backend that hides the host (the unshare one: root only)."""
    backend = request.param
    if shutil.which(backend) is None:
        pytest.skip(f"{backend} is not installed")
    if backend == "unshare" and os.geteuid() != 0:
        pytest.skip("the unshare backend needs root")
    sandbox = Sandbox(SandboxLimits(timeout_s=5), backend=backend)
    yield sandbox
    sandbox.close()


def test_environment_workdir_and_network_inside(walled: Sandbox) -> None:
    probe = (
        "import ctypes, os, socket\n"
        "def f(x):\n"
        "    allowed = {'PATH', 'HOME', 'TMPDIR', 'LANG', 'PWD'}\n"
        "    assert set(os.environ) <= allowed, dict(os.environ)\n"
        "    assert os.getcwd() == os.environ['HOME'], os.getcwd()\n"
        "    assert os.listdir('.') == [], os.listdir('.')\n"
        "    open('mine.txt', 'w').write('x')\n"
        "    assert [n for _, n in socket.if_nameindex()] == ['lo']\n"
        "    assert os.getuid() != 0 and os.geteuid() != 0\n"
        "    for place in ('/', '/dev', '/dev/shm', '/sandbox', '/usr', '/var/tmp', '/run'):\n"
        "        try:\n"
        "            open(place + '/x', 'w')\n"
        "        except OSError:\n"
        "            continue\n"
        "        raise AssertionError(place + ' is writable')\n"
        "    assert ctypes.CDLL(None).unshare(0x10000000) == -1, 'made a user namespace'\n"
        "    mine = ''.join(open('/sandbox/' + n).read() for n in os.listdir('/sandbox'))\n"
        "    assert 'should be' + ' 4' not in mine, 'the hidden test is readable'\n"
        "    seen = set(os.listdir('/'))\n"
        "    assert not seen & FORBIDDEN, seen\n"
        "    assert os.listdir('/etc') == ['ld.so.cache'], os.listdir('/etc')\n"
        "    return 4\n"
    )
    # Nothing of the host but the interpreter's own folders (a pyenv's parents, empty).
    forbidden = {"home", "root", "var", "run", "work", "opt", "srv"} - {
        Path(walled.python).parts[1]
    }
    probe = probe.replace("FORBIDDEN", repr(forbidden))
    # Twice: the second run starts in an empty directory again (the first was deleted).
    for _ in range(2):
        result = asyncio.run(walled.run(probe, CHECK_F, "f"))
        assert result.status == "pass", result.message


def test_output_is_captured_and_capped(box: Sandbox) -> None:
    result = asyncio.run(box.run("print('hello from the candidate')\nf = abs\n", CHECK_F, "f"))
    assert result.status == "fail" and "hello from the candidate" in result.stdout


SLEEPER = (
    "import time\n"
    "began = time.monotonic()\n"  # one clock for the host and every sandbox
    "time.sleep(1)\n"
    "print(began, time.monotonic())\n"
    "def f(x):\n"
    "    return 4\n"
)


def _intervals(results: list[SandboxResult]) -> list[tuple[float, float]]:
    return [(float(a), float(b)) for a, b in (r.stdout.split() for r in results)]


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_runs_go_in_parallel_up_to_the_limit() -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    box = Sandbox(SandboxLimits(timeout_s=60), backend="bwrap", parallel=4)
    try:
        asyncio.run(box.start())
        results = asyncio.run(_gather(box, SLEEPER, 8))
    finally:
        box.close()
    assert [r.status for r in results] == ["pass"] * 8, [r.message for r in results]
    # Each program's one-second sleep, as it saw it: never more than 4 at once, and
    # sleeping needs no CPU, so several overlap even on a busy machine.
    assert 2 <= _most_at_once(_intervals(results)) <= 4


def test_a_runs_seconds_are_its_own_not_its_time_in_the_queue() -> None:
    """One run at a time: three runs submitted together wait for each other, but
    each reports only its own time (its one-second sleep and the sandbox's start)."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    box = Sandbox(SandboxLimits(timeout_s=60), backend="bwrap", parallel=1)
    try:
        asyncio.run(box.start())
        started = time.monotonic()
        results = asyncio.run(_gather(box, SLEEPER, 3))
        elapsed = time.monotonic() - started
    finally:
        box.close()
    assert [r.status for r in results] == ["pass"] * 3, [r.message for r in results]
    assert _most_at_once(_intervals(results)) == 1
    for result, (began, ended) in zip(results, _intervals(results), strict=True):
        assert result.seconds >= ended - began >= 1.0
    # Queued time counted in would make the runs add up to about 1 + 2 + 3 seconds.
    assert sum(r.seconds for r in results) <= elapsed


async def _gather(box: Sandbox, program: str, count: int) -> list[SandboxResult]:
    return list(await asyncio.gather(*(box.run(program, CHECK_F, "f") for _ in range(count))))
