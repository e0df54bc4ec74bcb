"""Kernel limits for one sandboxed process tree: a memory and a pids cgroup, made
under servesweep's own cgroup for the run and removed after it.

The kernel charges every page to the cgroup of the process that first touches it:
anonymous memory, but also files in memory (tmpfs, ``memfd_create``, shared
memory) that no process maps, which a watch of the processes' resident memory
does not see. Above its limit the cgroup's processes get no more memory (the
kernel's OOM killer ends one of them); servesweep then ends the run as
``resource_limit``.

Both layouts are supported, per controller:

* cgroup v1 (a hierarchy per controller, also the "hybrid" layout):
  ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where swap is
  accounted), ``pids.max``;
* cgroup v2: ``memory.max``, ``memory.swap.max`` = 0, ``memory.oom.group`` = 1,
  ``pids.max``. v2 hands controllers to children only from a cgroup without
  processes of its own, so this works where servesweep's cgroup already delegates
  ``memory`` (and ``pids``) to its children, or can be made to.

Nothing is written anywhere but in the run's own cgroups, except, on v2, turning
on the two controllers for the children of servesweep's own cgroup.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import servesweep.bench.evals.leftovers as leftovers

__all__ = ["Cgroups", "Hierarchy", "RunCgroup", "find_hierarchies"]

_CONTROLLERS = ("memory", "pids")


@dataclass(frozen=True)
class Hierarchy:
    """Where the run cgroups of some controllers go: under ``base``, this
    process's own cgroup in a hierarchy of cgroup ``version`` 1 or 2."""

    version: int
    controllers: tuple[str, ...]
    base: Path


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """``(root, mount point, fs type, super options)`` of the cgroup mounts."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) >= 3 and after[0] in ("cgroup", "cgroup2"):
            root, point = fields[3], fields[4].replace("\\040", " ")
            found.append((root, point, after[0], set(after[2].split(","))))
    return found


def _membership(cgroup: str) -> dict[str, str]:
    """Controller (``""`` for the v2 hierarchy) -> this process's cgroup path."""
    paths = {}
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for name in parts[1].split(",") if parts[1] else [""]:
                paths[name] = parts[2]
    return paths


def _under(point: str, root: str, path: str) -> Path | None:
    if path != root and not path.startswith(root.rstrip("/") + "/"):
        return None  # our cgroup is outside what this mount shows
    return Path(point) / os.path.relpath(path, root)


def find_hierarchies(
    mountinfo: str | None = None, cgroup: str | None = None
) -> tuple[list[Hierarchy], str]:
    """The hierarchies that hold the memory and pids controllers for this process
    (v1 where a controller is mounted as v1, else v2), and what is missing."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    if cgroup is None:
        cgroup = Path("/proc/self/cgroup").read_text()
    mounts, member = _mounts(mountinfo), _membership(cgroup)
    hierarchies: list[Hierarchy] = []
    v2: list[str] = []
    v2_base: Path | None = None
    for root, point, kind, _ in mounts:
        if kind == "cgroup2" and "" in member and v2_base is None:
            v2_base = _under(point, root, member[""])
    missing = []
    for name in _CONTROLLERS:
        v1 = next((m for m in mounts if m[2] == "cgroup" and name in m[3]), None)
        if v1 is not None and name in member:
            base = _under(v1[1], v1[0], member[name])
            if base is not None:
                hierarchies.append(Hierarchy(1, (name,), base))
                continue
        if v2_base is not None and name in _read(v2_base / "cgroup.controllers").split():
            v2.append(name)
            continue
        missing.append(name)
    if v2 and v2_base is not None:
        hierarchies.append(Hierarchy(2, tuple(v2), v2_base))
    why = f"no {' or '.join(missing)} cgroup controller for this process" if missing else ""
    return hierarchies, why


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


class RunCgroup:
    """The cgroups of one sandboxed process tree (one directory per hierarchy)."""

    def __init__(self, dirs: list[tuple[Hierarchy, Path]]) -> None:
        self.dirs = dirs

    def join(self, pid: int) -> None:
        """Move ``pid`` in (before it starts anything: children follow it)."""
        for _, path in self.dirs:
            _write(path / "cgroup.procs", str(pid))

    def memory_hit(self) -> bool:
        """Whether the memory limit was reached (a charge failed or the OOM killer
        ended one of its processes)."""
        for hierarchy, path in self.dirs:
            if "memory" not in hierarchy.controllers:
                continue
            if hierarchy.version == 2:
                events = _read(path / "memory.events")
                if _counter(events, "max") or _counter(events, "oom_kill"):
                    return True
                continue
            if _counter(_read(path / "memory.oom_control"), "oom_kill"):
                return True
            for name in ("memory.failcnt", "memory.memsw.failcnt"):
                count = _read(path / name).strip()
                if count.isdigit() and int(count):
                    return True
        return False

    def pids(self) -> set[int]:
        found = set()
        for _, path in self.dirs:
            found |= {int(p) for p in _read(path / "cgroup.procs").split() if p.isdigit()}
        return found

    def kill(self) -> None:
        """SIGKILL every process in it (``cgroup.kill`` where the kernel has it)."""
        for hierarchy, path in self.dirs:
            if hierarchy.version == 2 and (path / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    _write(path / "cgroup.kill", "1")
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, deadline_s: float = 5.0) -> bool:
        """Kill what is left and remove the directories; False when one stays
        (a process that does not die)."""
        end = time.monotonic() + deadline_s
        left = list(self.dirs)
        while left:
            for item in list(left):
                try:
                    item[1].rmdir()
                    left.remove(item)
                except FileNotFoundError:
                    left.remove(item)
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        self.dirs = left
                        return False
            if not left:
                break
            if time.monotonic() > end:
                self.dirs = left
                return False
            self.kill()
            time.sleep(0.005)  # exiting processes leave the cgroup within moments
        self.dirs = []
        return True


class Cgroups:
    """Makes :class:`RunCgroup` s for sandbox runs; :meth:`detect` says whether it
    can here."""

    def __init__(self, hierarchies: list[Hierarchy]) -> None:
        self.hierarchies = hierarchies

    @property
    def description(self) -> str:
        """``cgroup v1`` / ``cgroup v2`` (and which controllers where)."""
        versions = sorted({h.version for h in self.hierarchies})
        return "cgroup " + "+".join(f"v{v}" for v in versions)

    @classmethod
    def detect(cls) -> tuple[Cgroups | None, str]:
        """Cgroups for runs here, or None and why not (a test cgroup is made and
        removed to be sure)."""
        try:
            hierarchies, missing = find_hierarchies()
        except OSError as exc:
            return None, f"cannot read this process's cgroups: {exc}"
        if not any("memory" in h.controllers for h in hierarchies):
            return None, missing or "no memory cgroup controller"
        for hierarchy in hierarchies:
            if hierarchy.version == 2:
                why = _delegate(hierarchy)
                if why:
                    return None, why
        cgroups = cls(hierarchies)
        try:
            probe = cgroups.create(
                f"{leftovers.owner_prefix()}probe-{os.urandom(4).hex()}", 1 << 30, 8
            )
        except OSError as exc:
            where = ", ".join(str(h.base) for h in hierarchies)
            return None, f"cannot make a cgroup under {where}: {exc.strerror or exc}"
        probe.remove()
        return cgroups, ""

    def create(self, name: str, memory_bytes: int, pids: int) -> RunCgroup:
        """A new cgroup ``name`` in every hierarchy, with the limits set."""
        made: list[tuple[Hierarchy, Path]] = []
        try:
            for hierarchy in self.hierarchies:
                path = hierarchy.base / name
                path.mkdir()
                made.append((hierarchy, path))
                _limit(hierarchy, path, memory_bytes, pids)
        except OSError:
            RunCgroup(made).remove(deadline_s=1.0)
            raise
        return RunCgroup(made)

    def clean_dead(self) -> list[Path]:
        """Remove the run cgroups whose owner is dead (see :mod:`leftovers`)."""
        removed = []
        for hierarchy in self.hierarchies:
            try:
                entries = [p for p in hierarchy.base.iterdir() if p.is_dir()]
            except OSError:
                continue
            for path in entries:
                dead = path.name.startswith(leftovers.PREFIX) and leftovers.owner_is_dead(path.name)
                if dead and RunCgroup([(hierarchy, path)]).remove(deadline_s=1.0):
                    removed.append(path)
        return removed


def _limit(hierarchy: Hierarchy, path: Path, memory_bytes: int, pids: int) -> None:
    if "pids" in hierarchy.controllers:
        _write(path / "pids.max", str(pids))
    if "memory" not in hierarchy.controllers:
        return
    if hierarchy.version == 2:
        _write(path / "memory.max", str(memory_bytes))
        for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            if (path / name).exists():
                _write(path / name, value)
        return
    _write(path / "memory.limit_in_bytes", str(memory_bytes))
    if (path / "memory.memsw.limit_in_bytes").exists():
        _write(path / "memory.memsw.limit_in_bytes", str(memory_bytes))


def _delegate(hierarchy: Hierarchy) -> str:
    """Make sure the v2 controllers reach our children; why not, if they cannot."""
    control = hierarchy.base / "cgroup.subtree_control"
    wanted = [c for c in hierarchy.controllers if c not in _read(control).split()]
    if not wanted:
        return ""
    try:
        _write(control, " ".join(f"+{c}" for c in wanted))
    except OSError as exc:
        return (
            f"cgroup v2: cannot hand {' and '.join(wanted)} to children of {hierarchy.base} "
            f"({exc.strerror or exc}); v2 allows it only for a cgroup without processes of "
            "its own (run servesweep in a cgroup of its own, e.g. a delegated systemd unit)"
        )
    return ""
