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
import struct
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


def _sockets(port: int, *, listening: bool) -> list[Socket]:
    """Sockets whose local port is ``port`` (only listening ones, or only the others).

    The tables can hold thousands of TIME_WAIT lines: the port and state are checked
    on the raw text before any address is parsed.
    """
    out: list[Socket] = []
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            with open(path) as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10 or (parts[3] == _LISTEN) != listening:
                continue
            try:
                if int(parts[1].rpartition(":")[2], 16) != port:
                    continue
                local, lport = _parse_addr(parts[1], v6)
                remote, rport = _parse_addr(parts[2], v6)
                inode = int(parts[9])
            except ValueError:
                continue
            out.append(Socket(local, lport, remote, rport, parts[3], inode))
    return out


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_DIAG_MSG = struct.Struct("=BBBB2s2s16s16sI8sIIIII")  # struct inet_diag_msg (72 bytes)


def _diag_listening(port: int) -> list[Socket] | None:
    """Listening TCP sockets on ``port`` through netlink ``sock_diag`` — the kernel
    filters by state, so this costs microseconds where /proc/net/tcp costs
    milliseconds on a busy host. None when netlink is not available here."""
    out: list[Socket] = []
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
                req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
                req += bytes(48)  # inet_diag_sockid: no filter
                header = struct.pack(
                    "=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, seq, 0
                )
                nl.send(header + req)
                if not _diag_read(nl, family, port, out):
                    return None
    except OSError:
        return None
    return out


def _diag_read(nl: socket.socket, family: int, port: int, out: list[Socket]) -> bool:
    while True:
        data = nl.recv(1 << 16)
        offset = 0
        while offset + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, offset)
            if kind == _NLMSG_DONE:
                return True
            if kind == _NLMSG_ERROR or length < 16:
                return False
            if length >= 16 + _DIAG_MSG.size:
                f = _DIAG_MSG.unpack_from(data, offset + 16)
                sport = int.from_bytes(f[4], "big")
                if sport == port:
                    size = 4 if family == socket.AF_INET else 16
                    addr = _normal_ip(socket.inet_ntop(family, f[6][:size]))
                    remote = _normal_ip(socket.inet_ntop(family, f[7][:size]))
                    dport = int.from_bytes(f[5], "big")
                    out.append(Socket(addr, sport, remote, dport, _LISTEN, f[14]))
            offset += (length + 3) & ~3
        if not data:
            return False


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
    socks = _diag_listening(port)
    if socks is None:
        socks = _sockets(port, listening=True)
    return [s for s in socks if _conflicts(s.address, wanted)]


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
        for s in _sockets(server_port, listening=False)
        if s.remote_port == cport and s.remote_address == chost and s.inode != 0
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
