"""Evals end to end against the simulated engine: its correctness oracle answers
each builtin task right with a set probability, and the pass rate measured through
run_eval_workload (requests, extraction, sandbox) equals the oracle's prediction."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servesweep.bench.evals import load_suite, run_eval_workload
from servesweep.bench.target import Target
from servesweep.errors import DatasetError
from servesweep.sim.oracle import oracle_correct
from servesweep.sim.testing import SimRun, free_port, running_sim
from servesweep.spec.schema import EvalSpec, workload_spec

SEED = 3
RATE = 0.6
FAST = ["--load-time", "0", "--ttft-ms", "1", "--step-ms", "0.05", "--batch-slowdown", "0"]


@pytest.fixture(scope="module")
def bwrap() -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")


def _sim(tmp_path: Path, *extra: str) -> Iterator[SimRun]:
    args = [*FAST, "--seed", str(SEED), "--correct-rate", str(RATE), *extra]
    with running_sim(args, tmp_path) as sim:
        sim.wait_ready()
        yield sim


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimRun]:
    yield from _sim(tmp_path)


def _target(sim: SimRun) -> Target:
    return Target(base_url=f"http://127.0.0.1:{sim.port}", model="sim-model", timeout_s=30)


def _expected(suite: str, samples: int, limit: int | None = None) -> dict[str, int]:
    tasks = load_suite(suite).tasks[:limit] if limit else load_suite(suite).tasks
    return {
        t.task_id: sum(oracle_correct(SEED, t.task_id, s, RATE) for s in range(samples))
        for t in tasks
    }


def test_coding_pass_rate_equals_the_oracle(sim: SimRun, bwrap: None) -> None:
    workload = workload_spec(
        name="coding", eval=EvalSpec(suite="builtin:coding", samples=2, parallel=4)
    )
    started = time.monotonic()
    result = asyncio.run(run_eval_workload(_target(sim), workload))
    elapsed = time.monotonic() - started
    expected = _expected("builtin:coding", 2)
    total = 2 * len(expected)
    assert result.metrics["total"] == total
    assert result.metrics["passed"] == sum(expected.values())
    assert result.metrics["pass_rate"] == pytest.approx(sum(expected.values()) / total)
    # Per task too: the oracle counts the samples of each task in arrival order.
    per_task = {k: v["passed"] for k, v in result.info["per_task"].items()}
    assert per_task == expected
    # Wrong answers (the oracle's NotImplementedError stub) fail, they do not crash.
    assert set(result.info["status_counts"]) <= {"pass", "fail"}
    assert 0 < result.metrics["pass_rate"] < 1
    assert result.workload == "coding" and result.level == "eval"
    assert len(result.eval_results) == total
    assert result.info["sandbox"] == "bwrap"
    assert result.info["sandbox_nested_userns"] == "blocked"
    assert result.info["sandbox_memory_limit"] in {"cgroup v1", "cgroup v2", "watch"}
    memory_warnings = [w for w in result.warnings if "memory limit is only watched" in w]
    assert bool(memory_warnings) == (result.info["sandbox_memory_limit"] == "watch")
    # Requests and checks went four at a time: less than one after the other.
    assert elapsed < sum(r.seconds for r in result.eval_results), f"{total} took {elapsed:.1f} s"


def test_task_seconds_are_their_own_in_a_queued_workload(sim: SimRun, bwrap: None) -> None:
    """One request and one check at a time: each task's seconds are its own request
    and sandbox run, not the time it waited behind the others (which would add up to
    about n²/2 runs)."""
    workload = workload_spec(
        name="queued", eval=EvalSpec(suite="builtin:coding", limit=8, parallel=1)
    )
    started = time.monotonic()
    result = asyncio.run(run_eval_workload(_target(sim), workload))
    elapsed = time.monotonic() - started
    seconds = [r.seconds for r in result.eval_results]
    assert len(seconds) == 8 and all(s > 0 for s in seconds)
    # A request may overlap another task's check, never another request or check.
    assert sum(seconds) <= 2 * elapsed, (seconds, elapsed)


def test_text_pass_rate_equals_the_oracle(sim: SimRun) -> None:
    workload = workload_spec(name="facts", eval=EvalSpec(suite="builtin:text", samples=3))
    result = asyncio.run(run_eval_workload(_target(sim), workload))
    expected = _expected("builtin:text", 3)
    assert {k: v["passed"] for k, v in result.info["per_task"].items()} == expected
    assert result.metrics["passed"] == sum(expected.values())
    assert result.info["sandbox"] == "not used"


def test_the_host_filesystem_opt_in_is_recorded_and_warned(sim: SimRun) -> None:
    """``sandbox: host-filesystem`` runs generated code without namespaces: every
    result says so (its info and a warning, which the report shows)."""
    if os.geteuid() != 0:
        pytest.skip("the none backend runs generated code as a fresh uid only as root")
    spec = EvalSpec(suite="builtin:coding", limit=2, sandbox="host-filesystem")
    result = asyncio.run(run_eval_workload(_target(sim), workload_spec(name="c", eval=spec)))
    assert result.metrics["total"] == 2
    assert result.info["sandbox"] == "none"
    assert result.info["sandbox_setting"] == "host-filesystem"
    assert any("host's filesystem" in w and "bubblewrap" in w for w in result.warnings)


def test_limit_and_the_completions_endpoint(sim: SimRun, bwrap: None) -> None:
    workload = workload_spec(
        name="coding5",
        endpoint="completions",
        eval=EvalSpec(suite="builtin:coding", limit=5, parallel=2),
    )
    result = asyncio.run(run_eval_workload(_target(sim), workload))
    expected = _expected("builtin:coding", 1, limit=5)
    assert result.metrics["total"] == 5
    assert {k: v["passed"] for k, v in result.info["per_task"].items()} == expected


def test_a_user_suite_file(sim: SimRun, tmp_path: Path, bwrap: None) -> None:
    """A HumanEval-style file the sim does not know: its answers are ordinary text,
    no code, so every task is reported as no_answer (or fail), never pass."""
    path = tmp_path / "mine.jsonl"
    row = {
        "task_id": "mine/0",
        "prompt": 'def triple(x):\n    """Return 3 * x."""\n',
        "entry_point": "triple",
        "test": "def check(candidate):\n    assert candidate(2) == 6\n",
    }
    path.write_text(json.dumps(row) + "\n")
    workload = workload_spec(name="mine", eval=EvalSpec(suite="mine.jsonl"))
    result = asyncio.run(run_eval_workload(_target(sim), workload, base_dir=str(tmp_path)))
    assert result.metrics == {
        "pass_rate": 0.0,
        "passed": 0.0,
        "total": 1.0,
        "errors": 0.0,
        "error_rate": 0.0,
    }


def test_server_down_is_data_not_a_crash(bwrap: None) -> None:
    target = Target(base_url=f"http://127.0.0.1:{free_port()}", model="m", timeout_s=5)
    workload = workload_spec(name="coding", eval=EvalSpec(suite="builtin:coding", limit=3))
    result = asyncio.run(run_eval_workload(target, workload))
    assert result.metrics["errors"] == 3 and result.metrics["pass_rate"] == 0.0
    assert {r.status for r in result.eval_results} == {"error"}
    assert result.warnings and "3 of 3 eval requests failed" in result.warnings[0]


def test_bad_suite_file_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task_id": "a", "prompt": "p", "kind": "exact", "answer": "x"}\n{oops\n')
    target = Target(base_url="http://127.0.0.1:9", model="m")
    workload = workload_spec(name="bad", eval=EvalSpec(suite=str(path)))
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: not a JSON object"):
        asyncio.run(run_eval_workload(target, workload))
