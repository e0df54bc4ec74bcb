"""The standalone tools as a user runs them: `wait-gpus` for shell scripts, `doctor`,
`status` while another process runs the sweep."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.integration.sweep_helpers import (
    background_run,
    kill_tagged,
    run_cli,
    wait_for_event,
    write_sweep,
)

from servesweep.sim.testing import running_sim


def _init_gpus(path: Path) -> None:
    done = run_cli("fake-gpus", "init", str(path), "--count", "2", "--memory", "8GiB")
    assert done.returncode == 0, done.stderr


def _wait_listed(gpus: Path, pid: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        shown = run_cli("fake-gpus", "show", str(gpus))
        if str(pid) in shown.stdout:
            return
        time.sleep(0.1)
    raise AssertionError(f"holder {pid} never appeared in {gpus}")


def test_wait_gpus_names_the_holder_then_returns_when_released(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus"
    _init_gpus(gpus)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servesweep.fakegpu",
            "hold",
            str(gpus),
            "--gpus",
            "1",
            "--mem",
            "4GiB",
            "--release-delay",
            "1.0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listed(gpus, holder.pid)
        busy = run_cli(
            "wait-gpus",
            "--gpus",
            "0-1",
            "--timeout",
            "0.5s",
            "--fake-gpus",
            str(gpus),
            "--backend",
            "fake",
        )
        assert busy.returncode == 1
        assert f"pid {holder.pid}" in busy.stderr
        assert "4096 MiB" in busy.stderr
        assert "Traceback" not in busy.stderr
        # only GPU 0 is asked for: it is free
        free0 = run_cli("wait-gpus", "--gpus", "0", "--fake-gpus", str(gpus), "--backend", "fake")
        assert free0.returncode == 0, free0.stderr
        holder.kill()
        holder.wait(timeout=10)
        started = time.monotonic()
        freed = run_cli(
            "wait-gpus",
            "--gpus",
            "0-1",
            "--timeout",
            "20s",
            "--fake-gpus",
            str(gpus),
            "--backend",
            "fake",
        )
        waited = time.monotonic() - started
        assert freed.returncode == 0, freed.stderr
        assert "free after" in freed.stdout
        # it waited for the release delay of the killed holder, not less
        assert waited >= 0.5
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=10)


def test_doctor_reports_gpus_holders_and_port(tmp_path: Path) -> None:
    sweep_file = write_sweep(tmp_path, name="doctor")
    gpus = tmp_path / "gpus"
    _init_gpus(gpus)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servesweep.fakegpu",
            "hold",
            str(gpus),
            "--gpus",
            "0",
            "--mem",
            "1GiB",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listed(gpus, holder.pid)
        done = run_cli("doctor", str(sweep_file), "--json", "--fake-gpus", str(gpus))
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        text = json.dumps(report)
        assert str(holder.pid) in text
        plain = run_cli("doctor", str(sweep_file), "--fake-gpus", str(gpus))
        assert plain.returncode == 0, plain.stderr
        assert str(holder.pid) in plain.stdout
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_status_while_a_sweep_runs(tmp_path: Path) -> None:
    sweep_file = write_sweep(tmp_path, name="status", args={"load-time": 10})
    events = tmp_path / "events.jsonl"
    try:
        with background_run(sweep_file, events=events) as proc:
            wait_for_event(events, lambda e: e["event"] == "phase" and e["phase"] == "load")
            done = run_cli("status", str(sweep_file), "--json")
            assert done.returncode == 0, done.stderr
            status = json.loads(done.stdout)
            running = [t for t in status["trials"] if t["outcome"] == "running"]
            assert len(running) == 1
            assert running[0]["phase"] in ("load", "ready")
            assert running[0]["seconds_in_phase"] >= 0
            plain = run_cli("status", str(sweep_file))
            assert "running" in plain.stdout and "[load" in plain.stdout
            proc.send_signal(2)
            proc.communicate(timeout=30)
    finally:
        kill_tagged("status", tmp_path)


def test_bench_a_running_server_without_a_sweep_file(tmp_path: Path) -> None:
    with running_sim(["--ttft-ms", "10", "--step-ms", "2"], tmp_path) as sim:
        sim.wait_ready()
        url = f"http://127.0.0.1:{sim.port}/v1"
        done = run_cli(
            "bench",
            "--url",
            url,
            "--concurrency",
            "1,4",
            "--requests",
            "8",
            "--max-tokens",
            "16",
            "--json",
        )
        assert done.returncode == 0, done.stderr
        levels = {r["level"]: r["metrics"] for r in json.loads(done.stdout)}
        assert set(levels) == {"c1", "c4"}
        assert all(m["completed"] == 8 and m["failed"] == 0 for m in levels.values())
        assert levels["c1"]["ttft_median_ms"] >= 10
        table = run_cli("bench", "--url", url, "--requests", "4", "--max-tokens", "8")
        assert table.returncode == 0, table.stderr
        assert "c1" in table.stdout and "TTFT" in table.stdout
        bad = run_cli("bench", "--url", url, "--concurrency", "one")
        assert bad.returncode == 2
        assert "not a comma-separated list" in bad.stderr


def _nvidia_driver_here() -> bool:
    from servesweep.errors import GpuProbeError
    from servesweep.servers.gpu.nvml import NvmlProbe

    try:
        NvmlProbe().snapshot([])
    except GpuProbeError:
        return False
    return True


def test_named_gpus_that_no_backend_sees_are_an_error_not_free(tmp_path: Path) -> None:
    if _nvidia_driver_here():
        pytest.skip("an NVIDIA driver answers here: GPUs are visible")
    env_free = {k: v for k, v in os.environ.items() if k != "SERVESWEEP_FAKE_GPUS"}
    done = run_cli("wait-gpus", "--gpus", "0-7", "--timeout", "5s", env=env_free)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "free" not in done.stdout
    [line] = done.stderr.strip().splitlines()
    assert "GPUs 0-7 are named, but no GPU backend can see them" in line, line
    # a sweep with server.gpus and the automatic backend refuses to start a server
    sweep = write_sweep(
        tmp_path,
        name="nogpu",
        server_extra={"fake_gpu_dir": None, "fake_gpus": None, "gpu_backend": "auto"},
    )
    run = run_cli("run", str(sweep), "--quiet", env=env_free)
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert "GPUs 0,1 are named, but no GPU backend can see them" in run.stderr, run.stderr
    assert "gpu_backend: none" in run.stderr
    assert not list(tmp_path.glob("runs/**/server.log")), "a server was started"
    # the same sweep with gpu_backend: none runs without GPU checks
    sweep = write_sweep(
        tmp_path,
        name="nogpu",
        args={"mem-per-gpu": None},
        grid={"budget": [2]},
        server_extra={"fake_gpu_dir": None, "fake_gpus": None, "gpu_backend": "none"},
    )
    ok = run_cli("run", str(sweep), "--quiet", "--fresh", env=env_free, timeout=300)
    assert ok.returncode == 0, (ok.stdout[-2000:], ok.stderr[-2000:])


@pytest.mark.parametrize(
    ("setting", "path_without_bwrap", "backend", "words"),
    [
        ("auto", False, "bwrap", "nothing of the threat model"),
        ("auto", True, "unshare", "nothing of the threat model"),
        ("host-filesystem", False, "none", "world-readable secrets"),
    ],
)
def test_doctor_names_the_eval_sandbox_and_what_it_does_not_protect(
    tmp_path: Path, setting: str, path_without_bwrap: bool, backend: str, words: str
) -> None:
    if os.geteuid() != 0 and backend != "bwrap":
        pytest.skip(f"the {backend} backend runs generated code as a fresh uid only as root")
    if backend == "bwrap" and not shutil.which("bwrap"):
        pytest.skip("bubblewrap (bwrap) is not installed")
    coding = {"name": "coding", "eval": {"suite": "builtin:coding", "sandbox": setting}}
    sweep_file = write_sweep(tmp_path, name="doctor", workloads=[coding])
    gpus = tmp_path / "gpus"
    _init_gpus(gpus)
    env = dict(os.environ)
    if path_without_bwrap:
        # A machine without bubblewrap: only unshare (and the Python) on PATH.
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "unshare").symlink_to(str(shutil.which("unshare")))
        env["PATH"] = f"{bin_dir}:{Path(sys.executable).parent}"
    done = run_cli("doctor", str(sweep_file), "--json", "--fake-gpus", str(gpus), env=env)
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)["eval_sandbox"]["coding"]
    assert entry["setting"] == setting and entry["backend"] == backend
    assert words in entry["does_not_protect"]
    plain = run_cli("doctor", str(sweep_file), "--fake-gpus", str(gpus), env=env)
    assert f"backend: {backend}" in plain.stdout and "does_not_protect:" in plain.stdout
