"""Pure data shared by every layer: phases, outcomes, failure classes, evidence.

Nothing here does I/O. Records are frozen; state changes go through the store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

__all__ = [
    "EvalTaskResult",
    "Evidence",
    "FailureClass",
    "GpuHolder",
    "GpuState",
    "InstanceRecord",
    "LevelResult",
    "Outcome",
    "Phase",
    "ProcessInfo",
    "RequestSample",
    "ServerConfig",
    "fingerprint",
    "level_label",
    "short_cmdline",
    "usable",
]


class Phase(str, Enum):
    """Lifecycle phases of a trial, in order."""

    STOP = "stop"
    RELEASE = "release"
    START = "start"
    LOAD = "load"
    READY = "ready"
    BENCH = "bench"
    DONE = "done"


PHASES: tuple[Phase, ...] = tuple(Phase)


class Outcome(str, Enum):
    """Where a trial stands. ``pending`` and ``running`` are not final.

    ``pruned``: the trial's server came up and was measured in part, then its benchmark
    was stopped early because it could no longer win (a constraint already violated, or
    an objective that cannot reach the best so far); its evidence says why.
    """

    PENDING = "pending"
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    PRUNED = "pruned"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"

    @property
    def final(self) -> bool:
        return self in (Outcome.OK, Outcome.FAILED, Outcome.PRUNED, Outcome.SKIPPED)


class FailureClass(str, Enum):
    """Stable identifiers of why a trial failed (see DESIGN.md)."""

    INVALID_ARGS = "invalid_args"
    PORT_IN_USE = "port_in_use"
    GPU_BUSY = "gpu_busy"
    STOP_FAILED = "stop_failed"
    START_CRASH = "start_crash"
    READY_TIMEOUT = "ready_timeout"
    SERVE_ERROR = "serve_error"
    BENCH_CRASH = "bench_crash"
    BENCH_ERRORS = "bench_errors"
    NODE_LOST = "node_lost"

    @property
    def blames_config(self) -> bool:
        """Whether the failure says something about the configuration (an OOM, a bad
        flag, a server that never became ready or errs under load) rather than about
        the environment it ran in (GPUs or port taken, an unkillable old instance, a
        lost machine). A search learns only from the first kind."""
        return self not in _ENVIRONMENT_FAILURES


_CLASS_NAMES = frozenset(c.value for c in FailureClass)
"""A reason spelled as a failure class refines nothing (see ``Evidence.summary``)."""

_ENVIRONMENT_FAILURES = frozenset(
    {
        FailureClass.PORT_IN_USE,
        FailureClass.GPU_BUSY,
        FailureClass.STOP_FAILED,
        FailureClass.NODE_LOST,
    }
)


_INTERPRETERS = ("python", "bash", "sh", "node", "perl", "ruby", "java", "env", "uv", "torchrun")
_GAP = " ... "


def short_cmdline(cmdline: str, limit: int = 120) -> str:
    """``cmdline`` in at most ``limit`` characters, shortened in the middle: the
    program, and for an interpreter (python, bash, ``-m`` module...) the script or
    module it runs, are kept whole (long paths lose their leading folders first), then
    as much of the end of the line as fits."""
    if len(cmdline) <= limit:
        return cmdline
    words = cmdline.split()
    n = _head_words(words)
    head = " ".join(words[:n])
    if len(head) > limit:
        head = " ".join(_short_path(w) for w in words[:n])
    if len(head) > limit:
        keep = max(0, limit - len(_GAP.strip()))
        return _GAP.strip() + head[len(head) - keep :]
    tail = " ".join(words[n:])
    room = limit - len(head) - len(_GAP)
    if room <= 0 or not tail:
        return head
    end = tail[len(tail) - room :]
    if len(tail) > room and " " in end:
        end = end.split(" ", 1)[1]  # whole words only
    return head + _GAP + end


def _head_words(words: Sequence[str]) -> int:
    """How many leading words name the program and what it runs."""
    if not words:
        return 0
    base = words[0].rsplit("/", 1)[-1]
    if not base.startswith(_INTERPRETERS):
        return 1
    i = 1
    while i < len(words):
        word = words[i]
        if word in ("-m", "-c") and i + 1 < len(words):
            return i + 2
        if not word.startswith("-"):
            return i + 1
        i += 1
    return 1


def _short_path(word: str) -> str:
    """A long path with only its last two parts, ``.../server/holder.py``."""
    parts = word.split("/")
    if len(word) <= 40 or len(parts) <= 3:
        return word
    return ".../" + "/".join(parts[-2:])


@dataclass(frozen=True)
class GpuHolder:
    """A process that holds memory on a GPU."""

    pid: int
    used_bytes: int
    name: str = ""
    cmdline: str = ""

    def describe(self) -> str:
        mib = self.used_bytes / 2**20
        what = self.name or "?"
        return f"pid {self.pid} ({what}) {mib:.0f} MiB"


@dataclass(frozen=True)
class GpuState:
    """One GPU as a probe saw it at one moment."""

    index: int
    name: str
    total_bytes: int
    used_bytes: int
    holders: tuple[GpuHolder, ...] = ()
    utilization_pct: float | None = None
    power_w: float | None = None

    @property
    def free_bytes(self) -> int:
        return self.total_bytes - self.used_bytes


@dataclass(frozen=True)
class ProcessInfo:
    """A process as evidence: what it is and why it is still there."""

    pid: int
    state: str = ""
    wchan: str = ""
    cmdline: str = ""
    name: str = ""

    def describe(self) -> str:
        bits = [f"pid {self.pid}"]
        if self.state:
            bits.append(f"state {self.state}")
        if self.wchan:
            bits.append(f"wchan {self.wchan}")
        if self.cmdline:
            bits.append(repr(short_cmdline(self.cmdline)))
        return " ".join(bits)


@dataclass(frozen=True)
class Evidence:
    """Why a trial failed, as data a person can read and a report can render.

    ``message`` is one line; ``reason`` refines the failure class (``oom``,
    ``import_error``, ``nccl``...). Everything else is optional.
    """

    message: str
    reason: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    matched_line: str | None = None
    first_error_line: str | None = None
    """The engine's first error line in the log (its cause), quoted beside the matched
    or last line when it is another (``engine_patterns.PYTHON_ERRORS``)."""
    log_tail: tuple[str, ...] = ()
    log_path: str | None = None
    gpu_holders: tuple[GpuHolder, ...] = ()
    processes: tuple[ProcessInfo, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: ``(reason) message: "matched line" — see LOG``. A reason that only
        repeats a failure class (``invalid_args``), which is shown beside it, is left out."""
        text = self.message
        if self.reason and self.reason not in _CLASS_NAMES:
            text = f"({self.reason}) {text}"
        if self.matched_line:
            text += f': "{self.matched_line.strip()[:160]}"'
        first = (self.first_error_line or "").strip()
        if first and first != (self.matched_line or "").strip():
            text += f'; the engine\'s first error line: "{first[:160]}"'
        if self.log_path:
            text += f" — see {self.log_path}"
        return text

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["log_tail"] = list(self.log_tail)
        data["timings"] = dict(self.timings)
        data["details"] = dict(self.details)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evidence:
        return cls(
            message=str(data.get("message", "")),
            reason=data.get("reason"),
            exit_code=data.get("exit_code"),
            signal=data.get("signal"),
            matched_line=data.get("matched_line"),
            first_error_line=data.get("first_error_line"),
            log_tail=tuple(data.get("log_tail") or ()),
            log_path=data.get("log_path"),
            gpu_holders=tuple(GpuHolder(**h) for h in data.get("gpu_holders") or ()),
            processes=tuple(ProcessInfo(**p) for p in data.get("processes") or ()),
            timings=dict(data.get("timings") or {}),
            details=dict(data.get("details") or {}),
        )


@dataclass(frozen=True)
class InstanceRecord:
    """The identity of a running server instance, as stored.

    A launcher fills the fields that apply to it: ``pids``/``pgid`` for a
    subprocess, ``unit``/``invocation_id``/``cgroup`` for systemd,
    ``container_id`` for docker, ``pid_file`` for a command launcher.
    """

    launcher: str
    pids: tuple[int, ...] = ()
    pgid: int | None = None
    unit: str | None = None
    invocation_id: str | None = None
    cgroup: str | None = None
    container_id: str | None = None
    pid_file: str | None = None
    port: int | None = None
    gpus: tuple[int, ...] = ()
    log_path: str | None = None
    started_at: float | None = None
    fingerprint: str | None = None
    node: str = ""
    """Hostname of the machine the instance runs on: its PIDs, port and GPU indexes
    mean something only there."""
    node_id: str = ""
    """The cluster's id of that machine (Ray's node id) when a cluster ran it."""

    @property
    def main_pid(self) -> int | None:
        return self.pids[0] if self.pids else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["pids"] = list(self.pids)
        data["gpus"] = list(self.gpus)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InstanceRecord:
        kwargs = dict(data)
        kwargs["pids"] = tuple(kwargs.get("pids") or ())
        kwargs["gpus"] = tuple(kwargs.get("gpus") or ())
        return cls(**kwargs)


@dataclass(frozen=True)
class RequestSample:
    """One request as measured. Times are seconds on a monotonic clock, relative
    to the start of the level's run."""

    index: int
    ok: bool
    error: str | None = None
    """Error type when not ok: ``http_500``, ``timeout``, ``connection``, ``empty``..."""
    scheduled_at: float | None = None
    sent_at: float = 0.0
    first_token_at: float | None = None
    """When the first chunk carrying generated content arrived."""
    finished_at: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    chunk_gaps: tuple[float, ...] = ()
    """Gaps between content chunks after the first, in seconds."""
    chunk_tokens: tuple[int, ...] = ()
    """Tokens in each content chunk (first included)."""

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    @property
    def e2e(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.sent_at


@dataclass(frozen=True)
class LevelResult:
    """One workload at one load level (one repeat)."""

    workload: str
    level: str
    """``c8`` (concurrency 8) or ``r2.5`` (2.5 req/s); see models.level_label."""
    repeat: int
    metrics: Mapping[str, float]
    """Flat metric names, e.g. ``output_throughput``, ``ttft_p99_ms``, ``pass_rate``."""
    samples: Sequence[RequestSample] = ()
    """The level's requests (the load generator's are
    :class:`~servesweep.samples.SampleColumns`)."""
    warnings: tuple[str, ...] = ()
    info: Mapping[str, Any] = field(default_factory=dict)
    """Non-numeric facts: acceptance source, telemetry per GPU, errors by type..."""
    started_at: float = 0.0
    """Wall-clock (time.time()) start of the run."""
    duration_s: float = 0.0
    eval_results: tuple[EvalTaskResult, ...] = ()
    intervals: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """``{metric: (lo, hi)}``: the confidence interval of each key metric, computed
    from this level's own requests (see ``servesweep.decide.level_intervals``)."""
    confidence: float | None = None
    """The confidence of ``intervals`` (0.95); None when the level has none."""
    launch: int = 0
    """Which launch of the server measured it (0..launches-1; see ``launches``)."""
    unreliable: str | None = None
    """Why the load generator could not time this level (``bench.health``): its
    numbers are kept and shown, marked, but ``best``, constraints and pruning leave
    them out unless told to take them in. None: the level is reliable."""
    screening: bool = False
    """Measured in the screening pass (short levels, ``screening`` in the sweep file):
    stored apart from the full measurement, never taken for it."""


def usable(results: Iterable[LevelResult], include_unreliable: bool = False) -> list[LevelResult]:
    """The results a decision may use: the reliable ones (all with ``include_unreliable``)."""
    return [r for r in results if include_unreliable or r.unreliable is None]


@dataclass(frozen=True)
class EvalTaskResult:
    """One sample of one correctness task."""

    task_id: str
    sample: int
    status: str
    """``pass``, ``fail``, ``timeout``, ``crash``, ``resource_limit``, ``no_answer``, ``error``."""
    message: str = ""
    seconds: float = 0.0


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k).replace("_", "-"): _canonical(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def fingerprint(params: Mapping[str, Any]) -> str:
    """A stable short hash of server params: same params, same fingerprint.

    Key order does not matter, and ``a_b`` equals ``a-b`` (engines accept both).
    """
    canon = json.dumps(_canonical(params), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class ServerConfig:
    """One point in server-parameter space: the swept params of one trial."""

    params: Mapping[str, Any]
    fingerprint: str

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> ServerConfig:
        return cls(params=dict(params), fingerprint=fingerprint(params))

    def label(self) -> str:
        if not self.params:
            return "(defaults)"
        return " ".join(f"{k}={v}" for k, v in self.params.items())


def level_label(concurrency: int | None = None, rate: float | None = None) -> str:
    """The label of one load level of a workload: ``c8`` or ``r2.5`` (``inf`` rate: ``rinf``)."""
    if concurrency is not None:
        return f"c{concurrency}"
    if rate is not None:
        if rate == float("inf"):
            return "rinf"
        return f"r{rate:g}"
    return "c1"


def parse_level(label: str) -> tuple[int | None, float | None]:
    """Inverse of :func:`level_label`."""
    if label.startswith("c"):
        return int(label[1:]), None
    if label.startswith("r"):
        return None, float(label[1:])
    raise ValueError(f"not a level label: {label!r}")


def as_tuple(values: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(values)
