"""Whole-pipeline sweeps: correctness evals flowing from the engine through the
sandbox, the store and a constraint into `best` (the quickstart is in
test_report_quickstart.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from tests.integration.sweep_helpers import kill_tagged, report_json, run_cli, write_sweep

from servesweep.sim.oracle import oracle_correct

ROOT = Path(__file__).parents[2]


def test_eval_pass_rate_flows_into_constraint_and_best(tmp_path: Path) -> None:
    limit = 10
    sweep_file = write_sweep(
        tmp_path,
        name="evals",
        grid={"correct-rate": [0.3, 0.9], "budget": [2, 8]},
        workloads=[
            {
                "name": "chat",
                "concurrency": [1],
                "requests": 6,
                "max_tokens": 16,
                "ignore_eos": True,
            },
            {"name": "coding", "eval": {"suite": "builtin:coding", "limit": limit, "samples": 1}},
        ],
        extra={
            "objective": {"maximize": "output_throughput", "workload": "chat", "concurrency": 1},
            "constraints": ["coding.pass_rate >= 0.8"],
        },
    )
    try:
        done = run_cli("run", str(sweep_file), "--quiet", timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        tasks = [
            json.loads(line)["task_id"]
            for line in (ROOT / "src/servesweep/bench/evals/data/coding.jsonl")
            .read_text()
            .splitlines()
            if line.strip()
        ][:limit]
        data = report_json(sweep_file)
        for trial in data["trials"]:
            rate = trial["params"]["correct-rate"]
            expected = sum(oracle_correct(0, t, 0, rate) for t in tasks) / limit
            (coding,) = [r for r in trial["results"] if r["workload"] == "coding"]
            assert coding["metrics"]["pass_rate"] == expected, trial["params"]
            assert len(coding["eval_results"]) == limit
        best = run_cli("best", str(sweep_file), "--json")
        assert best.returncode == 0, best.stderr
        winner = json.loads(best.stdout)
        text = json.dumps(winner)
        assert '"correct-rate": 0.9' in text
        # the fast-but-wrong configurations were excluded by the constraint
        assert "coding.pass_rate >= 0.8" in text
        strict = run_cli("best", str(sweep_file), "--constraint", "coding.pass_rate >= 1.01")
        assert strict.returncode == 1
        assert "no feasible configuration" in strict.stdout
    finally:
        kill_tagged("evals", tmp_path)


def test_sweep_file_template_is_copied_safely(tmp_path: Path) -> None:
    # the examples are valid sweep files for `plan`
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        shutil.copy(example, tmp_path / example.name)
        done = run_cli("plan", str(tmp_path / example.name))
        assert done.returncode == 0, (example.name, done.stderr)
        assert yaml.safe_load(example.read_text())["name"] in done.stdout


def test_failures_during_the_benchmark_are_classified(tmp_path: Path) -> None:
    sweep_file = write_sweep(
        tmp_path,
        name="benchfail",
        grid={},
        # no launch warm-up: the engine's three requests belong to the measured level
        workloads=[
            {
                "name": "chat",
                "concurrency": [1, 4],
                "requests": 8,
                "max_tokens": 16,
                "ignore_eos": True,
                "warmup": 0,
            }
        ],
        extra={
            "params": {
                "points": [
                    {"crash-after": 3},  # the engine dies mid-workload
                    {"error-rate": 0.5},  # alive, but half the requests fail
                    {"budget": 4},  # fine
                ]
            }
        },
    )
    try:
        done = run_cli("run", str(sweep_file), "--quiet", timeout=180)
        assert done.returncode == 1, done.stdout + done.stderr
        rows = report_json(sweep_file)["trials"]
        assert [r["failure_class"] for r in rows] == ["bench_crash", "bench_errors", None]
        assert rows[2]["outcome"] == "ok"
        crash = rows[0]["failure"]
        assert crash["exit_code"] is not None or crash["signal"] is not None
        assert crash["log_path"]
        # the requests that completed before the engine died are kept
        (first,) = [r for r in rows[0]["results"] if r["level"] == "c1"]
        assert first["metrics"]["error_rate"] < 1.0, first["metrics"]
        errors = rows[1]["failure"]
        assert "of requests failed" in errors["message"]
        # what was measured before the failure is kept
        assert rows[1]["results"], "the failing workload's results are stored"
    finally:
        kill_tagged("benchfail", tmp_path)
