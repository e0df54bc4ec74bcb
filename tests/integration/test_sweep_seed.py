"""The seed incident through servesweep: the configurations that the naive script
(examples/seed-race/naive_sweep.sh, tests/integration/test_seed_race.py) gets wrong
are all measured, each by its own instance, as the simulator's ground truth shows."""

from __future__ import annotations

from pathlib import Path

import yaml
from tests.integration.sweep_helpers import kill_tagged, run_cli, tagged_processes

from servesweep.models import Outcome
from servesweep.sim.testing import free_port, read_truth
from servesweep.store import open_store

CONFIGS = [
    {"budget": 8, "topk": 4, "window": 2048},
    {"budget": 16, "topk": 4, "window": 2048},
    {"budget": 4, "topk": 4, "window": 2048},
    {"budget": 12, "topk": 6, "window": 2048},
]


def test_seed_scenario_every_config_measured_by_its_own_instance(tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    spec = {
        "name": "seed",
        "store": "servesweep.db",
        "server": {
            "engine": "sim",
            "port": free_port(),
            "gpus": [0],
            "gpu_backend": "fake",
            "fake_gpu_dir": "gpus",
            "fake_gpus": {"count": 1, "memory": "1GiB"},
            # like the incident, scaled: one instance fits, two do not; memory comes
            # back 1.5 s after exit; the old process answers /v1/models for 1 s after
            # SIGTERM; loading takes 1.5 s
            "args": {
                "mem-per-gpu": "700MiB",
                "load-time": 1.5,
                "release-delay": 1.5,
                "shutdown-delay": 1.0,
                "ttft-ms": 20,
                "step-ms": 5,
                "truth": str(truth),
            },
            "timeouts": {"stop": "10s", "release": "20s", "ready": "30s"},
        },
        "params": {"points": CONFIGS},
        "workloads": [
            {
                "name": "bench",
                "concurrency": [1],
                "requests": 4,
                "max_tokens": 32,
                "ignore_eos": True,
            }
        ],
    }
    sweep_file = tmp_path / "seed.yaml"
    sweep_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    try:
        done = run_cli("run", str(sweep_file), "--quiet", timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        events = read_truth(truth)
        with open_store(tmp_path / "servesweep.db", readonly=True) as store:
            trials = store.trials(1)
            assert [dict(t.params) for t in trials] == CONFIGS
            previous_pid: int | None = None
            for trial in trials:
                assert trial.outcome is Outcome.OK, trial.evidence
                assert trial.instance is not None
                pid = trial.instance.pids[0]
                mine = {e["event"]: e["t"] for e in events if e["pid"] == pid}
                # the benchmark ran against this trial's instance, after it was ready
                assert mine["ready"] <= trial.phase_started["bench"]
                assert "exit" in mine, "every instance was stopped"
                assert mine["exit"] >= trial.finished_at - 0.001
                if previous_pid is not None:
                    before = {e["event"]: e["t"] for e in events if e["pid"] == previous_pid}
                    # never two instances on the GPU: the new one allocated its memory
                    # only after the old one's memory was released
                    assert before["memory_released"] <= mine["memory_allocated"]
                    assert before["exit"] <= mine["process_start"]
                previous_pid = pid
                (result,) = store.results(trial.id)
                assert result.metrics["completed"] == 4
        assert tagged_processes("seed", tmp_path) == []
    finally:
        kill_tagged("seed", tmp_path)
