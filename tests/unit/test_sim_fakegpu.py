"""The fake GPUs' on-disk protocol, in-process (this process is the holder)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from servesweep.fakegpu import FakeGpuDir, FakeGpuError, FakeOutOfMemory
from servesweep.fakegpu.procinfo import own_start_time
from servesweep.sim.testing import read_truth

MiB = 2**20


@pytest.fixture
def gpus(tmp_path: Path) -> FakeGpuDir:
    return FakeGpuDir.create(tmp_path / "gpus", 2, 1000 * MiB, reserved_bytes=10 * MiB)


def test_create_and_read(gpus: FakeGpuDir) -> None:
    assert [(g.index, g.total_bytes, g.reserved_bytes) for g in gpus.gpus()] == [
        (0, 1000 * MiB, 10 * MiB),
        (1, 1000 * MiB, 10 * MiB),
    ]
    assert [u.used_bytes for u in gpus.usage()] == [10 * MiB, 10 * MiB]


def test_missing_dir_says_how_to_create(tmp_path: Path) -> None:
    with pytest.raises(FakeGpuError, match="servesweep fake-gpus init"):
        FakeGpuDir(tmp_path / "nothing").gpus()


def test_allocate_oom_and_release(gpus: FakeGpuDir, tmp_path: Path) -> None:
    truth = str(tmp_path / "truth.jsonl")
    holder = gpus.allocate({1: 600 * MiB}, release_delay_s=0.5, truth=truth)
    usage = gpus.usage()
    assert usage[1].used_bytes == 610 * MiB and usage[0].used_bytes == 10 * MiB
    assert [h.pid for h in usage[1].holders] == [os.getpid()]
    with pytest.raises(FakeOutOfMemory) as exc:
        gpus.allocate({0: 100 * MiB, 1: 400 * MiB})
    assert exc.value.gpu == 1 and exc.value.free == 390 * MiB
    assert "Tried to allocate 400.00 MiB. GPU 1 has a total capacity of 1000.00 MiB" in str(
        exc.value
    )
    with pytest.raises(FakeGpuError, match="invalid device ordinal"):
        gpus.allocate({7: 1})
    release_at = holder.release()
    exited = holder.exited_at
    assert exited is not None and release_at == pytest.approx(exited + 0.5)
    held = gpus.usage(now=exited + 0.4)[1]
    assert held.used_bytes == 610 * MiB and held.holders == ()  # held, not listed
    assert gpus.usage(now=exited + 0.51)[1].used_bytes == 10 * MiB
    # Released memory stays counted for allocations until the delay passes.
    with pytest.raises(FakeOutOfMemory):
        gpus.allocate({1: 500 * MiB})
    (event,) = [e for e in read_truth(truth) if e["event"] == "memory_released"]
    assert event["t"] == pytest.approx(release_at)


def _write_holding(gpus: FakeGpuDir, name: str, **fields: object) -> str:
    path = os.path.join(gpus.holders_path, name)
    with open(path, "w") as f:
        json.dump(fields, f)
    return path


def test_reused_pid_is_an_exited_holder(gpus: FakeGpuDir, tmp_path: Path) -> None:
    truth = str(tmp_path / "truth.jsonl")
    path = _write_holding(
        gpus,
        f"{os.getpid()}.1.json",
        pid=os.getpid(),
        start_time=own_start_time() - 1,  # another process that had our PID
        memory={"0": 300 * MiB},
        release_delay_s=1.0,
        truth=truth,
    )
    beat = time.time() - 0.5
    os.utime(path, (beat, beat))
    (h,) = gpus.holdings()
    assert not h.alive and h.exit_time == pytest.approx(beat)
    assert h.release_at == pytest.approx(beat + 1.0)
    assert gpus.usage(now=beat + 0.9)[0].used_bytes == 310 * MiB
    assert gpus.usage(now=beat + 1.01)[0].used_bytes == 10 * MiB
    os.utime(path, (beat - 1, beat - 1))  # long gone: collect removes it
    assert gpus.collect() == 1
    assert gpus.holdings() == []
    events = {e["event"]: e for e in read_truth(truth)}
    assert events["exit"]["inferred"] is True
    assert events["memory_released"]["t"] == pytest.approx(beat - 1 + 1.0)


def test_unreadable_holder_files_are_ignored(gpus: FakeGpuDir) -> None:
    with open(os.path.join(gpus.holders_path, "junk.json"), "w") as f:
        f.write("{not json")
    assert gpus.holdings() == []


def test_heartbeat_refreshes_mtime(gpus: FakeGpuDir) -> None:
    holder = gpus.allocate({0: MiB})
    os.utime(holder.path, (1, 1))
    holder.start_heartbeat(0.01)
    time.sleep(0.05)
    assert os.stat(holder.path).st_mtime > time.time() - 1
    holder.release(log_truth=False)
    mtime = os.stat(holder.path).st_mtime
    time.sleep(0.05)
    assert os.stat(holder.path).st_mtime == mtime  # the heartbeat stopped


def test_a_holder_in_another_pid_namespace_is_named_by_the_pid_we_see() -> None:
    from servesweep.fakegpu.procinfo import host_pid, own_pid_ns, own_start_time

    me = os.getpid()
    assert own_pid_ns().startswith("pid:[")
    # our own namespace: the PID as written
    assert host_pid(own_pid_ns(), me, own_start_time()) == me
    # a namespace no process here is in: not visible (exited, or not below ours)
    assert host_pid("pid:[1]", me, own_start_time()) is None
