"""The lifecycle against the simulated engine and fake GPUs: the seed's incident
(slow release, slow graceful shutdown still answering, slow load), orphan workers,
foreign holders, and the sim's own failure modes, each with its evidence."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.fixtures_lifecycle.helpers import (
    Tracker,
    free_port,
    init_fake_gpus,
    open_fake_probe,
    tracker,
    wait_for,
)

from servesweep.errors import TrialFailed
from servesweep.models import FailureClass, InstanceRecord
from servesweep.servers import procs
from servesweep.servers.engines import get_preset
from servesweep.servers.gpu.base import GpuProbe
from servesweep.servers.launchers.subprocess import SubprocessLauncher
from servesweep.servers.lifecycle import ServerLifecycle
from servesweep.sim.testing import http_request, read_truth
from servesweep.spec.schema import ServerSpec

__all__ = ["tracker"]

SIM = get_preset("sim")
GiB = 2**30


@pytest.fixture
def gpus(tmp_path: Path) -> Iterator[tuple[Path, GpuProbe]]:
    fake = tmp_path / "gpus"
    init_fake_gpus(fake, count=1, memory="8GiB")
    probe = open_fake_probe(fake)
    try:
        yield fake, probe
    finally:
        probe.close()


def _spec(port: int, fake: Path, policy: str = "wait", **timeouts: float) -> ServerSpec:
    return ServerSpec.model_validate(
        {
            "engine": "sim",
            "port": port,
            "gpus": [0],
            "gpu_backend": "fake",
            "fake_gpu_dir": str(fake),
            "timeouts": {"stop": 5, "kill": 3, "release": 20, "ready": 20, **timeouts},
            "release": {"tolerance": "64MiB", "settle": 0.1, "foreign_holders": policy},
        }
    )


def _argv(spec: ServerSpec, fake: Path, truth: Path, **params: Any) -> list[str]:
    base = {
        "fake-gpus": str(fake),
        "gpus": "0",
        "mem-per-gpu": "5GiB",
        "truth": str(truth),
        "load-time": 0.5,
    }
    return SIM.build_argv(spec, {**base, **params})


def _start(
    lc: ServerLifecycle, tracker: Tracker, argv: list[str], log: Path, key: str
) -> InstanceRecord:
    inst = lc.start(argv, {}, log, key, key)
    tracker.track(lc.launcher, inst)
    return inst


def _events(truth: Path, pid: int, name: str) -> list[dict[str, Any]]:
    return [e for e in read_truth(truth) if e["event"] == name and e.get("pid") == pid]


def test_seed_scenario_every_config_measured_by_its_own_instance(
    tmp_path: Path, tracker: Tracker, gpus: tuple[Path, GpuProbe]
) -> None:
    """Release delay (1.5 s) longer than a naive fixed sleep, a slow graceful shutdown
    still answering /v1/models, a slow load; two instances never fit together."""
    fake, probe = gpus
    port = free_port()
    spec = _spec(port, fake)
    lc = ServerLifecycle(spec, SIM, SubprocessLauncher(), probe)
    assert lc.prepare([0]) == {0: 0}
    truth = tmp_path / "truth.jsonl"
    current: InstanceRecord | None = None
    seen: list[int] = []
    for n, budget in enumerate((2, 4, 8)):
        if current is not None:
            old_pids = lc.launcher.pids(current) | set(current.pids)
            lc.stop(current)
            released = lc.release([0], old_pids)
            old = current.main_pid or 0
            # The gate waited for the physical release, not for a fixed time.
            freed = _events(truth, old, "memory_released")
            assert freed, "the old instance's memory release is in the truth file"
            assert time.time() >= freed[-1]["t"]
            assert released.seconds >= released.released_s >= 0
        argv = _argv(
            spec, fake, truth, budget=budget, **{"release-delay": 1.5, "shutdown-delay": 0.8}
        )
        current = _start(lc, tracker, argv, tmp_path / f"t{n}.log", f"seed-{n}")
        info = lc.wait_ready(current)
        assert info.model == "sim-model" and info.ready_s >= 0.5
        reply = http_request(
            port, "/v1/completions", {"model": "sim-model", "prompt": "hi", "max_tokens": 2}
        )
        assert reply.status == 200
        assert reply.instance.startswith(f"{current.main_pid}-"), "measured the wrong instance"
        assert f"budget={budget}" in (tmp_path / f"t{n}.log").read_text()
        seen.append(current.main_pid or 0)
        if n:
            prev = seen[-2]
            released_at = _events(truth, prev, "memory_released")[-1]["t"]
            allocated_at = _events(truth, seen[-1], "memory_allocated")[-1]["t"]
            assert allocated_at >= released_at, "new instance allocated before the old released"
    assert current is not None
    lc.stop(current)
    assert len(set(seen)) == 3


def test_orphan_worker_of_our_instance_is_found_and_cleaned(
    tmp_path: Path, tracker: Tracker, gpus: tuple[Path, GpuProbe]
) -> None:
    fake, probe = gpus
    port = free_port()
    spec = _spec(port, fake)
    lc = ServerLifecycle(spec, SIM, SubprocessLauncher(), probe)
    lc.prepare([0])
    truth = tmp_path / "truth.jsonl"
    argv = _argv(spec, fake, truth, **{"orphan-worker": True, "release-delay": 0.3})
    inst = _start(lc, tracker, argv, tmp_path / "s.log", "orph-1")
    lc.wait_ready(inst)
    worker = next(
        int(e["holder_pid"])
        for e in read_truth(truth)
        if e["event"] == "memory_allocated" and "holder_pid" in e
    )
    assert worker in lc.launcher.pids(inst), "the setsid worker is found by its tag"
    # The API server dies like a SIGKILLed vLLM front-end; its worker keeps the GPU.
    os.kill(inst.main_pid or 0, signal.SIGKILL)
    assert wait_for(lambda: lc.launcher.poll(inst) is not None)
    assert not procs.is_gone(worker)
    assert probe.snapshot([0])[0].used_bytes == 5 * GiB
    result = lc.release([0], {inst.main_pid or 0})
    assert [p.pid for p in result.cleaned] == [worker]
    assert "servesweep.sim.worker" in result.cleaned[0].cmdline
    assert procs.is_gone(worker)
    assert probe.snapshot([0])[0].used_bytes == 0
    # the worker's release delay (0.3 s after its last 20 ms heartbeat)
    assert result.seconds >= 0.25


def test_foreign_holder_is_gpu_busy_naming_it(
    tmp_path: Path, tracker: Tracker, gpus: tuple[Path, GpuProbe]
) -> None:
    fake, probe = gpus
    holder = tracker.spawn(
        [sys.executable, "-m", "servesweep.fakegpu", "hold", str(fake), "--mem", "3GiB"],
        tmp_path / "hold.log",
    )
    assert wait_for(lambda: bool(probe.snapshot([0])[0].holders))
    port = free_port()
    # fail: at once, before the sweep.
    lc = ServerLifecycle(_spec(port, fake, "fail"), SIM, SubprocessLauncher(), probe)
    t0 = time.monotonic()
    with pytest.raises(TrialFailed) as caught:
        lc.prepare([0])
    assert time.monotonic() - t0 < 2
    ev = caught.value.evidence
    assert caught.value.failure_class is FailureClass.GPU_BUSY and ev.reason == "foreign_holder"
    assert [h.pid for h in ev.gpu_holders] == [holder.pid]
    assert "fakegpu hold" in ev.gpu_holders[0].cmdline
    assert ev.gpu_holders[0].used_bytes == 3 * GiB
    assert f"pid {holder.pid}" in ev.message
    # wait: until the release timeout, then the same evidence; the holder is not killed.
    lc = ServerLifecycle(_spec(port, fake, "wait", release=1.0), SIM, SubprocessLauncher(), probe)
    with pytest.raises(TrialFailed) as caught:
        lc.prepare([0])
    assert caught.value.failure_class is FailureClass.GPU_BUSY
    assert [h.pid for h in caught.value.evidence.gpu_holders] == [holder.pid]
    assert holder.poll() is None
    # kill-own: not ours (no servesweep tag), so it fails and survives.
    lc = ServerLifecycle(_spec(port, fake, "kill-own"), SIM, SubprocessLauncher(), probe)
    with pytest.raises(TrialFailed):
        lc.prepare([0])
    assert holder.poll() is None


def test_leftover_instance_of_an_earlier_run_is_killed_under_kill_own(
    tmp_path: Path, tracker: Tracker, gpus: tuple[Path, GpuProbe]
) -> None:
    fake, probe = gpus
    env = {**os.environ, procs.TAG_ENV: "earlier-sweep-3-0badcafe"}
    import subprocess

    with open(tmp_path / "hold.log", "ab") as out:
        left = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "servesweep.fakegpu",
                "hold",
                str(fake),
                "--mem",
                "3GiB",
                "--release-delay",
                "0.3",
            ],
            env=env,
            stdout=out,
        )
    tracker.popens.append(left)
    assert wait_for(lambda: bool(probe.snapshot([0])[0].holders))
    lc = ServerLifecycle(_spec(free_port(), fake, "kill-own"), SIM, SubprocessLauncher(), probe)
    t0 = time.monotonic()
    assert lc.prepare([0]) == {0: 0}
    assert time.monotonic() - t0 >= 0.25  # waited for the release delay after the kill
    assert [p.pid for p in lc.cleaned] == [left.pid]
    assert left.wait(timeout=5) == -signal.SIGKILL


def test_oom_at_load_on_the_sim_is_start_crash_oom(
    tmp_path: Path, tracker: Tracker, gpus: tuple[Path, GpuProbe]
) -> None:
    fake, probe = gpus
    tracker.spawn(
        [sys.executable, "-m", "servesweep.fakegpu", "hold", str(fake), "--mem", "6GiB"],
        tmp_path / "hold.log",
    )
    assert wait_for(lambda: bool(probe.snapshot([0])[0].holders))
    port = free_port()
    spec = _spec(port, fake)
    lc = ServerLifecycle(spec, SIM, SubprocessLauncher(), probe)
    inst = _start(lc, tracker, _argv(spec, fake, tmp_path / "t"), tmp_path / "s.log", "oom-1")
    with pytest.raises(TrialFailed) as caught:
        lc.wait_ready(inst)
    failure = caught.value
    assert failure.failure_class is FailureClass.START_CRASH
    assert failure.evidence.reason == "oom"
    assert failure.evidence.matched_line and "OutOfMemoryError" in failure.evidence.matched_line
    assert failure.evidence.exit_code == 1


@pytest.mark.parametrize(
    ("params", "klass", "reason"),
    [
        ({"bogus-flag": 1}, FailureClass.INVALID_ARGS, "invalid_args"),
        ({"crash-at-load": True}, FailureClass.START_CRASH, "traceback"),
        ({"hang-at-load": True}, FailureClass.READY_TIMEOUT, "no_listener"),
    ],
)
def test_sim_failure_modes_at_load(
    tmp_path: Path,
    tracker: Tracker,
    gpus: tuple[Path, GpuProbe],
    params: dict[str, Any],
    klass: FailureClass,
    reason: str,
) -> None:
    fake, probe = gpus
    port = free_port()
    # Only the hang waits for the deadline; the others must be classified by their
    # exit, however long the simulator takes to start on a loaded machine.
    ready = 2.0 if klass is FailureClass.READY_TIMEOUT else 60.0
    spec = _spec(port, fake, ready=ready)
    lc = ServerLifecycle(spec, SIM, SubprocessLauncher(), probe)
    argv = _argv(spec, fake, tmp_path / "t", **params)
    inst = _start(lc, tracker, argv, tmp_path / "s.log", "fm-1")
    t0 = time.monotonic()
    with pytest.raises(TrialFailed) as caught:
        lc.wait_ready(inst)
    assert time.monotonic() - t0 < ready + 6
    assert caught.value.failure_class is klass
    assert caught.value.evidence.reason == reason
    assert caught.value.evidence.log_tail
    if "crash-at-load" in params:
        # the fatal line is the traceback's header; the evidence also quotes the cause
        cause = "RuntimeError: simulated crash while loading weights (--crash-at-load)"
        assert caught.value.evidence.first_error_line == cause
        assert cause in caught.value.evidence.summary()
    lc.stop(inst)


def test_models_before_ready_is_not_ready_until_it_generates(
    tmp_path: Path, tracker: Tracker, gpus: tuple[Path, GpuProbe]
) -> None:
    fake, probe = gpus
    port = free_port()
    spec = _spec(port, fake)
    lc = ServerLifecycle(spec, SIM, SubprocessLauncher(), probe)
    argv = _argv(spec, fake, tmp_path / "t", **{"models-before-ready": True, "load-time": 1.5})
    inst = _start(lc, tracker, argv, tmp_path / "s.log", "mbr-1")
    assert wait_for(
        lambda: _ok(lambda: http_request(port, "/v1/models", timeout=1).status == 200), 10
    )
    info = lc.wait_ready(inst)
    assert info.ready_s - info.load_s >= 1.0, "the socket was ours early, ready only later"
    assert info.ready_s >= 1.5, "ready only once it generates"
    lc.stop(inst)


def test_crash_after_requests_is_bench_crash(
    tmp_path: Path, tracker: Tracker, gpus: tuple[Path, GpuProbe]
) -> None:
    fake, probe = gpus
    port = free_port()
    spec = _spec(port, fake)
    lc = ServerLifecycle(spec, SIM, SubprocessLauncher(), probe)
    argv = _argv(spec, fake, tmp_path / "t", **{"crash-after": 3})
    inst = _start(lc, tracker, argv, tmp_path / "s.log", "ca-1")
    lc.wait_ready(inst)  # the readiness generation is request 1
    for _ in range(4):
        _ok(lambda: http_request(port, "/v1/completions", {"prompt": "x", "max_tokens": 1}))
    assert wait_for(lambda: lc.launcher.poll(inst) is not None)
    with pytest.raises(TrialFailed) as caught:
        lc.check_alive(inst)
    ev = caught.value.evidence
    assert caught.value.failure_class is FailureClass.BENCH_CRASH
    assert ev.exit_code == 1
    assert any("illegal memory access" in line for line in ev.log_tail)


def _ok(fn: Any) -> Any:
    try:
        return fn()
    except OSError:
        return False


def test_old_sim_draining_on_a_shared_port_is_not_taken_for_the_new_one(
    tmp_path: Path, tracker: Tracker
) -> None:
    port = free_port()
    spec = ServerSpec(engine="sim", port=port)
    old = tracker.spawn(
        SIM.build_argv(spec, {"reuse-port": True, "load-time": 0, "shutdown-delay": 10}),
        tmp_path / "old.log",
    )
    assert wait_for(lambda: _ok(lambda: http_request(port, "/health", timeout=1).status == 200))
    old.send_signal(signal.SIGTERM)  # draining: still answers for 10 s
    assert wait_for(lambda: "draining" in (tmp_path / "old.log").read_text(), 5)
    launcher = SubprocessLauncher()
    argv = SIM.build_argv(spec, {"reuse-port": True, "load-time": 1.0})
    from servesweep.servers.launchers.base import LaunchRequest

    inst = launcher.start(
        LaunchRequest(argv, {}, "127.0.0.1", port, (), tmp_path / "new.log", "rp-1", "fp")
    )
    tracker.track(launcher, inst)
    info = lc_ready(launcher, inst, port)
    assert info.load_s >= 1.0, "ready before the new instance even listened"
    assert old.poll() is None, "the old instance was still serving on the shared port"
    # Each connection lands on one of the two listeners; the gate tells them apart by
    # the owner of the server side of the connection.
    from servesweep.servers.readiness import http_call

    owners = set()
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 1}
    ours = launcher.pids(inst)
    for _ in range(20):
        ans = http_call(
            "127.0.0.1",
            port,
            "POST",
            "/v1/completions",
            body=body,
            api_key=None,
            timeout=2,
            ours=ours,
        )
        assert not isinstance(ans, str), ans
        served_by = int(ans.json()["system_fingerprint"].split("-")[0])
        if ans.served_by_other:
            assert ans.served_by_other == {old.pid} and served_by == old.pid
        else:
            assert served_by == inst.main_pid
        owners.add(served_by)
    assert inst.main_pid in owners


def lc_ready(launcher: SubprocessLauncher, inst: InstanceRecord, port: int) -> Any:
    from servesweep.servers.readiness import wait_ready

    return wait_ready(launcher, inst, SIM, host="127.0.0.1", port=port, model=None, deadline_s=20)
