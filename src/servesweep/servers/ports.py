"""Who listens on a port, and who served one connection.

Reads ``/proc/net/tcp`` and ``/proc/net/tcp6`` (this network namespace) and maps
socket inodes to processes through ``/proc/PID/fd``. Checking a known set of PIDs
(``owned_by``) reads only their descriptors, so the readiness gate can poll it
every few milliseconds. Several processes may listen on one port at once
(SO_REUSEPORT, or an inherited socket): every one is reported.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from servesweep.errors import TrialFailed
from servesweep.models import Evidence, FailureClass, ProcessInfo
from servesweep.servers import procs

__all__ = [
    "Socket",
    "check_port_free",
    "connection_owner",
    "listeners",
    "listening_sockets",
    "owned_by",
    "socket_owners",
]

_LISTEN = "0A"


@dataclass(frozen=True)
class Socket:
    address: str
    port: int
    remote_address: str
    remote_port: int
    state: str
    inode: int


def _parse_addr(text: str, v6: bool) -> tuple[str, int]:
    host_hex, port_hex = text.split(":")
    port = int(port_hex, 16)
    raw = bytes.fromhex(host_hex)
    if not v6:
        return str(ipaddress.IPv4Address(raw[::-1])), port
    # Four little-endian 32-bit words.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    addr = ipaddress.IPv6Address(words)
    if addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped), port
    return str(addr), port


def _sockets() -> list[Socket]:
    out: list[Socket] = []
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            with open(path) as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10:
                continue
            try:
                local, lport = _parse_addr(parts[1], v6)
                remote, rport = _parse_addr(parts[2], v6)
                inode = int(parts[9])
            except ValueError:
                continue
            out.append(Socket(local, lport, remote, rport, parts[3], inode))
    return out


def _host_addrs(host: str) -> set[str] | None:
    """The addresses ``host`` stands for; None means "any address" (wildcard)."""
    if host in ("", "0.0.0.0", "::", "*"):
        return None
    try:
        return {str(ipaddress.ip_address(host))}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return None
    return {str(info[4][0]) for info in infos}


def _normal_ip(text: str) -> str:
    try:
        addr = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return text
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def _conflicts(listen_addr: str, wanted: set[str] | None) -> bool:
    if wanted is None or listen_addr in ("0.0.0.0", "::"):
        return True
    return listen_addr in wanted


def listening_sockets(host: str, port: int) -> list[Socket]:
    """Listening sockets on ``port`` whose address overlaps ``host``."""
    wanted = _host_addrs(host)
    return [
        s
        for s in _sockets()
        if s.state == _LISTEN and s.port == port and _conflicts(s.address, wanted)
    ]


def _fd_inodes(pid: int) -> set[int]:
    out: set[int] = set()
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"{base}/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def socket_owners(inodes: set[int], pids: Iterable[int] | None = None) -> dict[int, set[int]]:
    """``{inode: {pid, ...}}`` for the given socket inodes, searching ``pids``
    (every process when None)."""
    found: dict[int, set[int]] = {}
    if not inodes:
        return found
    for pid in procs.all_pids() if pids is None else pids:
        hit = _fd_inodes(pid) & inodes
        for inode in hit:
            found.setdefault(inode, set()).add(pid)
    return found


def listeners(host: str, port: int) -> list[ProcessInfo]:
    """Every process that holds a listening socket on ``host:port`` (wildcard
    listeners count). A socket whose owner cannot be found is reported as pid 0."""
    socks = listening_sockets(host, port)
    owners = socket_owners({s.inode for s in socks})
    out: dict[int, ProcessInfo] = {}
    for sock in socks:
        pids = owners.get(sock.inode)
        if not pids:
            out.setdefault(
                0,
                ProcessInfo(
                    pid=0, state="?", cmdline=f"socket inode {sock.inode} (owner not visible)"
                ),
            )
            continue
        for pid in pids:
            out.setdefault(pid, procs.describe(pid))
    return [out[pid] for pid in sorted(out)]


def owned_by(host: str, port: int, pids: Iterable[int]) -> bool:
    """Whether one of ``pids`` holds a listening socket on ``host:port``."""
    socks = listening_sockets(host, port)
    if not socks:
        return False
    return bool(socket_owners({s.inode for s in socks}, pids))


def connection_owner(
    server_port: int, client_addr: tuple[str, int], pids: Iterable[int] | None = None
) -> set[int]:
    """The PIDs holding the server side of an open connection from ``client_addr``
    to ``server_port`` (empty when not accepted yet or already closed)."""
    chost, cport = _normal_ip(client_addr[0]), client_addr[1]
    inodes = {
        s.inode
        for s in _sockets()
        if s.port == server_port
        and s.remote_port == cport
        and s.remote_address == chost
        and s.state != _LISTEN
        and s.inode != 0
    }
    owners = socket_owners(inodes, pids)
    return set().union(*owners.values()) if owners else set()


def check_port_free(host: str, port: int, ours: set[int]) -> None:
    """Raise ``TrialFailed(port_in_use)`` naming the owner when a process that is
    not in ``ours`` listens on ``host:port``."""
    foreign = [p for p in listeners(host, port) if p.pid not in ours]
    if not foreign:
        return
    names = "; ".join(p.describe() for p in foreign)
    raise TrialFailed(
        FailureClass.PORT_IN_USE,
        Evidence(
            message=(
                f"port {host}:{port} is already in use by {names}; stop that program or "
                "choose another server.port"
            ),
            reason="port_in_use",
            processes=tuple(foreign),
            details={"host": host, "port": port},
        ),
    )
