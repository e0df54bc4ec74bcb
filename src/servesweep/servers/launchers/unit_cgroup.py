"""Find a systemd unit's cgroup on this machine, also when systemd runs in a container.

``ControlGroup`` is relative to systemd's cgroup namespace. For the host's systemd
it lies right under the cgroup mount; for a systemd in a container (nspawn, the
test sandbox) it lies some folders deeper, and the unit's PIDs there are the
host's while ``MainPID`` is the container's; ``NSpid`` in ``/proc/PID/status``
relates the two.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["UnitCgroup", "host_pid", "ns_pid"]


class UnitCgroup:
    """Finds a unit's cgroup folder on this machine.

    ``ControlGroup`` is relative to systemd's cgroup namespace. For the host's systemd
    it lies right under the cgroup mount; for a systemd in a container (nspawn, the
    test sandbox) it lies some folders deeper. The nesting found once is remembered.
    """

    def __init__(self) -> None:
        self._prefix: dict[Path, Path] = {}

    @staticmethod
    def roots() -> list[Path]:
        """Mount points of the cgroup v2 hierarchy and of the v1 ``name=systemd`` one."""
        v2: list[Path] = []
        v1: list[Path] = []
        try:
            with open("/proc/self/mountinfo", encoding="utf-8") as fh:
                for line in fh:
                    left, _, right = line.partition(" - ")
                    fields = left.split()
                    rfields = right.split()
                    if len(fields) < 5 or len(rfields) < 3:
                        continue
                    if rfields[0] == "cgroup2":
                        v2.append(Path(fields[4]))
                    elif rfields[0] == "cgroup" and "name=systemd" in rfields[2].split(","):
                        v1.append(Path(fields[4]))
        except OSError:
            return []
        return v2 + v1

    def find(self, control_group: str, main_pid: int | None = None) -> Path | None:
        """The folder of ``control_group`` (None when no local folder matches)."""
        rel = control_group.strip("/")
        if not rel:
            return None
        if self._prefix:
            # The nesting does not change: once known, look only there.
            for prefix in self._prefix.values():
                if (prefix / rel).is_dir():
                    return prefix / rel
            return None
        for root in self.roots():
            for base in self._bases(root, rel):
                folder = base / rel
                if main_pid and not _holds(folder, main_pid):
                    continue
                self._prefix[root] = base
                return folder
        return None

    @staticmethod
    def _bases(root: Path, rel: str, depth: int = 4) -> Iterable[Path]:
        """Folders up to ``depth`` levels below ``root`` that contain ``rel``."""
        level = [root]
        for _ in range(depth + 1):
            nxt: list[Path] = []
            for base in level:
                if (base / rel).is_dir():
                    yield base
                with contextlib.suppress(OSError):
                    nxt += [
                        Path(e.path) for e in os.scandir(base) if e.is_dir(follow_symlinks=False)
                    ]
            level = nxt

    @staticmethod
    def procs(folder: Path) -> set[int]:
        """Every PID in ``folder`` and the cgroups below it."""
        out: set[int] = set()
        for dirpath, _dirs, _files in os.walk(folder):
            with contextlib.suppress(OSError), open(os.path.join(dirpath, "cgroup.procs")) as fh:
                out.update(int(x) for x in fh.read().split())
        return out


def ns_pid(pid: int) -> int | None:
    """The PID as the innermost PID namespace of the process sees it."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def _holds(folder: Path, ns: int) -> bool:
    return host_pid(folder, ns) is not None


def host_pid(folder: Path, ns: int) -> int | None:
    """The PID in ``folder`` that its innermost PID namespace calls ``ns``."""
    for pid in UnitCgroup.procs(folder):
        if pid == ns or ns_pid(pid) == ns:
            return pid
    return None
