"""A run's hold on the ports and GPUs of a machine: leases no other run can take.

A lease is an exclusive ``flock`` on one file per resource in a directory shared by
every servesweep of the machine (``SERVESWEEP_LEASE_DIR``, default
``/tmp/servesweep-leases``): ``gpu-nvml-3``, ``gpu-fake-<digest of the fake GPU
directory>-0``, ``port-18400-net<ns>``. A port's files name the network namespace (a
port of another namespace is another port) and the address its servers listen on: a
run on one address holds ``port-P-net<ns>`` shared and ``port-P-net<ns>-<address>``
exclusive, a run on every address (``0.0.0.0``) holds ``port-P-net<ns>`` exclusive;
so two runs on two addresses of one machine (two nodes of a test cluster) share a
port number, and no other two runs do. The lock belongs to the open file of the live
process that took it, so it ends with that process however it ends (SIGKILL
included): a lease is never stale, and a file left in the directory means nothing by
itself. While it holds the lock, the holder writes who it is (its sweep, results
database, pid, machine) into the file, for the message a second run shows.

A run takes every lease it needs before it starts anything, all or none
(:meth:`Lease.take`), and keeps them until it ends (:meth:`Lease.release`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "LEASE_DIR_ENV",
    "Busy",
    "Holder",
    "Lease",
    "Resource",
    "flock_holder",
    "gpu_resources",
    "lease_dir",
    "port_resource",
    "resources_for",
]

LEASE_DIR_ENV = "SERVESWEEP_LEASE_DIR"
DEFAULT_LEASE_DIR = "/tmp/servesweep-leases"
_WAIT_POLL_S = 0.2


def lease_dir() -> Path:
    """The machine's lease directory (``SERVESWEEP_LEASE_DIR`` or the default)."""
    return Path(os.environ.get(LEASE_DIR_ENV) or DEFAULT_LEASE_DIR)


@dataclass(frozen=True)
class Resource:
    """One port or GPU of a machine."""

    name: str
    """The lease file's name: ``port-18400``, ``gpu-nvml-3``."""
    label: str
    """For people: ``port 18400``, ``GPU 3``."""
    kind: str = "port"
    """``port`` or ``gpu``: what a message tells the user to change."""
    host: str = ""
    """A port's listening address ("": every address)."""


_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


def port_resource(port: int, host: str = "") -> Resource:
    """Port ``port`` as servers listening on ``host`` use it."""
    address = "" if host in _WILDCARDS else host.strip("[]")
    if address == "localhost":
        address = "127.0.0.1"
    return Resource(f"port-{port}", f"port {port}", "port", address)


def gpu_resources(gpus: Iterable[int], fake_gpu_dir: str | None) -> list[Resource]:
    """The GPUs ``gpus``: NVML's indexes are the machine's, fake GPUs are those of
    their directory (two sweeps on different fake GPUs never share one)."""
    if fake_gpu_dir:
        real = os.path.realpath(fake_gpu_dir)
        digest = hashlib.sha256(real.encode()).hexdigest()[:12]
        return [Resource(f"gpu-fake-{digest}-{g}", f"fake GPU {g} of {real}", "gpu") for g in gpus]
    return [Resource(f"gpu-nvml-{g}", f"GPU {g}", "gpu") for g in gpus]


def resources_for(
    ports: Sequence[int],
    gpus: Sequence[int],
    backend: str,
    fake_gpu_dir: str | None,
    host: str = "",
) -> list[Resource]:
    """What a run holds on one machine: its slots' ports (its servers listening on
    ``host``) and its GPU pool (none for ``gpu_backend: none``)."""
    out = [port_resource(p, host) for p in ports]
    if backend != "none":
        out += gpu_resources(gpus, fake_gpu_dir if backend in ("fake", "auto") else None)
    return out


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, as the holder wrote it (``pid`` alone when it could not)."""

    pid: int
    """The run's servesweep process (on ``host``)."""
    sweep: str = ""
    store: str = ""
    host: str = ""
    lock_pid: int = 0
    """The process holding the lock on this machine (a Ray node's holder for a run
    elsewhere); 0 when it is ``pid``."""

    def describe(self) -> str:
        """``sweep 'quickstart' (results /x/servesweep.db, servesweep pid 12 on host)``."""
        where = f" on {self.host}" if self.host else ""
        if not self.sweep and not self.store:
            return f"servesweep pid {self.pid}{where}"
        return (
            f"sweep {self.sweep!r} (results {self.store or '?'}, servesweep pid {self.pid}{where})"
        )


@dataclass(frozen=True)
class Busy:
    """A resource another process holds."""

    resource: Resource
    holder: Holder


class Lease:
    """The leases one run holds on this machine (see the module doc)."""

    def __init__(self, owner: Holder, directory: Path | None = None) -> None:
        self.owner = owner
        self.directory = directory or lease_dir()
        self._held: dict[str, list[int]] = {}
        self._netns = _netns()

    @property
    def held(self) -> tuple[str, ...]:
        return tuple(sorted(self._held))

    def take(self, resources: Sequence[Resource]) -> Busy | None:
        """Take every one of ``resources`` (those already held are kept), or none of
        them: returns the first one another process holds (None: all taken).
        OSError when the lease directory cannot be used."""
        self._prepare_dir()
        taken: list[str] = []
        for resource in sorted(resources, key=lambda r: (r.name, r.host)):
            key = self._key(resource)
            if key in self._held:
                continue
            fds: list[int] = []
            for path, exclusive in self.files_of(resource):
                fd = self._open(path)
                try:
                    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _read_holder(fd, path)
                    os.close(fd)
                    self._held[key] = fds
                    for name in [*taken, key]:
                        self._let_go(name)
                    return Busy(resource, holder)
                except BaseException:
                    os.close(fd)
                    for other in fds:
                        os.close(other)
                    raise
                fds.append(fd)
                self._write_owner(fd)
            self._held[key] = fds
            taken.append(key)
        return None

    def wait_take(
        self,
        resources: Sequence[Resource],
        on_wait: Callable[[Busy], None],
        *,
        poll_s: float = _WAIT_POLL_S,
    ) -> None:
        """Take ``resources``, waiting as long as another process holds one;
        ``on_wait`` is told each time the one waited for (or its holder) changes."""
        last: Busy | None = None
        while True:
            busy = self.take(resources)
            if busy is None:
                return
            if busy != last:
                on_wait(busy)
                last = busy
            time.sleep(poll_s)

    def release(self) -> None:
        for name in list(self._held):
            self._let_go(name)

    def _let_go(self, key: str) -> None:
        for fd in self._held.pop(key):
            os.close(fd)  # the lock ends with the open file

    def _prepare_dir(self) -> None:
        if not self.directory.is_dir():
            self.directory.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                os.chmod(self.directory, 0o1777)  # every user's runs share the machine

    def files_of(self, resource: Resource) -> list[tuple[Path, bool]]:
        """The lock files of ``resource`` on this machine, each with whether it is
        held exclusively (see the module doc)."""
        if resource.kind != "port":
            return [(self.directory / resource.name, True)]
        port = resource.name + (f"-net{self._netns}" if self._netns else "")
        if not resource.host:
            return [(self.directory / port, True)]
        return [(self.directory / port, False), (self.directory / f"{port}-{resource.host}", True)]

    def _key(self, resource: Resource) -> str:
        return self.files_of(resource)[-1][0].name

    def _open(self, path: Path) -> int:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            return os.open(path, os.O_RDONLY)  # another user's file: lockable all the same
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)
        return fd

    def _write_owner(self, fd: int) -> None:
        data = {**asdict(self.owner), "lock_pid": os.getpid()}
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(data).encode(), 0)


def _netns() -> str:
    """This process's network namespace (its inode; "" when it cannot be told)."""
    try:
        return str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        return ""


def _read_holder(fd: int, path: Path) -> Holder:
    """Who holds the lock on ``path``: what it wrote, checked against /proc/locks."""
    locker = flock_holder(str(path))
    try:
        raw = os.pread(fd, 65536, 0)
        data = json.loads(raw.decode() or "{}")
        holder = Holder(
            pid=int(data["pid"]),
            sweep=str(data.get("sweep", "")),
            store=str(data.get("store", "")),
            host=str(data.get("host", "")),
            lock_pid=int(data.get("lock_pid", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        holder = None
    if holder is not None and (locker is None or locker in (holder.lock_pid, holder.pid)):
        return holder
    # the holder has not written yet (or could not): what /proc/locks says
    return Holder(pid=locker or 0, host=socket.gethostname())


def flock_holder(path: str) -> int | None:
    """The PID holding the ``flock`` of ``path``, read from /proc/locks (None when no
    process holds it or it cannot be told); never takes the lock itself."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF" ("->" marks waiters)
        if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
            continue
        if _same_file(parts[5], want) and parts[4].isdigit():
            return int(parts[4])
    return None


def _same_file(field: str, want: str) -> bool:
    try:
        maj, minor, ino = field.split(":")
        wmaj, wmin, wino = want.split(":")
        return int(maj, 16) == int(wmaj, 16) and int(minor, 16) == int(wmin, 16) and ino == wino
    except ValueError:
        return False
