"""A trial's GPU samples in a real sweep of the simulated engine on fake GPUs."""

from __future__ import annotations

from pathlib import Path

from tests.integration.sweep_helpers import kill_tagged, report_json, run_cli, write_sweep

GIB = 1 << 30


def test_peak_memory_is_the_trials_own_not_the_previous_instances(tmp_path: Path) -> None:
    """A 60 GiB configuration, then a 10 GiB one: the memory of the first while it is
    stopped and released (0.8 s of release delay, sampled every 50 ms) belongs to the
    first trial, so the second's peak is its own 10 GiB."""
    sweep_file = write_sweep(
        tmp_path,
        name="peaks",
        grid={"mem-per-gpu": ["60GiB", "10GiB"]},
        args={"release-delay": 0.8},
        workloads=[{"name": "chat", "concurrency": [1], "requests": 4, "max_tokens": 8}],
    )
    try:
        done = run_cli("run", str(sweep_file), "--quiet", timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        trials = sorted(report_json(sweep_file)["trials"], key=lambda t: t["seq"])
        assert [t["params"]["mem-per-gpu"] for t in trials] == ["60GiB", "10GiB"]
        big, small = trials
        assert all(t["outcome"] == "ok" for t in trials), trials
        # each GPU of each trial was sampled, and its peak is what that instance held
        gpus = {"0", "1"}
        assert set(big["peak_gpu_memory_bytes"]) == set(small["peak_gpu_memory_bytes"]) == gpus
        for gpu, peak in big["peak_gpu_memory_bytes"].items():
            assert peak >= 60 * GIB, (gpu, peak)
        for gpu, peak in small["peak_gpu_memory_bytes"].items():
            assert 10 * GIB <= peak < 11 * GIB, (gpu, peak)
    finally:
        kill_tagged("peaks", tmp_path)
