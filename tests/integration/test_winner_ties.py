"""Winners you can trust, through a real sweep: configurations of the simulated engine
that differ only in their random seed (the same true performance) are a tie, every
stored level carries intervals, and the table, CSV, JSON and ``best`` show them."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from tests.integration.sweep_helpers import kill_tagged, run_cli, write_sweep

from servesweep.sim.testing import read_truth
from servesweep.store import open_store

pytestmark = pytest.mark.integration


def test_seed_only_configs_are_a_tie_with_intervals_everywhere(tmp_path: Path) -> None:
    sweep = write_sweep(
        tmp_path,
        name="seeds",
        grid={"seed": [1, 2, 3]},
        args={"budget": 8, "topk": 4, "step-ms": 6},
        workloads=[
            {
                "name": "chat",
                "concurrency": [2],
                "requests": 16,
                "max_tokens": 24,
                "ignore_eos": True,
            }
        ],
    )
    try:
        done = run_cli("run", str(sweep), timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        # every stored level carries its intervals, computed when it was measured
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            data = store.load_sweep_data(with_samples=False)
        for results in data.results.values():
            (res,) = results
            assert res.confidence == 0.95
            lo, hi = res.intervals["output_throughput"]
            assert lo < res.metrics["output_throughput"] < hi
            lo, hi = res.intervals["ttft_p99_ms"]
            assert lo <= res.metrics["ttft_p99_ms"] <= hi
            assert "acceptance_length" in res.intervals
            # measured with ignore_eos: marked as not what real traffic gets
            assert res.info["acceptance_context"]["trusted"] is False
            assert res.info["acceptance_context"]["dataset"] == "builtin:chat"
        # the table's cells carry ± and say what it is; the acceptance cells are marked
        assert "±: half the 95% confidence interval" in done.stdout
        assert "acceptance_length measured on:" in done.stdout
        assert "chat: dataset builtin:chat, chat endpoint, ignore_eos; ? not trusted" in done.stdout
        best = run_cli("best", str(sweep), "--json")
        assert best.returncode == 0, best.stderr
        decision = json.loads(best.stdout)
        assert decision["decision"]["decided"] is False, decision["notes"]
        assert len(decision["ties"]) == 2
        assert decision["notes"][0].startswith("tie: ")
        text = run_cli("best", str(sweep)).stdout
        assert "95% interval" in text and "note: tie:" in text
        # a winner decided on a speed measured with speculative decoding on ignore_eos
        assert "(? decided with speculative decoding on an untrusted acceptance" in text
        assert decision["decision"]["acceptance_trusted"] is False
        rows = list(csv.DictReader(io.StringIO(run_cli("report", str(sweep), "--format", "csv")
                                               .stdout)))  # fmt: skip
        assert all(float(r["output_throughput_lo"]) < float(r["output_throughput"]) for r in rows)
        assert all(r["confidence"] == "0.95" for r in rows)
    finally:
        kill_tagged("seeds", tmp_path)


def test_launches_measure_a_configuration_in_separate_instances(tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    sweep = write_sweep(
        tmp_path,
        name="launches",
        grid={"budget": [4]},
        args={"truth": str(truth)},
        workloads=[
            {"name": "chat", "concurrency": [1], "requests": 8, "max_tokens": 12, "repeats": 2},
            {"name": "once", "concurrency": [1], "requests": 4, "max_tokens": 8, "launches": 1},
        ],
        extra={"launches": 2},
    )
    try:
        plan = run_cli("plan", str(sweep))
        assert "in 2 launches" in plan.stdout and "server starts: 2" in plan.stdout, plan.stdout
        done = run_cli("run", str(sweep), "--quiet", timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            data = store.load_sweep_data(with_samples=False)
        (trial,) = data.trials
        runs = sorted((r.workload, r.launch, r.repeat) for r in data.results[trial.id])
        assert runs == [
            ("chat", 0, 0), ("chat", 0, 1), ("chat", 1, 0), ("chat", 1, 1), ("once", 0, 0)
        ]  # fmt: skip
        # two instances served it, one after the other
        readies = [e for e in read_truth(truth) if e["event"] == "ready"]
        assert len({e["pid"] for e in readies}) == 2
        # the phases of both launches are counted (two loads of 0.6 s each)
        assert trial.phase_seconds["load"] >= 1.2
        from servesweep.decide.stats import aggregate_levels

        chat = next(lvl for lvl in aggregate_levels(data, trial.id) if lvl.workload == "chat")
        stats = chat.metrics["output_throughput"]
        assert stats.launches == 2 and stats.launch_sd is not None and stats.lo is not None
    finally:
        kill_tagged("launches", tmp_path)


def test_each_launch_is_warmed_until_it_stops_drifting(tmp_path: Path) -> None:
    """A fresh sim decodes 1.5x slower, warming over its first 12 requests: the
    launch's warm-up (on by default) runs windows until two agree, so the first level
    is warm."""
    sweep = write_sweep(
        tmp_path,
        name="warm",
        grid={"budget": [0]},
        args={"step-ms": 6, "cold-requests": 12, "cold-slowdown": 1.5},
        workloads=[
            {
                "name": "chat",
                "concurrency": [1],
                "requests": 6,
                "max_tokens": 16,
                "ignore_eos": True,
            },
            {"name": "fixed", "concurrency": [1], "requests": 2, "max_tokens": 4, "warmup": 1},
        ],
    )
    try:
        done = run_cli("run", str(sweep), "--quiet", timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            data = store.load_sweep_data(with_samples=False)
        (trial,) = data.trials
        chat, fixed = data.results[trial.id]
        warm = chat.info["warmup"]
        assert warm["mode"] == "auto" and warm["stable"] is True
        assert warm["requests"] >= 12  # it went on past the cold requests
        rates = [w["tokens_per_s"] for w in warm["windows"]]
        assert rates[0] < 0.85 * rates[-1]  # the first window was cold, the last warm
        assert chat.metrics["tpot_median_ms"] < 7.5  # warm: 6 ms steps, cold: 9 ms
        # a fixed warm-up runs before its level (the launch's runs only once) and says so
        assert fixed.info["warmup"]["mode"] == "fixed"
        assert fixed.info["warmup"]["requests"] == 1
    finally:
        kill_tagged("warm", tmp_path)
