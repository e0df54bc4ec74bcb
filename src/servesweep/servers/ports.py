"""Who listens on a port, and who served one connection.

Reads ``/proc/net/tcp`` and ``/proc/net/tcp6`` (this network namespace) and maps
socket inodes to processes through ``/proc/PID/fd`` — or, for a process whose main
thread has exited while other threads still run (its ``/proc/PID/fd`` is empty then),
through its threads' ``/proc/PID/task/TID/fd``. Checking a known set of PIDs
(``owned_by``) reads only their descriptors, so the readiness gate can poll it
every few milliseconds. Several processes may listen on one port at once
(SO_REUSEPORT, or an inherited socket): every one is reported.

A listening socket whose owner cannot be found is reported with the reason: the
socket's user and the processes of that user whose descriptors may not be read here
(not dumpable, or another user's), or, when every process could be read, that the
owner runs in another PID namespace sharing this network namespace.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass

from servesweep.errors import TrialFailed
from servesweep.models import Evidence, FailureClass, ProcessInfo
from servesweep.servers import procs

__all__ = [
    "Socket",
    "check_port_free",
    "connection_inodes",
    "connection_owner",
    "listeners",
    "listening_sockets",
    "owned_by",
    "socket_owners",
]

_LISTEN = "0A"
_OWNER_WAIT = 0.5
"""How long a listening socket without a visible owner is watched (its owner may be
exiting: the socket closes a moment after the process's descriptors are gone)."""


@dataclass(frozen=True)
class Socket:
    address: str
    port: int
    remote_address: str
    remote_port: int
    state: str
    inode: int
    uid: int = -1
    """The user that created the socket (-1 when not known)."""


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
                uid = int(parts[7])
            except ValueError:
                continue
            out.append(Socket(local, lport, remote, rport, parts[3], inode, uid))
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
    return _diag(port, 1 << _TCP_LISTEN)


_TCP_CONNECTED = (1 << 12) - 1 - (1 << _TCP_LISTEN) - 1
"""Every TCP state but LISTEN (and the unused 0)."""


def _diag(port: int, states: int) -> list[Socket] | None:
    """TCP sockets in ``states`` (a bit mask of TCP state numbers) whose local port is
    ``port``, through netlink ``sock_diag``; None when netlink is not available."""
    out: list[Socket] = []
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
                req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, states)
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
                    state = f"{f[1]:02X}"
                    out.append(Socket(addr, sport, remote, dport, state, f[14], f[13]))
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


def _socket_inodes(folder: str) -> set[int] | None:
    """Socket inodes among the descriptors listed in ``folder`` (None: unreadable)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    out: set[int] = set()
    for name in names:
        try:
            target = os.readlink(f"{folder}/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def _fd_inodes(pid: int) -> set[int]:
    found = _socket_inodes(f"/proc/{pid}/fd")
    if found is None:
        return set()
    if found:
        return found
    # No descriptor at all: a process whose main thread exited lists none, while its
    # other threads (sharing one descriptor table) keep the sockets open.
    try:
        tids = [t for t in os.listdir(f"/proc/{pid}/task") if t != str(pid)]
    except OSError:
        return found
    for tid in tids:
        in_thread = _socket_inodes(f"/proc/{pid}/task/{tid}/fd")
        if in_thread:
            return in_thread
    return found


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
    listeners count). A socket whose owner cannot be found is reported as pid 0 with
    the reason in its ``cmdline``."""
    socks = listening_sockets(host, port)
    owners = socket_owners({s.inode for s in socks})
    unseen = [s for s in socks if not owners.get(s.inode)]
    deadline = time.monotonic() + _OWNER_WAIT
    while unseen and time.monotonic() < deadline:
        # Its owner may be exiting (descriptors gone, socket not closed yet): wait for
        # the socket to close or its owner to show.
        time.sleep(0.02)
        still = {s.inode for s in listening_sockets(host, port)}
        unseen = [s for s in unseen if s.inode in still]
        owners.update(socket_owners({s.inode for s in unseen}))
        unseen = [s for s in unseen if not owners.get(s.inode)]
    out: dict[int, ProcessInfo] = {}
    for sock in socks:
        for pid in owners.get(sock.inode, ()):
            out.setdefault(pid, procs.describe(pid))
    result = [out[pid] for pid in sorted(out)]
    result += [
        ProcessInfo(pid=0, state="?", cmdline=_unseen_owner(sock))
        for sock in {s.inode: s for s in unseen}.values()
    ]
    return result


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


def _unseen_owner(sock: Socket) -> str:
    """Why the owner of a listening socket cannot be named, and who it may be."""
    who = f"socket inode {sock.inode}" + (f" of {_user(sock.uid)}" if sock.uid >= 0 else "")
    hidden: list[ProcessInfo] = []
    for pid in procs.all_pids():
        if pid == os.getpid() or _socket_inodes(f"/proc/{pid}/fd") is not None:
            continue
        try:
            owner = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        if sock.uid < 0 or owner == sock.uid:
            hidden.append(procs.describe(pid))
    if hidden:
        names = "; ".join(p.describe() for p in hidden[:5])
        more = f" and {len(hidden) - 5} more" if len(hidden) > 5 else ""
        return (
            f"{who}: owner not visible, the descriptors of {len(hidden)} process(es) of that "
            f"user cannot be read here (not dumpable, or run servesweep as root or as that "
            f"user): {names}{more}"
        )
    return (
        f"{who}: no process visible here holds it; its owner runs in another PID namespace "
        "that shares this network namespace (a container started with host networking), "
        "or /proc hides other users' processes (hidepid)"
    )


def owned_by(host: str, port: int, pids: Iterable[int]) -> bool:
    """Whether one of ``pids`` holds a listening socket on ``host:port``."""
    socks = listening_sockets(host, port)
    if not socks:
        return False
    return bool(socket_owners({s.inode for s in socks}, pids))


def connection_inodes(server_port: int, client_addr: tuple[str, int]) -> set[int]:
    """Socket inodes of the server side of an open connection from ``client_addr`` to
    ``server_port``: empty while it waits in the accept queue (inode 0) and once it
    is closed. Asks netlink ``sock_diag`` (microseconds), else reads the TCP tables;
    no process's descriptors."""
    chost, cport = _normal_ip(client_addr[0]), client_addr[1]
    socks = _diag(server_port, _TCP_CONNECTED)
    if socks is None:
        socks = _sockets(server_port, listening=False)
    return {
        s.inode
        for s in socks
        if s.remote_port == cport and s.remote_address == chost and s.inode != 0
    }


def connection_owner(
    server_port: int, client_addr: tuple[str, int], pids: Iterable[int] | None = None
) -> set[int]:
    """The PIDs holding the server side of an open connection from ``client_addr``
    to ``server_port`` (empty when not accepted yet or already closed)."""
    owners = socket_owners(connection_inodes(server_port, client_addr), pids)
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


def free_port_near(
    host: str, port: int, *, avoid: Iterable[int] = (), span: int = 1, tries: int = 200
) -> int | None:
    """The first port above ``port`` where ``span`` ports in a row have no listener on
    ``host`` and none is in ``avoid`` (None when none of ``tries`` is); for messages
    that suggest another port."""
    avoided = set(avoid)
    for candidate in range(port + 1, min(65536 - span, port + 1 + tries)):
        block = range(candidate, candidate + span)
        if any(p in avoided for p in block):
            continue
        if not any(listening_sockets(host, p) for p in block):
            return candidate
    return None
