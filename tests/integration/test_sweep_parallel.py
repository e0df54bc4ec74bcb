"""Parallel slots on one machine: several servers at once on disjoint GPU sets.

The simulated engine on eight fake 80 GiB GPUs takes 60 GiB of each GPU it is given,
so two instances on one GPU cannot both start (the second dies of OOM), and
``--tensor-parallel-size N`` refuses to start unless it sees exactly N GPUs: a trial
that gets the wrong GPUs fails, physically.
"""

from __future__ import annotations

import itertools
import signal
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

from servesweep.sim.testing import free_port_block
from servesweep.store import open_store

# 8 trials of 1 GPU, 4 of 2, 2 of 4: 14 trials, 24 GPU-trials on 8 GPUs (three waves)
_PARAMS = {
    "grid": {"tensor-parallel-size": [1, 2, 4], "budget": [0, 1, 2, 3, 4, 5, 6, 7]},
    "when": [
        "tensor_parallel_size == 1 or (tensor_parallel_size == 2 and budget <= 3) "
        "or (tensor_parallel_size == 4 and budget <= 1)"
    ],
}
# no launch warm-up: with 40 ms steps it would triple each trial's benchmark time here
_CHAT = [
    {
        "name": "chat",
        "concurrency": [1],
        "requests": 4,
        "max_tokens": 16,
        "ignore_eos": True,
        "warmup": 0,
    }
]


def _sweep(directory: Path, name: str, **extra: Any) -> Path:
    server = {
        "port": free_port_block(8),  # slot k listens on port + k
        "fake_gpus": {"count": 8, "memory": "80GiB"},
        "gpus": list(range(8)),
        "gpus_per_trial": "{param.tensor-parallel-size}",
        "timeouts": {"stop": "5s", "release": "30s", "ready": "60s"},
        **extra.pop("server", {}),
    }
    path = write_sweep(
        directory,
        name=name,
        # decode steps long enough that CPU contention on a small machine stays noise;
        # a load long against the CPU work, as with real engines
        args={"load-time": 6.0, "release-delay": 0.5, "step-ms": 40, **extra.pop("args", {})},
        workloads=_CHAT,
        server_extra=server,
        extra={"params": extra.pop("params", _PARAMS), **extra},
    )
    return path


def _busy_intervals(trials: list[dict[str, Any]]) -> list[tuple[float, float, set[int], int]]:
    """(from the start phase to the end of the trial, GPUs, trial) of each trial."""
    out = []
    for t in trials:
        begin = t["phase_started"].get("start") or t["started_at"]
        out.append((begin, t["finished_at"], set(t["gpus"]), t["id"]))
    return out


def _no_shared_gpu(trials: list[dict[str, Any]]) -> None:
    for (b1, e1, g1, t1), (b2, e2, g2, t2) in itertools.combinations(_busy_intervals(trials), 2):
        if b1 < e2 and b2 < e1:
            assert not g1 & g2, f"trials {t1} and {t2} ran at once on GPUs {g1 & g2}"


def test_parallel_sweep_packs_disjoint_gpus_and_matches_sequential(tmp_path: Path) -> None:
    par_dir, seq_dir = tmp_path / "par", tmp_path / "seq"
    par_dir.mkdir()
    seq_dir.mkdir()
    par = _sweep(par_dir, "par")
    seq = _sweep(seq_dir, "seq")
    try:
        done = run_cli("run", str(par), "--quiet", timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        done = run_cli("run", str(seq), "--quiet", "--slots", "1", timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr

        par_trials = report_json(par)["trials"]
        seq_trials = report_json(seq)["trials"]
        assert len(par_trials) == 14
        assert all(t["outcome"] == "ok" for t in par_trials), par_trials
        for t in par_trials:
            assert len(t["gpus"]) == t["params"]["tensor-parallel-size"], t
        _no_shared_gpu(par_trials)
        with open_store(par_dir / "servesweep.db", readonly=True) as store:
            stored = store.trials(1)
        assert len({t.slot for t in stored}) >= 4, "trials ran in several slots at once"
        assert {tuple(t.gpus) for t in stored} == {tuple(t["gpus"]) for t in par_trials}
        # the same trials measure the same, within noise
        seq_by = {str(sorted(t["params"].items())): t for t in seq_trials}
        for t in par_trials:
            other = seq_by[str(sorted(t["params"].items()))]
            a = _metric(t, "tpot_median_ms")
            b = _metric(other, "tpot_median_ms")
            assert abs(a - b) <= max(0.3 * b, 4.0), (t["params"], a, b)
        # the sweeps' makespans: first trial's start to last trial's end
        parallel_s, sequential_s = _makespan(par_trials), _makespan(seq_trials)
        assert sequential_s >= 3 * parallel_s, (sequential_s, parallel_s)
    finally:
        kill_tagged("par", tmp_path)
        kill_tagged("seq", tmp_path)


def _makespan(trials: list[dict[str, Any]]) -> float:
    return float(max(t["finished_at"] for t in trials) - min(t["started_at"] for t in trials))


def _metric(trial: dict[str, Any], name: str) -> float:
    (level,) = [r for r in trial["results"] if r["level"] == "c1"]
    return float(level["metrics"][name])


def test_sigkill_during_a_parallel_run_then_rerun(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, "pkill")
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep, events=events) as proc:
            # several slots are busy: kill while a 2-GPU trial loads
            started = wait_for_event(
                events,
                lambda e: e["event"] == "trial_started" and len(e.get("gpus", [])) == 2,
                timeout=180,
            )
            wait_for_event(
                events,
                lambda e: (
                    e["event"] == "phase"
                    and e.get("trial") == started["trial"]
                    and e["phase"] == "load"
                ),
                timeout=120,
            )
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        assert tagged_processes("pkill", tmp_path), "the killed run left servers behind"
        rerun = run_cli("run", str(sweep), "--quiet", timeout=600)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        trials = report_json(sweep)["trials"]
        assert len(trials) == 14 and all(t["outcome"] == "ok" for t in trials)
        for t in trials:
            levels = [(r["workload"], r["level"], r["repeat"]) for r in t["results"]]
            assert levels == [("chat", "c1", 0)], t
        assert not tagged_processes("pkill", tmp_path)
    finally:
        kill_tagged("pkill", tmp_path)


def test_an_oom_in_one_slot_does_not_disturb_the_others(tmp_path: Path) -> None:
    params = {
        "points": [
            {"tensor-parallel-size": 1, "budget": 0},
            {"tensor-parallel-size": 1, "budget": 1, "mem-per-gpu": "90GiB"},
            {"tensor-parallel-size": 1, "budget": 2},
            {"tensor-parallel-size": 1, "budget": 3},
        ]
    }
    sweep = _sweep(tmp_path, "poom", params=params)
    try:
        done = run_cli("run", str(sweep), "--quiet", timeout=300)
        assert done.returncode == 1, done.stdout + done.stderr
        trials = {t["params"]["budget"]: t for t in report_json(sweep)["trials"]}
        assert trials[1]["outcome"] == "failed"
        assert trials[1]["failure_class"] == "start_crash"
        assert trials[1]["failure"]["reason"] == "oom"
        for budget in (0, 2, 3):
            assert trials[budget]["outcome"] == "ok", trials[budget]["failure"]
        _no_shared_gpu(list(trials.values()))
        assert not tagged_processes("poom", tmp_path)
    finally:
        kill_tagged("poom", tmp_path)


def test_ctrl_c_stops_every_running_server(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, "pint")
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep, events=events) as proc:
            # two 4-GPU trials load side by side
            for trial in (13, 14):
                wait_for_event(
                    events,
                    lambda e, t=trial: (
                        e["event"] == "phase" and e.get("trial") == t and e["phase"] == "load"
                    ),
                    timeout=120,
                )
            assert len(tagged_processes("pint", tmp_path)) >= 2
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 130, out + err
        assert not tagged_processes("pint", tmp_path), "a server outlived the interrupt"
        trials = {t["id"]: t for t in report_json(sweep)["trials"]}
        assert trials[13]["outcome"] == trials[14]["outcome"] == "interrupted"
        assert all(t["outcome"] in ("pending", "interrupted") for t in trials.values())
    finally:
        kill_tagged("pint", tmp_path)


def test_a_slot_port_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    import socket

    sweep = _sweep(tmp_path, "pport")
    import yaml

    base = yaml.safe_load(sweep.read_text())["server"]["port"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base + 3))
        busy.listen()
        done = run_cli("run", str(sweep), "--quiet", timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.strip()
    assert f"slot 3 would listen on port {base + 3}, which is in use" in line, line
    assert "Traceback" not in line
    assert not tagged_processes("pport", tmp_path)
    with open_store(tmp_path / "servesweep.db", readonly=True) as store:
        assert all(t.started_at is None for t in store.trials(1)), "nothing was started"


def test_a_configuration_larger_than_every_machine_is_skipped_with_its_reason(
    tmp_path: Path,
) -> None:
    """``tensor-parallel-size: 4`` on a machine of 2 GPUs: that configuration is
    skipped with the reason, the others run (the sweep is not refused)."""
    sweep_file = write_sweep(
        tmp_path,
        name="toobig",
        grid={"tensor-parallel-size": [1, 4, 2]},
        args={"mem-per-gpu": "10GiB"},
        workloads=[{"name": "chat", "concurrency": [1], "requests": 4, "max_tokens": 8}],
        server_extra={"gpus_per_trial": "{param.tensor-parallel-size}"},
    )
    try:
        done = run_cli("run", str(sweep_file), "--slots", "1", timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        # the console says why
        assert "no machine offers more than 2" in done.stdout + done.stderr
        trials = {t["params"]["tensor-parallel-size"]: t for t in report_json(sweep_file)["trials"]}
        assert set(trials) == {1, 2, 4}
        assert trials[1]["outcome"] == trials[2]["outcome"] == "ok"
        skipped = trials[4]
        assert skipped["outcome"] == "skipped"
        assert skipped["failure"]["reason"] == "too_few_gpus"
        assert skipped["failure"]["message"] == (
            "tensor-parallel-size=4 needs 4 GPUs; no machine offers more than 2: not launched"
        )
    finally:
        kill_tagged("toobig", tmp_path)
