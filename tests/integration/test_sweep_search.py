"""A search on the simulated engine, through ``servesweep run``: Optuna's TPE proposes
configurations as slots free up, never a forbidden one, within its budget; a SIGKILL
and a rerun continue the same search without measuring anything twice; a trial that
can no longer win stops its benchmark (``pruned``)."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

from tests.integration.sweep_helpers import (
    background_run,
    kill_tagged,
    report_json,
    run_cli,
    tagged_processes,
    wait_for_event,
    write_sweep,
)

_SPACE = {
    "grid": {
        "budget": {"low": 0, "high": 16, "step": 4},
        "topk": [1, 2, 4],
    },
    "when": ["budget > 0 or topk == 1"],
    "exclude": [{"budget": 16, "topk": 4}],
}
_CHAT = [
    {"name": "chat", "concurrency": [1, 4], "requests": 6, "max_tokens": 16, "ignore_eos": True}
]


def _search_sweep(tmp_path: Path, name: str, search: dict[str, Any], **extra: Any) -> Path:
    return write_sweep(
        tmp_path,
        name=name,
        workloads=_CHAT,
        extra={
            "params": _SPACE,
            # the performance gate would skip configurations predicted worse than the
            # best (recorded ``skipped``, not in ``trials``, the ones still open launched
            # before the end: more trials stored than the cap) on predictions from the
            # throughput measured, which a loaded machine moves; these tests are about
            # what the search launches (tests/integration/test_predict_gate.py tests the
            # gate)
            "search": {"predict": "off", **search},
            "objective": {"maximize": "output_throughput", "workload": "chat", "concurrency": 1},
            # these tests count what the search measured: no confirm phase after it
            # (tests/integration/test_sweep_confirm.py runs one)
            "confirm": False,
            **extra,
        },
    )


def _allowed(params: dict[str, Any]) -> bool:
    budget, topk = params["budget"], params["topk"]
    return (budget > 0 or topk == 1) and not (budget == 16 and topk == 4)


def _check_trials(trials: list[dict[str, Any]]) -> None:
    prints = Counter(t["fingerprint"] for t in trials)
    assert all(n == 1 for n in prints.values()), prints
    for t in trials:
        assert _allowed(t["params"]), f"a forbidden configuration ran: {t['params']}"
        assert t["outcome"] in ("ok", "pruned", "failed"), t
        levels = Counter((r["workload"], r["level"], r["repeat"]) for r in t["results"])
        assert all(n == 1 for n in levels.values()), (t["params"], levels)


def test_tpe_search_with_a_budget_finishes_within_it(tmp_path: Path) -> None:
    sweep = _search_sweep(
        tmp_path,
        "tpe",
        {
            "strategy": "tpe",
            "trials": 40,
            "budget": {"time": "25s"},
            "seed": 3,
            "startup_trials": 3,
        },
    )
    try:
        done = run_cli("run", str(sweep), "--quiet", timeout=300)
        assert done.returncode in (0, 1), done.stdout + done.stderr
        trials = report_json(sweep)["trials"]
        assert 2 <= len(trials) < 14, len(trials)  # the time budget ended it, not the space
        _check_trials(trials)
        assert not tagged_processes("tpe", tmp_path)
    finally:
        kill_tagged("tpe", tmp_path)


def test_tpe_search_resumes_after_sigkill_without_a_duplicate(tmp_path: Path) -> None:
    sweep = _search_sweep(
        tmp_path, "tpekill", {"strategy": "tpe", "trials": 6, "seed": 5, "startup_trials": 2}
    )
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep, events=events) as proc:
            third = wait_for_event(
                events,
                lambda e: e["event"] == "trial_started" and e.get("seq", 0) >= 2,
                timeout=180,
            )
            wait_for_event(
                events,
                lambda e: (
                    e["event"] == "phase"
                    and e.get("trial") == third["trial"]
                    and e["phase"] in ("load", "ready", "bench")
                ),
            )
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        rerun = run_cli("run", str(sweep), "--quiet", timeout=300)
        assert rerun.returncode in (0, 1), rerun.stdout + rerun.stderr
        trials = report_json(sweep)["trials"]
        assert len(trials) == 6, [t["params"] for t in trials]
        _check_trials(trials)
        assert all(t["outcome"] != "running" for t in trials)
        assert not tagged_processes("tpekill", tmp_path)
    finally:
        kill_tagged("tpekill", tmp_path)


def test_a_trial_that_cannot_win_is_pruned_with_the_reason(tmp_path: Path) -> None:
    sweep = _search_sweep(
        tmp_path,
        "prune",
        # (no performance gate, see _search_sweep: it would skip, after the first trial,
        # every configuration predicted to miss the constraint)
        {"strategy": "random", "trials": 3, "seed": 1},
        constraints=["chat.c1.ttft_p99_ms < 0.001"],  # no server answers that fast
        # a level a busy machine's load generator could not time would decide nothing
        # (bench.health); this test is about the pruning itself
        include_unreliable=True,
    )
    try:
        done = run_cli("run", str(sweep), "--quiet", timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        trials = report_json(sweep)["trials"]
        assert len(trials) == 3
        for t in trials:
            assert t["outcome"] == "pruned", t
            assert "chat.c1.ttft_p99_ms" in t["failure"]["message"], t["failure"]
            # c1 was measured and kept; c4 never ran
            assert [r["level"] for r in t["results"]] == ["c1"], t["results"]
    finally:
        kill_tagged("prune", tmp_path)
