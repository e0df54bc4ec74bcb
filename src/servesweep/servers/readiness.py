"""The readiness gate: the *new* instance really generates.

Ready means, in order: the new instance's process tree owns a listening socket on
the port (an old process sharing the port through SO_REUSEPORT, or still shutting
down, does not count), the preset's health endpoint answers 200, and a short real
generation (``max_tokens`` 4, temperature 0, streamed and read until its first
token) returns at least one token — served by a process of the new instance when
the connection's owner can be seen.

While waiting, the gate fails fast: the instance exited (``start_crash`` with the
exit status, or the class of a fatal line in its log, e.g. ``invalid_args``), a
fatal pattern of the preset appeared in the log, the instance listens but keeps
failing every request it accepts (``serve_error`` after ``_SERVE_FAILS`` failures in
a row over at least ``_SERVE_FAIL_S`` seconds: connections reset or closed without
an answer, HTTP errors other than 503/429, answers without tokens), or the deadline
passed (``ready_timeout``, or ``serve_error`` when the server answered but could
not generate). Every request the gate makes ends by the gate's own deadline, however
slowly the server answers. Every HTTP or socket error is an observation, never an
exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servesweep.errors import TrialFailed
from servesweep.models import Evidence, FailureClass, InstanceRecord
from servesweep.servers import logs, ports
from servesweep.servers.engines import EnginePreset
from servesweep.servers.http_probe import (
    HttpAnswer,
    HttpError,
    count_tokens,
    exchange,
    first_model,
    http_call,
    is_local,
)
from servesweep.servers.launchers.base import ExitStatus, Launcher

__all__ = [
    "READY_POLL",
    "HttpAnswer",
    "PollPolicy",
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
_GEN_TIMEOUT = 60.0
_IDLE_SILENT = 30.0
_TAIL = 40
_LOG_CATCHUP = 5.0
"""How long an exited instance's log may take to catch up with its exit (a journal)."""
_SERVE_FAILS = 5
_SERVE_FAIL_S = 3.0
_LOADING_STATUS = (503, 429)
"""HTTP statuses that mean "not yet" (llama-server answers 503 while loading)."""


@dataclass(frozen=True)
class PollPolicy:
    """When the gate asks a listening instance again (health, then a generation).

    After each failed attempt the wait grows from ``first_s`` by ``growth`` up to
    ``max_s``, so a server that listens long before it can generate (llama-server
    answers 503 while it loads) is asked a few times a second at most. With
    ``log_gap_s``, a new line in the instance's log brings the next attempt forward
    to ``log_gap_s`` after the previous one (at once when that is past): engines print
    a line when they become ready (``Application startup complete.``, ``model
    loaded``), and that is when an attempt is worth making. One attempt per line at
    most, never more often than every ``log_gap_s``, and the back-off goes on growing,
    so a chatty log adds few requests. Lines about the gate's own requests (an access
    log naming the health, models or completions path) are not progress, or every
    answer would bring the next request forward."""

    first_s: float
    max_s: float
    growth: float = 1.5
    log_gap_s: float | None = 0.05


READY_POLL = PollPolicy(first_s=0.02, max_s=0.25)
"""The gate's policy: an attempt within ~50 ms of a ready line in the log, within
``max_s`` of a server that becomes ready silently."""


@dataclass(frozen=True)
class ReadyInfo:
    model: str
    load_s: float
    """Seconds from start until the instance owned the listening socket."""
    ready_s: float
    """Seconds from start until the first real generation."""


class _LogSource:
    """New log lines of the instance: its log file, else the launcher's tail."""

    def __init__(self, launcher: Launcher, instance: InstanceRecord) -> None:
        self.launcher = launcher
        self.instance = instance
        self.watcher: logs.LogWatcher | None = None
        if instance.log_path:
            tag = instance.invocation_id
            marker = logs.log_marker(tag) if tag else None
            self.watcher = logs.LogWatcher(instance.log_path, start_after=marker)
        self.seen: list[str] = []
        self.last_tail = 0.0
        self.progress = 0
        """Lines read so far that are not about the gate's own requests (an engine's
        access log: ``"GET /health HTTP/1.1" 503``); a change means the log progressed."""
        self.own_paths: tuple[str, ...] = ()

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
        self.progress += sum(1 for line in lines if not any(p in line for p in self.own_paths))
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
        paths = (preset.health_path, preset.models_path, "/v1/completions", "/v1/chat/completions")
        self.log.own_paths = tuple(p for p in paths if p)
        self.origin = instance.started_at or time.time()
        self.until = time.monotonic()
        """The gate's deadline (``time.monotonic()``); every request ends by it."""
        self.pids: set[int] = set()
        self.pids_at = 0.0
        self.last_error = ""
        self.answered = False
        self.endpoint = "/v1/completions"
        self.failures: list[tuple[float, str]] = []
        """Requests the instance accepted and then failed, in a row: (when, what)."""

    def elapsed(self) -> float:
        return time.time() - self.origin

    def evidence(self, message: str, **kw: Any) -> Evidence:
        kw.setdefault("log_tail", self.log.tail())
        return Evidence(message=message, log_path=self.instance.log_path, **kw)

    def first_error(self) -> str | None:
        """The engine's first error line in the instance's whole log (its cause)."""
        path, tag = self.instance.log_path, self.instance.invocation_id
        lines = logs.instance_lines(path, tag) if path else self.log.seen
        return logs.first_error(lines, self.preset.error_patterns)

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
        if status is not None:
            self.launcher.finish_log(self.instance, _LOG_CATCHUP)
        seen += self.log.new_lines(final=status is not None)
        best = logs.match_fatal(seen, self.preset.fatal_patterns) or match
        self.fail_fatal(best, status)

    def fail_fatal(self, match: logs.FatalMatch, status: ExitStatus | None) -> None:
        pattern = match.pattern
        what = f"; the instance exited ({status.describe()})" if status else ""
        advice = f" — {pattern.advice}" if pattern.advice else ""
        raise TrialFailed(
            pattern.failure_class,
            self.evidence(
                f"the server log has a fatal line after {self.elapsed():.1f}s{what}{advice}",
                reason=pattern.reason,
                matched_line=match.line,
                first_error_line=self.first_error(),
                exit_code=status.exit_code if status else None,
                signal=status.signal if status else None,
                timings={"load_s": self.elapsed()},
            ),
        )

    def check_exit(self) -> None:
        status = self.launcher.poll(self.instance)
        if status is None:
            return
        # Classify only once the log has caught up with the exit: a journal stores the
        # last lines (the fatal one) after systemd already reports the end.
        caught_up = self.launcher.finish_log(self.instance, _LOG_CATCHUP)
        rest = self.log.new_lines(final=True)
        match = logs.match_fatal(rest, self.preset.fatal_patterns)
        if match is not None:
            self.fail_fatal(match, status)
        last = self.log.last_line()
        raise TrialFailed(
            FailureClass.START_CRASH,
            self.evidence(
                f"the instance exited while loading ({status.describe()}) after "
                f"{self.elapsed():.1f}s"
                + (f"; its last log line: {last[:200]!r}" if last else "; its log is empty"),
                reason="exited",
                exit_code=status.exit_code,
                signal=status.signal,
                first_error_line=self.first_error(),
                timings={"load_s": self.elapsed()},
                details={} if caught_up else {"log_incomplete": True},
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
            return not is_local(self.host) or bool(ports.listening_sockets(self.host, self.port))
        return ports.owned_by(self.host, self.port, pids)

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        limit: float = _HTTP_TIMEOUT,
        until_token: bool = False,
    ) -> HttpAnswer | None:
        """One request, ended by ``limit`` seconds or the gate's deadline, whichever
        comes first; the answer when it is a 200 from the new instance."""
        answer = exchange(
            self.host,
            self.port,
            method,
            path,
            deadline=min(self.until, time.monotonic() + limit),
            body=body,
            api_key=self.api_key,
            ours=self.pids or None,
            until_token=until_token,
        )
        if isinstance(answer, HttpError):
            self.last_error = answer.text
            if answer.kind == "broken":
                self.failed(answer.text)
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
            if answer.status in _LOADING_STATUS:
                self.failures.clear()
            elif not (answer.status == 404 and path == "/v1/completions"):
                self.failed(self.last_error)
            return None
        return answer

    def failed(self, what: str) -> None:
        self.failures.append((time.monotonic(), what))

    def serving_fails(self) -> bool:
        """Whether the instance has failed every request it accepted, for long enough
        to call it broken rather than still starting."""
        if len(self.failures) < _SERVE_FAILS:
            return False
        return self.failures[-1][0] - self.failures[0][0] >= _SERVE_FAIL_S

    def try_generate(self) -> bool:
        if self.preset.health_path and self.call("GET", self.preset.health_path) is None:
            return False
        if self.model is None:
            listing = self.call("GET", self.preset.models_path)
            self.model = first_model(listing) if listing else None
            if self.model is None:
                if listing is not None:
                    self.last_error = f"GET {self.preset.models_path}: no model listed"
                return False
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
        }
        if self.preset.streams_usage:
            body["stream_options"] = {"include_usage": True}
        if self.endpoint == "/v1/completions":
            body["prompt"] = "Hello"
        else:
            body["messages"] = [{"role": "user", "content": "Hello"}]
        request = {**body, **self.preset.request_extras}
        answer = self.call("POST", self.endpoint, request, _GEN_TIMEOUT, until_token=True)
        if answer is None:
            if self.endpoint == "/v1/completions" and " HTTP 404 " in f" {self.last_error} ":
                self.endpoint = "/v1/chat/completions"
            return False
        if count_tokens(answer) < 1:
            self.answered = True
            self.last_error = f"POST {self.endpoint}: 200 but {_no_tokens(answer)}"
            self.failed(self.last_error)
            return False
        self.failures.clear()
        return True


def _no_tokens(answer: HttpAnswer) -> str:
    """What a 200 answer without a token was, in words."""
    if answer.note:
        return answer.note
    data = answer.json()
    if data is None:
        return f"the answer is not JSON: {answer.body[:200]!r}"
    if isinstance(data, dict) and data.get("error"):
        return f"the answer is an error: {str(data['error'])[:200]}"
    return f"no generated text in the answer: {answer.body[:200]!r}"


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
    poll: PollPolicy = READY_POLL,
) -> ReadyInfo:
    """Block until the new instance generates, or raise ``TrialFailed`` (see module doc).

    ``deadline_s`` counts from this call (an adopted instance gets a full window);
    ``load_s`` and ``ready_s`` count from the instance's start (``started_at``).
    ``poll``: how often a listening instance is asked again (:class:`PollPolicy`).
    """
    gate = _Gate(launcher, instance, preset, host, port, model, api_key)
    gate.until = time.monotonic() + deadline_s
    deadline_s += max(0.0, gate.elapsed())
    phase = "load"
    load_s: float | None = None
    reported = 0.0
    attempt_at = 0.0
    attempted = 0.0
    backoff = poll.first_s
    lines = 0
    while True:
        gate.check_log()
        gate.check_exit()
        elapsed = gate.elapsed()
        now = time.monotonic()
        if phase == "load" and gate.owns_socket():
            phase, load_s, reported = "ready", elapsed, 0.0
        if phase == "ready" and poll.log_gap_s is not None and gate.log.progress != lines:
            # the log progressed: ask soon, though not within log_gap_s of the last time
            attempt_at = min(attempt_at, attempted + poll.log_gap_s)
        lines = gate.log.progress
        if phase == "ready" and now >= attempt_at:
            attempted = now
            if gate.try_generate():
                assert gate.model is not None and load_s is not None
                if on_progress is not None:
                    on_progress("ready", gate.elapsed(), gate.log.last_line())
                return ReadyInfo(model=gate.model, load_s=load_s, ready_s=gate.elapsed())
            if gate.serving_fails():
                gate.check_log()
                gate.check_exit()
                _serve_error(gate)
            attempt_at = time.monotonic() + backoff
            backoff = min(backoff * poll.growth, poll.max_s)
        if on_progress is not None and now - reported >= _PROGRESS_EVERY:
            on_progress(phase, elapsed, gate.log.last_line())
            reported = now
        if time.monotonic() >= gate.until:
            _timeout(gate, phase, deadline_s)
        time.sleep(_POLL)


def _serve_error(gate: _Gate) -> None:
    first, last = gate.failures[0], gate.failures[-1]
    raise TrialFailed(
        FailureClass.SERVE_ERROR,
        gate.evidence(
            f"the new instance listens but failed all {len(gate.failures)} requests it "
            f"accepted in {last[0] - first[0]:.1f}s: {last[1]}",
            reason="generation_failed",
            details={"phase": "ready", "failures": len(gate.failures), "last_error": last[1]},
        ),
    )


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
