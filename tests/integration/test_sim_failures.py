"""Every failure mode of the simulated engine, started for real and observed from outside."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servesweep.fakegpu import FakeGpuDir
from servesweep.servers.gpu import open_probe
from servesweep.sim.testing import SimRun, http_request, start_sim

MiB = 2**20
FAST = ["--load-time", "0.2", "--ttft-ms", "1", "--step-ms", "1"]


@pytest.fixture
def sims() -> Iterator[list[SimRun]]:
    """Register every started sim here; all are killed by PID at the end."""
    started: list[SimRun] = []
    try:
        yield started
    finally:
        for run in started:
            run.close()


@pytest.fixture
def gpus(tmp_path: Path) -> Path:
    path = tmp_path / "gpus"
    FakeGpuDir.create(path, 2, 1024 * MiB)
    return path


def used(gpus: Path, index: int = 0) -> int:
    return FakeGpuDir(gpus).usage()[index].used_bytes


def test_invalid_flag_exits_2_like_argparse(tmp_path: Path, sims: list[SimRun]) -> None:
    run = start_sim(["--no-such-flag", "3"], tmp_path)
    sims.append(run)
    assert run.wait_exit(20) == 2
    assert "error: unrecognized arguments: --no-such-flag 3" in run.log()


def test_invalid_value_exits_2(tmp_path: Path, sims: list[SimRun]) -> None:
    run = start_sim(["--mem-per-gpu", "lots"], tmp_path)
    sims.append(run)
    assert run.wait_exit(20) == 2
    assert "argument --mem-per-gpu: invalid size 'lots'" in run.log()


def test_crash_at_load_traceback_exit_1(tmp_path: Path, gpus: Path, sims: list[SimRun]) -> None:
    run = start_sim([*FAST, "--crash-at-load"], tmp_path, fake_gpus=gpus)
    sims.append(run)
    assert run.wait_exit(20) == 1
    log = run.log()
    assert "Traceback (most recent call last):" in log
    assert "RuntimeError: simulated crash while loading weights" in log
    assert "Loading weights:  30%" in log and "Loading weights:  50%" not in log
    assert [e["code"] for e in run.events("exit")] == [1]
    assert not run.events("listening")
    # no release delay: the memory came back when the process let go of it, before exit
    (exit_event,) = run.events("exit")
    (released,) = run.events("memory_released")
    assert released["t"] <= exit_event["t"]
    assert used(gpus) == 0


def test_hang_at_load_never_ready(tmp_path: Path, sims: list[SimRun]) -> None:
    run = start_sim(["--load-time", "0.2", "--hang-at-load"], tmp_path)
    sims.append(run)
    deadline = time.monotonic() + 30
    while "(--hang-at-load)" not in run.log() and time.monotonic() < deadline:
        assert run.proc.poll() is None, run.log()
        time.sleep(0.01)
    assert "waiting for a peer shard... (--hang-at-load)" in run.log()
    # hung: five load times later, still alive, not listening, no further progress
    time.sleep(5 * 0.2)
    assert run.proc.poll() is None
    with pytest.raises(ConnectionRefusedError):
        run.request("/v1/models", timeout=1)
    assert "Loading weights:  50%" not in run.log()
    run.signal(signal.SIGTERM)
    assert run.wait_exit(10) == 0
    assert not run.events("ready")


def test_oom_at_load_when_memory_is_short(tmp_path: Path, gpus: Path, sims: list[SimRun]) -> None:
    first = start_sim([*FAST, "--gpus", "0,1", "--mem-per-gpu", "700MiB"], tmp_path, fake_gpus=gpus)
    sims.append(first)
    first.wait_ready()
    second = start_sim([*FAST, "--gpus", "1", "--mem-per-gpu", "512MiB"], tmp_path, fake_gpus=gpus)
    sims.append(second)
    assert second.wait_exit(20) == 1
    log = second.log()
    assert "Traceback (most recent call last):" in log
    assert (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. "
        "GPU 1 has a total capacity of 1.00 GiB of which 324.00 MiB is free." in log
    )
    assert not second.events("memory_allocated")
    # The first instance is unaffected.
    assert first.request("/health").status == 200


def test_release_delay_keeps_memory_after_exit(
    tmp_path: Path, gpus: Path, sims: list[SimRun]
) -> None:
    run = start_sim(
        [*FAST, "--mem-per-gpu", "600MiB", "--release-delay", "0.6"], tmp_path, fake_gpus=gpus
    )
    sims.append(run)
    run.wait_ready()
    assert used(gpus) == 600 * MiB
    run.signal(signal.SIGTERM)
    assert run.wait_exit(10) == 0
    # the holding as the process left it: when it let go, and the delay
    (holding,) = FakeGpuDir(gpus).holdings()
    assert holding.pid == run.pid and not holding.alive and holding.exited_at is not None
    (exit_event,) = run.events("exit")
    (released,) = run.events("memory_released")
    assert holding.exited_at <= exit_event["t"]
    assert released["t"] == pytest.approx(holding.exited_at + 0.6, abs=1e-6)
    # held until the delay has passed, free from then on, by the rule every probe
    # applies (checked at those moments, whatever this machine's speed)
    d = FakeGpuDir(gpus)
    assert d.usage(released["t"] - 0.01, [holding])[0].used_bytes == 600 * MiB
    assert d.usage(released["t"], [holding])[0].used_bytes == 0
    # Nothing lists the exited process any more, like NVML.
    assert d.usage()[0].holders == ()
    # and in real time: free once the delay has passed, never before
    deadline = time.monotonic() + 10
    while used(gpus) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert used(gpus) == 0
    assert time.time() >= released["t"] - 0.001


def test_sigkill_release_time_is_last_heartbeat(
    tmp_path: Path, gpus: Path, sims: list[SimRun]
) -> None:
    run = start_sim(
        [*FAST, "--mem-per-gpu", "600MiB", "--release-delay", "0.4"], tmp_path, fake_gpus=gpus
    )
    sims.append(run)
    run.wait_ready()
    d = FakeGpuDir(gpus)
    # a live holder keeps refreshing its heartbeat: wait to see it move
    (first,) = d.holdings()
    deadline = time.monotonic() + 10
    while d.holdings()[0].heartbeat_at == first.heartbeat_at and time.monotonic() < deadline:
        time.sleep(0.005)
    assert d.holdings()[0].heartbeat_at > first.heartbeat_at
    run.signal(signal.SIGKILL)
    killed = time.time()
    run.wait_exit(10)
    # killed without a word: its exit time is its last heartbeat, which stops moving
    (holding,) = d.holdings()
    assert not holding.alive and holding.exited_at is None
    assert holding.heartbeat_at <= killed + 0.01
    assert holding.release_at == holding.heartbeat_at + 0.4
    assert d.usage(holding.release_at - 0.01, [holding])[0].used_bytes == 600 * MiB
    assert d.usage(holding.release_at, [holding])[0].used_bytes == 0
    # in real time: free once the delay after the last heartbeat has passed, never before
    deadline = time.monotonic() + 10
    while used(gpus) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert used(gpus) == 0
    assert time.time() >= holding.release_at - 0.001
    assert d.holdings()[0].heartbeat_at == holding.heartbeat_at
    # Whoever noticed the release wrote the truth lines for the killed process.
    d.collect()
    (exit_event,) = run.events("exit")
    assert exit_event["inferred"] is True
    assert exit_event["t"] == pytest.approx(holding.heartbeat_at, abs=1e-6)
    (released,) = run.events("memory_released")
    assert released["t"] == pytest.approx(exit_event["t"] + 0.4, abs=0.001)


def test_shutdown_delay_old_instance_still_answers(tmp_path: Path, sims: list[SimRun]) -> None:
    run = start_sim([*FAST, "--shutdown-delay", "0.8"], tmp_path)
    sims.append(run)
    run.wait_ready()
    run.signal(signal.SIGTERM)
    time.sleep(0.2)
    assert run.proc.poll() is None
    assert run.request("/v1/models").status == 200
    assert run.request("/health").status == 200
    reply = run.request("/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert reply.status == 200 and reply.instance.startswith(f"{run.pid}-")
    assert run.wait_exit(10) == 0
    (begin,) = run.events("shutdown_begin")
    (end,) = run.events("exit")
    assert 0.75 <= end["t"] - begin["t"] <= 2.0


def test_shutdown_generation_fail(tmp_path: Path, sims: list[SimRun]) -> None:
    run = start_sim([*FAST, "--shutdown-delay", "0.6", "--shutdown-generation", "fail"], tmp_path)
    sims.append(run)
    run.wait_ready()
    run.signal(signal.SIGTERM)
    time.sleep(0.15)
    assert run.request("/v1/models").status == 200
    assert run.request("/v1/completions", {"prompt": "x", "max_tokens": 2}).status == 503
    assert run.wait_exit(10) == 0


def test_ignore_sigterm_needs_sigkill(tmp_path: Path, sims: list[SimRun]) -> None:
    run = start_sim([*FAST, "--ignore-sigterm"], tmp_path)
    sims.append(run)
    run.wait_ready()
    run.signal(signal.SIGTERM)
    time.sleep(0.4)
    assert run.proc.poll() is None and run.request("/health").status == 200
    run.signal(signal.SIGKILL)
    assert run.wait_exit(10) == -signal.SIGKILL


def test_models_before_ready(tmp_path: Path, sims: list[SimRun]) -> None:
    run = start_sim(["--load-time", "1.0", "--models-before-ready"], tmp_path)
    sims.append(run)
    deadline = time.monotonic() + 10
    while not run.events("listening") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert run.request("/v1/models").status == 200  # the trap: listed while loading
    assert run.request("/health").status == 503
    assert run.request("/v1/completions", {"prompt": "x", "max_tokens": 1}).status == 503
    run.wait_ready()
    assert run.request("/v1/completions", {"prompt": "x", "max_tokens": 1}).status == 200
    (listening,) = run.events("listening")
    (ready,) = run.events("ready")
    assert ready["t"] - listening["t"] >= 0.9


def test_port_bound_only_after_load(tmp_path: Path, sims: list[SimRun]) -> None:
    run = start_sim(["--load-time", "0.8"], tmp_path)
    sims.append(run)
    time.sleep(0.4)
    with pytest.raises(ConnectionRefusedError):
        run.request("/v1/models", timeout=1)
    run.wait_ready()
    (start,) = run.events("process_start")
    (listening,) = run.events("listening")
    assert listening["t"] - start["t"] >= 0.75


def test_port_in_use_fails_like_uvicorn(tmp_path: Path, sims: list[SimRun]) -> None:
    first = start_sim(FAST, tmp_path)
    sims.append(first)
    first.wait_ready()
    second = start_sim(FAST, tmp_path, port=first.port)
    sims.append(second)
    assert second.wait_exit(20) == 1
    assert "address already in use" in second.log()


def test_reuse_port_two_instances_share_the_port(tmp_path: Path, sims: list[SimRun]) -> None:
    first = start_sim([*FAST, "--reuse-port"], tmp_path)
    sims.append(first)
    first.wait_ready()
    second = start_sim([*FAST, "--reuse-port"], tmp_path, port=first.port)
    sims.append(second)
    # /health on the shared port is answered by the first: wait for the second's own
    # ready line instead (the trap servesweep's readiness gate must avoid).
    deadline = time.monotonic() + 10
    while not second.events("ready") and time.monotonic() < deadline:
        assert http_request(first.port, "/health").status == 200
        time.sleep(0.02)
    assert second.proc.poll() is None and second.events("ready")
    seen = {http_request(first.port, "/v1/models").instance.split("-")[0] for _ in range(60)}
    assert seen == {str(first.pid), str(second.pid)}


def test_error_rate_is_deterministic(tmp_path: Path, sims: list[SimRun]) -> None:
    statuses = []
    for _ in range(2):
        run = start_sim([*FAST, "--error-rate", "0.3", "--seed", "7"], tmp_path)
        sims.append(run)
        run.wait_ready()
        statuses.append(
            [
                run.request("/v1/completions", {"prompt": "x", "max_tokens": 1}).status
                for _ in range(40)
            ]
        )
        run.close()
    assert statuses[0] == statuses[1]
    errors = statuses[0].count(500)
    assert 4 <= errors <= 20 and set(statuses[0]) == {200, 500}


def test_crash_after_n_requests(tmp_path: Path, gpus: Path, sims: list[SimRun]) -> None:
    run = start_sim([*FAST, "--crash-after", "3"], tmp_path, fake_gpus=gpus)
    sims.append(run)
    run.wait_ready()
    for _ in range(3):
        assert run.request("/v1/completions", {"prompt": "x", "max_tokens": 2}).status == 200
    with pytest.raises((ConnectionError, OSError)):
        run.request("/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert run.wait_exit(10) == 1
    assert "CUDA error: an illegal memory access was encountered" in run.log()
    assert [e["code"] for e in run.events("exit")] == [1]


def test_orphan_worker_survives_sigkill(tmp_path: Path, gpus: Path, sims: list[SimRun]) -> None:
    run = start_sim(
        [*FAST, "--orphan-worker", "--mem-per-gpu", "500MiB", "--gpus", "0,1"],
        tmp_path,
        fake_gpus=gpus,
    )
    sims.append(run)
    run.wait_ready()
    (worker,) = run.worker_pids()
    holders = FakeGpuDir(gpus).usage()[0].holders
    assert [h.pid for h in holders] == [worker]
    run.signal(signal.SIGKILL)
    run.wait_exit(10)
    time.sleep(0.3)
    usage = FakeGpuDir(gpus).usage()
    assert [h.pid for h in usage[1].holders] == [worker], "the orphan keeps holding"
    assert usage[1].used_bytes == 500 * MiB
    run.close()  # kills the orphan by PID
    deadline = time.monotonic() + 5
    while used(gpus, 1) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert used(gpus, 1) == 0


def test_orphan_worker_released_on_graceful_stop(
    tmp_path: Path, gpus: Path, sims: list[SimRun]
) -> None:
    run = start_sim([*FAST, "--orphan-worker"], tmp_path, fake_gpus=gpus)
    sims.append(run)
    run.wait_ready()
    (worker,) = run.worker_pids()
    run.signal(signal.SIGTERM)
    assert run.wait_exit(10) == 0
    # the engine stopped its worker before exiting; the worker let go of the memory
    (released,) = [e for e in run.truth() if e["event"] == "memory_released" and e["pid"] == worker]
    (exit_event,) = run.events("exit")
    assert released["t"] <= exit_event["t"]
    assert used(gpus) == 0


def test_fake_gpu_utilisation_follows_requests(
    tmp_path: Path, gpus: Path, sims: list[SimRun]
) -> None:
    run = start_sim(["--load-time", "0", "--step-ms", "5"], tmp_path, fake_gpus=gpus)
    sims.append(run)
    run.wait_ready()
    probe = open_probe("fake", str(gpus))
    assert probe.snapshot([0])[0].utilization_pct == 0.0
    body = {"prompt": "x", "max_tokens": 150, "ignore_eos": True}
    worker = threading.Thread(target=run.request, args=("/v1/completions", body))
    worker.start()
    seen = []
    while worker.is_alive():
        seen.append(probe.snapshot([0])[0].utilization_pct)
        time.sleep(0.02)
    worker.join()
    assert 100.0 in seen
    deadline = time.monotonic() + 3
    while probe.snapshot([0])[0].utilization_pct and time.monotonic() < deadline:
        time.sleep(0.02)
    (state,) = probe.snapshot([0])
    assert state.utilization_pct == 0.0 and state.power_w == 75.0
