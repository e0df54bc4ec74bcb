"""Finding servesweep's own cgroups (v1, hybrid, v2), writing a run's limits only in
the run's own cgroup, reading whether the limit was hit, and removing what dead
runs left (folders and cgroups) but nothing of a live one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servesweep.bench.evals import cgroups, leftovers
from servesweep.bench.evals.cgroups import Cgroups, Hierarchy, RunCgroup, find_hierarchies

HYBRID_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = """\
9:name=systemd:/
8:pids:/
4:memory:/process_api/f338eedf
1:cpu:/
0::/
"""


def test_hybrid_v1_layout_of_this_kind_of_machine() -> None:
    found, missing = find_hierarchies(HYBRID_MOUNTS, HYBRID_CGROUP)
    assert missing == ""
    assert found == [
        Hierarchy(1, ("memory",), Path("/sys/fs/cgroup/memory/process_api/f338eedf")),
        Hierarchy(1, ("pids",), Path("/sys/fs/cgroup/pids")),
    ]


def test_v2_layout(tmp_path: Path) -> None:
    own = tmp_path / "user.slice" / "sweep.scope"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu io memory pids\n")
    mounts = f"30 23 0:26 / {tmp_path} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    found, missing = find_hierarchies(mounts, "0::/user.slice/sweep.scope\n")
    assert missing == "" and found == [Hierarchy(2, ("memory", "pids"), own)]


def test_missing_controllers_and_foreign_cgroups_are_named(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu io\n")
    mounts = f"30 23 0:26 / {tmp_path} rw - cgroup2 cgroup2 rw\n"
    assert find_hierarchies(mounts, "0::/\n") == (
        [],
        "no memory or pids cgroup controller for this process",
    )
    # Our memory cgroup is outside what the v1 mount shows (mounted from a subtree).
    mounts = "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    found, missing = find_hierarchies(mounts, "4:memory:/other\n")
    assert found == [] and "memory" in missing


def test_limits_are_written_in_the_runs_own_cgroup_only(tmp_path: Path) -> None:
    v1_memory, v1_pids, v2 = (tmp_path / n for n in ("memory", "pids", "unified"))
    for path in (v1_memory, v1_pids, v2):
        path.mkdir()
    (v1_memory / "memory.memsw.limit_in_bytes").write_text("max")
    (v2 / "memory.swap.max").write_text("max")
    (v2 / "memory.oom.group").write_text("0")
    cgroups._limit(Hierarchy(1, ("memory",), tmp_path), v1_memory, 2 << 30, 36)
    cgroups._limit(Hierarchy(1, ("pids",), tmp_path), v1_pids, 2 << 30, 36)
    cgroups._limit(Hierarchy(2, ("memory", "pids"), tmp_path), v2, 2 << 30, 36)
    files = {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*.*")}
    assert files == {
        "memory/memory.limit_in_bytes": str(2 << 30),
        "memory/memory.memsw.limit_in_bytes": str(2 << 30),
        "pids/pids.max": "36",
        "unified/memory.max": str(2 << 30),
        "unified/memory.swap.max": "0",
        "unified/memory.oom.group": "1",
        "unified/pids.max": "36",
    }


@pytest.mark.parametrize(
    ("version", "files", "hit"),
    [
        (1, {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"}, False),
        (1, {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"}, True),
        (1, {"memory.failcnt": "0\n", "memory.memsw.failcnt": "3\n"}, True),
        (2, {"memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"}, False),
        (2, {"memory.events": "low 0\nhigh 0\nmax 2\noom 0\noom_kill 0\n"}, True),
        (2, {"memory.events": "max 0\noom 1\noom_kill 1\n"}, True),
    ],
)
def test_memory_hit(tmp_path: Path, version: int, files: dict[str, str], hit: bool) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    group = RunCgroup([(Hierarchy(version, ("memory",), tmp_path.parent), tmp_path)])
    assert group.memory_hit() is hit


def test_a_cgroup_that_cannot_be_made_is_removed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = tmp_path / "memory"
    made.mkdir()
    absent = tmp_path / "absent"
    removed: list[list[Path]] = []
    monkeypatch.setattr(
        RunCgroup, "remove", lambda self, deadline_s=5.0: removed.append([p for _, p in self.dirs])
    )
    maker = Cgroups([Hierarchy(1, ("memory",), made), Hierarchy(1, ("pids",), absent)])
    with pytest.raises(OSError):
        maker.create("servesweep-eval-run", 1 << 30, 8)
    assert removed == [[made / "servesweep-eval-run"]]


def test_v2_controllers_that_cannot_be_handed_down_are_a_reason(tmp_path: Path) -> None:
    (tmp_path / "cgroup.subtree_control").mkdir()  # writing it fails, as EBUSY would
    why = cgroups._delegate(Hierarchy(2, ("memory", "pids"), tmp_path))
    assert "cannot hand memory and pids to children" in why
    assert "without processes of its own" in why


def _dead_name(suffix: str = "x") -> str:
    """A name of this PID namespace whose owner (our pid, another start) is gone."""
    live = leftovers.owner_prefix()
    namespace, pid, start = live[len(leftovers.PREFIX) :].rstrip("-").split("-")
    return f"{leftovers.PREFIX}{namespace}-{pid}-{int(start) + 1}-{suffix}"


def test_owners() -> None:
    assert not leftovers.owner_is_dead(leftovers.owner_prefix() + "abc")
    assert leftovers.owner_is_dead(_dead_name())
    assert not leftovers.owner_is_dead("servesweep-eval-1-2-3-x"), "another PID namespace"
    assert not leftovers.owner_is_dead("servesweep-eval-abcdefgh"), "an older servesweep's"
    assert not leftovers.owner_is_dead("something-else")


def test_only_folders_of_dead_runs_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / _dead_name("run")
    (dead / "candidate").mkdir(parents=True)
    (dead / "candidate" / "job.json").write_text("{}")
    live = tmp_path / (leftovers.owner_prefix() + "run")
    live.mkdir()
    other = tmp_path / "servesweep-eval-1-2-3-x"
    other.mkdir()
    assert leftovers.clean_folders(tmp_path) == [dead]
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, other.name])


def test_only_cgroups_of_dead_runs_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / _dead_name("candidate")
    live = tmp_path / (leftovers.owner_prefix() + "judge")
    foreign = tmp_path / "system.slice"
    for path in (dead, live, foreign):
        path.mkdir()
    removed = Cgroups([Hierarchy(1, ("memory",), tmp_path)]).clean_dead()
    assert removed == [dead]
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, foreign.name])
