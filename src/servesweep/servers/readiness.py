"""The readiness gate: the *new* instance really generates.

Ready means, in order: the new instance's process tree owns a listening socket on
the port (an old process sharing the port through SO_REUSEPORT, or still shutting
down, does not count), the preset's health endpoint answers 200, and a short real
generation (``max_tokens`` 4, temperature 0) returns at least one token — served by
a process of the new instance when the connection's owner can be seen.

While waiting, the gate fails fast: the instance exited (``start_crash`` with the
exit status, or the class of a fatal line in its log, e.g. ``invalid_args``), a
fatal pattern of the preset appeared in the log, or the deadline passed
(``ready_timeout``, or ``serve_error`` when the server answered but could not
generate). Every HTTP or socket error is an observation, never an exception.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servesweep.errors import TrialFailed
from servesweep.models import Evidence, FailureClass, InstanceRecord
from servesweep.servers import logs, ports
from servesweep.servers.engines import EnginePreset
from servesweep.servers.launchers.base import ExitStatus, Launcher
from servesweep.servers.launchers.subprocess import log_marker

__all__ = [
    "HttpAnswer",
    "ProgressCallback",
    "ReadyInfo",
    "count_tokens",
    "first_model",
    "http_call",
    "wait_ready",
]

ProgressCallback = Callable[[str, float, str], None]
"""``on_progress(phase, elapsed_s, last_log_line)``; phase is ``load`` or ``ready``."""

_POLL = 0.025
_PIDS_EVERY = 0.1
_PROGRESS_EVERY = 0.5
_TAIL_EVERY = 0.5
_FATAL_WAIT = 1.0
_HTTP_TIMEOUT = 2.0
_ACCEPT_WAIT = 0.5
_GEN_TIMEOUT = 60.0
_IDLE_SILENT = 30.0
_TAIL = 40


@dataclass(frozen=True)
class ReadyInfo:
    model: str
    load_s: float
    """Seconds from start until the instance owned the listening socket."""
    ready_s: float
    """Seconds from start until the first real generation."""


class HttpAnswer:
    def __init__(self, status: int, body: bytes, served_by_other: set[int]) -> None:
        self.status = status
        self.body = body
        self.served_by_other = served_by_other

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class _LogSource:
    """New log lines of the instance: its log file, else the launcher's tail."""

    def __init__(self, launcher: Launcher, instance: InstanceRecord) -> None:
        self.launcher = launcher
        self.instance = instance
        self.watcher: logs.LogWatcher | None = None
        if instance.log_path:
            marker = log_marker(instance.invocation_id) if instance.invocation_id else None
            self.watcher = logs.LogWatcher(instance.log_path, start_after=marker)
        self.seen: list[str] = []
        self.last_tail = 0.0

    def new_lines(self, final: bool = False) -> list[str]:
        if self.watcher is not None:
            lines = self.watcher.flush() if final else self.watcher.read_new()
        else:
            now = time.monotonic()
            if not final and now - self.last_tail < _TAIL_EVERY:
                return []
            self.last_tail = now
            tail = self.launcher.log_tail(self.instance, 200)
            lines = tail
            if self.seen:
                last = self.seen[-1]
                idx = max((i for i, line in enumerate(tail) if line == last), default=-1)
                lines = tail[idx + 1 :]
        self.seen.extend(lines)
        del self.seen[: -_TAIL * 5]
        return lines

    def last_line(self) -> str:
        if self.watcher is not None:
            return self.watcher.progress().last_line
        return next((line.strip() for line in reversed(self.seen) if line.strip()), "")

    def idle_s(self) -> float | None:
        return self.watcher.progress().idle_s if self.watcher is not None else None

    def tail(self) -> tuple[str, ...]:
        if self.instance.log_path:
            return tuple(logs.tail(self.instance.log_path, _TAIL))
        return tuple(self.launcher.log_tail(self.instance, _TAIL))


def _is_local(host: str) -> bool:
    if host in ("", "localhost", "0.0.0.0", "::"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _connect_host(host: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def http_call(
    host: str,
    port: int,
    method: str,
    path: str,
    *,
    body: dict[str, Any] | None = None,
    api_key: str | None,
    timeout: float,
    ours: set[int] | None = None,
) -> HttpAnswer | str:
    """One HTTP request; an ``HttpAnswer`` or a short description of what went wrong."""
    conn = http.client.HTTPConnection(_connect_host(host), port, timeout=timeout)
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.connect()
        client = conn.sock.getsockname() if conn.sock is not None else None
        known, other = False, set[int]()
        if ours and client is not None:
            # Who accepted the connection, asked before the request: a server that
            # answers and closes at once (an old one draining) leaves nothing to see
            # afterwards.
            known, other = _accepted_by(port, client, ours)
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        payload = resp.read(1 << 20)
        if ours and client is not None and not known:
            known, other = _accepted_by(port, client, ours, wait=0.0)
        return HttpAnswer(resp.status, payload, other)
    except (OSError, http.client.HTTPException) as exc:
        return f"{method} {path}: {type(exc).__name__}: {exc}".strip()
    finally:
        conn.close()


def _accepted_by(
    port: int, client: tuple[Any, ...], ours: set[int], wait: float = _ACCEPT_WAIT
) -> tuple[bool, set[int]]:
    """(owner known, other PIDs) for the server side of the connection from ``client``:
    ``(True, set())`` when one of ``ours`` holds it, ``(True, {pid})`` for another
    process, ``(False, set())`` while nobody has accepted it yet (after ``wait``)."""
    deadline = time.monotonic() + wait
    while True:
        if ports.connection_owner(port, client, ours):
            return True, set()
        other = ports.connection_owner(port, client) - ours
        if other:
            return True, other
        if time.monotonic() >= deadline:
            return False, set()
        time.sleep(0.005)


def count_tokens(answer: HttpAnswer) -> int:
    data = answer.json()
    if not isinstance(data, dict):
        return 0
    usage = data.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    choices = data.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        text = choices[0].get("text")
        if text is None and isinstance(choices[0].get("message"), dict):
            text = choices[0]["message"].get("content")
        return 1 if text else 0
    return 0


def first_model(answer: HttpAnswer) -> str | None:
    data = answer.json()
    if isinstance(data, dict) and isinstance(data.get("data"), list) and data["data"]:
        first = data["data"][0]
        if isinstance(first, dict) and isinstance(first.get("id"), str):
            return str(first["id"])
    return None


class _Gate:
    def __init__(
        self,
        launcher: Launcher,
        instance: InstanceRecord,
        preset: EnginePreset,
        host: str,
        port: int,
        model: str | None,
        api_key: str | None,
    ) -> None:
        self.launcher = launcher
        self.instance = instance
        self.preset = preset
        self.host = host
        self.port = port
        self.model = model
        self.api_key = api_key
        self.log = _LogSource(launcher, instance)
        self.origin = instance.started_at or time.time()
        self.pids: set[int] = set()
        self.pids_at = 0.0
        self.last_error = ""
        self.answered = False
        self.endpoint = "/v1/completions"

    def elapsed(self) -> float:
        return time.time() - self.origin

    def evidence(self, message: str, **kw: Any) -> Evidence:
        kw.setdefault("log_tail", self.log.tail())
        return Evidence(message=message, log_path=self.instance.log_path, **kw)

    def check_log(self) -> None:
        match = logs.match_fatal(self.log.new_lines(), self.preset.fatal_patterns)
        if match is None:
            return
        # Let the engine finish writing (and maybe exit): a more specific line
        # (oom) often follows a generic one (Traceback).
        seen = [match.line]
        status: ExitStatus | None = None
        until = time.monotonic() + _FATAL_WAIT
        while time.monotonic() < until and status is None:
            time.sleep(_POLL)
            status = self.launcher.poll(self.instance)
            seen += self.log.new_lines()
        seen += self.log.new_lines(final=status is not None)
        best = logs.match_fatal(seen, self.preset.fatal_patterns) or match
        self.fail_fatal(best, status)

    def fail_fatal(self, match: logs.FatalMatch, status: ExitStatus | None) -> None:
        pattern = match.pattern
        what = f"; the instance exited ({status.describe()})" if status else ""
        raise TrialFailed(
            pattern.failure_class,
            self.evidence(
                f"the server log shows {pattern.reason} after {self.elapsed():.1f}s{what}",
                reason=pattern.reason,
                matched_line=match.line,
                exit_code=status.exit_code if status else None,
                signal=status.signal if status else None,
                timings={"load_s": self.elapsed()},
            ),
        )

    def check_exit(self) -> None:
        status = self.launcher.poll(self.instance)
        if status is None:
            return
        rest = self.log.new_lines(final=True)
        match = logs.match_fatal(rest, self.preset.fatal_patterns)
        if match is not None:
            self.fail_fatal(match, status)
        raise TrialFailed(
            FailureClass.START_CRASH,
            self.evidence(
                f"the instance exited while loading ({status.describe()}) after "
                f"{self.elapsed():.1f}s",
                reason="exited",
                exit_code=status.exit_code,
                signal=status.signal,
                timings={"load_s": self.elapsed()},
            ),
        )

    def refresh_pids(self) -> set[int]:
        now = time.monotonic()
        if now - self.pids_at >= _PIDS_EVERY:
            self.pids = self.launcher.pids(self.instance)
            self.pids_at = now
        return self.pids

    def owns_socket(self) -> bool:
        pids = self.refresh_pids()
        if not pids:
            # A launcher that cannot see the processes: a local listener will do, and a
            # remote server is judged by health and a real generation alone.
            return not _is_local(self.host) or bool(ports.listening_sockets(self.host, self.port))
        return ports.owned_by(self.host, self.port, pids)

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout: float = _HTTP_TIMEOUT,
    ) -> HttpAnswer | None:
        answer = http_call(
            self.host,
            self.port,
            method,
            path,
            body=body,
            api_key=self.api_key,
            timeout=timeout,
            ours=self.pids or None,
        )
        if isinstance(answer, str):
            self.last_error = answer
            return None
        if answer.served_by_other:
            self.last_error = (
                f"{method} {path} was answered by pid(s) {sorted(answer.served_by_other)}, "
                "not by the new instance"
            )
            return None
        if answer.status != 200:
            self.answered = True
            self.last_error = f"{method} {path}: HTTP {answer.status} {answer.body[:200]!r}"
            return None
        return answer

    def try_generate(self, remaining: float) -> bool:
        if self.preset.health_path and self.call("GET", self.preset.health_path) is None:
            return False
        if self.model is None:
            listing = self.call("GET", self.preset.models_path)
            self.model = first_model(listing) if listing else None
            if self.model is None:
                if listing is not None:
                    self.last_error = f"GET {self.preset.models_path}: no model listed"
                return False
        timeout = max(0.5, min(remaining, _GEN_TIMEOUT))
        body: dict[str, Any] = {"model": self.model, "max_tokens": 4, "temperature": 0}
        if self.endpoint == "/v1/completions":
            body["prompt"] = "Hello"
        else:
            body["messages"] = [{"role": "user", "content": "Hello"}]
        answer = self.call("POST", self.endpoint, {**body, **self.preset.request_extras}, timeout)
        if answer is None:
            if self.endpoint == "/v1/completions" and " HTTP 404 " in f" {self.last_error} ":
                self.endpoint = "/v1/chat/completions"
            return False
        if count_tokens(answer) < 1:
            self.answered = True
            self.last_error = f"POST {self.endpoint}: 200 without tokens {answer.body[:200]!r}"
            return False
        return True


def wait_ready(
    launcher: Launcher,
    instance: InstanceRecord,
    preset: EnginePreset,
    *,
    host: str,
    port: int,
    model: str | None,
    deadline_s: float,
    api_key: str | None = None,
    on_progress: ProgressCallback | None = None,
) -> ReadyInfo:
    """Block until the new instance generates, or raise ``TrialFailed`` (see module doc).

    ``deadline_s`` counts from this call (an adopted instance gets a full window);
    ``load_s`` and ``ready_s`` count from the instance's start (``started_at``).
    """
    gate = _Gate(launcher, instance, preset, host, port, model, api_key)
    deadline_s += max(0.0, gate.elapsed())
    phase = "load"
    load_s: float | None = None
    reported = 0.0
    attempt_at = 0.0
    backoff = _POLL
    while True:
        gate.check_log()
        gate.check_exit()
        elapsed = gate.elapsed()
        now = time.monotonic()
        if phase == "load" and gate.owns_socket():
            phase, load_s, reported = "ready", elapsed, 0.0
        if phase == "ready" and now >= attempt_at:
            if gate.try_generate(deadline_s - elapsed):
                assert gate.model is not None and load_s is not None
                if on_progress is not None:
                    on_progress("ready", gate.elapsed(), gate.log.last_line())
                return ReadyInfo(model=gate.model, load_s=load_s, ready_s=gate.elapsed())
            backoff = min(backoff * 1.5, 0.25)
            attempt_at = time.monotonic() + backoff
        if on_progress is not None and now - reported >= _PROGRESS_EVERY:
            on_progress(phase, elapsed, gate.log.last_line())
            reported = now
        if elapsed >= deadline_s:
            _timeout(gate, phase, deadline_s)
        time.sleep(_POLL)


def _timeout(gate: _Gate, phase: str, deadline_s: float) -> None:
    idle = gate.log.idle_s()
    if idle is None:
        progress = "log progress unknown"
    elif idle <= _IDLE_SILENT:
        progress = f"the log was still progressing ({idle:.0f}s since its last line)"
    else:
        progress = f"the log was silent for {idle:.0f}s (the server may hang)"
    details: dict[str, Any] = {"phase": phase, "log_idle_s": idle, "last_error": gate.last_error}
    if phase == "load":
        message = (
            f"not ready after {deadline_s:g}s: the new instance never listened on "
            f"{gate.host}:{gate.port}; {progress} — raise server.timeouts.ready if loading is slow"
        )
        raise TrialFailed(
            FailureClass.READY_TIMEOUT,
            gate.evidence(message, reason="no_listener", details=details),
        )
    if gate.answered:
        raise TrialFailed(
            FailureClass.SERVE_ERROR,
            gate.evidence(
                f"the new instance listens but no generation succeeded in {deadline_s:g}s: "
                f"{gate.last_error}",
                reason="generation_failed",
                details=details,
            ),
        )
    raise TrialFailed(
        FailureClass.READY_TIMEOUT,
        gate.evidence(
            f"not ready after {deadline_s:g}s: the instance listens but did not answer "
            f"({gate.last_error or 'no answer'}); {progress}",
            reason="no_generation",
            details=details,
        ),
    )
