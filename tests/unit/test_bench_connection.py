"""Whether a pooled connection may be reused: its socket must have nothing to read."""

from __future__ import annotations

import os
import resource
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from servesweep.bench.connection import _peer_closed


class _Transport:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str) -> Any:
        return self.sock if name == "socket" else None


class _Proto:
    def __init__(self, sock: socket.socket) -> None:
        self.transport = _Transport(sock)


@pytest.fixture
def high_fd_limit() -> Iterator[int]:
    """Allow descriptors above 1023 (load generators at high concurrency raise it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the hard limit of open files ({hard}) keeps descriptors below 2048")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    try:
        yield 1500
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("high", [False, True])
def test_an_idle_connection_is_reusable_until_the_server_closes_or_talks(
    high: bool, request: pytest.FixtureRequest
) -> None:
    ours, theirs = socket.socketpair()
    try:
        if high:
            fd = request.getfixturevalue("high_fd_limit")
            os.dup2(ours.fileno(), fd)
            ours.close()
            ours = socket.socket(fileno=fd)
        proto: Any = _Proto(ours)
        assert not _peer_closed(proto)
        theirs.sendall(b"x")  # stray bytes: the protocol is broken
        assert _peer_closed(proto)
        ours.recv(1)
        assert not _peer_closed(proto)
        theirs.close()  # the server's FIN
        assert _peer_closed(proto)
    finally:
        ours.close()
        theirs.close()
