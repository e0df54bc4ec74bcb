"""Helpers to run the simulated engine from tests and benchmarks.

``SimProcess`` starts ``python -m servesweep.sim`` on a free loopback port with a
log file and a truth file, and kills it (and any orphan worker it spawned) by PID
on ``close()``. Only the standard library is used for HTTP, so the helpers work
from any test without an event loop.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "HttpReply",
    "SimRun",
    "free_port",
    "free_port_block",
    "http_request",
    "read_truth",
    "running_sim",
    "start_sim",
]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_block(count: int, low: int = 20000, high: int = 32000) -> int:
    """The first of ``count`` consecutive TCP ports free on 127.0.0.1 right now, below
    the kernel's ephemeral range (where ``free_port`` picks), so that servers of other
    tests on this machine do not take the later ones before a sweep's slots bind them."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(low, high - count)
        if all(_free(p) for p in range(base, base + count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports in {low}-{high}")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class HttpReply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def instance(self) -> str:
        return self.headers.get("x-sim-instance", "")

    def events(self) -> list[Any]:
        """The ``data:`` payloads of an SSE body (``[DONE]`` kept as a string)."""
        out: list[Any] = []
        for line in self.body.decode().splitlines():
            if line.startswith("data: "):
                payload = line[6:]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
        return out


def http_request(
    port: int,
    path: str,
    body: Any = None,
    *,
    method: str | None = None,
    timeout: float = 10.0,
    host: str = "127.0.0.1",
) -> HttpReply:
    """One HTTP request; a refused connection raises ``ConnectionRefusedError``."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method or ("GET" if data is None else "POST"), path, data, headers)
        resp = conn.getresponse()
        payload = resp.read()
        return HttpReply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload)
    finally:
        conn.close()


def read_truth(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class SimRun:
    """A running simulated engine started by :func:`start_sim`."""

    def __init__(
        self, proc: subprocess.Popen[bytes], port: int, log_path: Path, truth_path: Path
    ) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.port = port
        self.log_path = log_path
        self.truth_path = truth_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def truth(self) -> list[dict[str, Any]]:
        return read_truth(self.truth_path)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.truth() if e["event"] == name and e.get("pid") == self.pid]

    def request(self, path: str, body: Any = None, **kw: Any) -> HttpReply:
        return http_request(self.port, path, body, **kw)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until ``/health`` says 200; fails fast (with the log) if the process exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"sim exited with {self.proc.returncode} before ready:\n{self.log()[-3000:]}"
                )
            with contextlib.suppress(OSError):
                if self.request("/health", timeout=2.0).status == 200:
                    return
            time.sleep(0.02)
        raise AssertionError(f"sim not ready after {timeout} s:\n{self.log()[-3000:]}")

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def worker_pids(self) -> list[int]:
        return [
            int(e["holder_pid"])
            for e in self.truth()
            if e["event"] == "memory_allocated" and e.get("pid") == self.pid and "holder_pid" in e
        ]

    def close(self) -> None:
        """SIGKILL the engine and its orphan workers, by PID, and reap the engine."""
        pids = [self.pid, *self.worker_pids()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def start_sim(
    args: Sequence[str],
    workdir: str | os.PathLike[str],
    *,
    port: int | None = None,
    fake_gpus: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    name: str = "sim",
) -> SimRun:
    """Start the engine on 127.0.0.1 (a free port unless given) with log and truth files.

    The caller must ``close()`` it (use :func:`running_sim` for a context manager).
    """
    work = Path(workdir)
    port = free_port() if port is None else port
    log_path = work / f"{name}-{port}-{time.time_ns()}.log"
    truth_path = work / "truth.jsonl"
    argv = [sys.executable, "-m", "servesweep.sim", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--truth", str(truth_path)]
    if fake_gpus is not None:
        argv += ["--fake-gpus", os.fspath(fake_gpus)]
    argv += list(args)
    full_env = dict(os.environ)
    full_env.pop("SERVESWEEP_FAKE_GPUS", None)
    full_env.pop("SERVESWEEP_SIM_TRUTH", None)
    full_env.update(env or {})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=full_env
        )
    return SimRun(proc, port, log_path, truth_path)


@contextlib.contextmanager
def running_sim(
    args: Sequence[str], workdir: str | os.PathLike[str], **kw: Any
) -> Iterator[SimRun]:
    run = start_sim(args, workdir, **kw)
    try:
        yield run
    finally:
        run.close()
