"""The metric catalog: every number servesweep measures, in one place.

The producers (the load generator's :mod:`servesweep.bench.metrics`, the GPU
telemetry, the acceptance length of speculative decoding, the evals, the trial's
phase times) store their numbers under the names of this catalog, and the
consumers (constraints and objectives in :mod:`servesweep.spec.constraints`, the
reports' :mod:`servesweep.decide.refs`) accept exactly these names.
tests/unit/test_metric_catalog.py runs the producers and checks both directions;
the catalog in docs/sweep-file.md is generated from :func:`catalog_markdown` and
docs/metrics.md is checked against it.

A metric has a :class:`Scope` (where it is measured, which decides how a reference
names it), a unit, the direction that is better, and a one-line description.
Latency statistics are a family: :func:`latency` forms ``{kind}_{stat}_ms`` from a
:class:`Latency` and a :class:`Stat`; a phase's seconds are :func:`phase_metric`.

To add a metric: add one :class:`Metric` to the catalog below (or a member to
:class:`Latency`/:class:`Stat`), store it under ``metric.name`` in its producer, and
regenerate the docs block (``.venv/bin/python dev/metric-catalog-docs.py``). Nothing
here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from servesweep.models import PHASES, Phase

__all__ = [
    "ACCEPTANCE_LENGTH",
    "ACHIEVED_RATE",
    "CAPACITY",
    "CAPACITY_ATTAINMENT",
    "CAPACITY_LEVELS",
    "CAPACITY_METRICS",
    "CAPACITY_OUTPUT_THROUGHPUT",
    "CATALOG",
    "CLIENT_HEALTH",
    "COMPLETED",
    "COMPLETION_TOKENS_MEAN",
    "CONCURRENCY_MEAN",
    "COST_PER_MTOK",
    "DOCS_BEGIN",
    "DOCS_END",
    "DOCS_FILE",
    "DURATION_S",
    "ERROR_RATE",
    "EVAL_ERRORS",
    "EVAL_ERROR_RATE",
    "EVAL_METRICS",
    "FAILED",
    "GOODPUT",
    "GPUS",
    "GPU_MEM_USED_MAX_MIB",
    "GPU_POWER_MEAN_W",
    "GPU_UTIL_MEAN_PCT",
    "INPUT_THROUGHPUT",
    "LEVEL_METRICS",
    "LOOP_LAG_P99_MS",
    "OUTPUT_THROUGHPUT",
    "PASSED",
    "PASS_RATE",
    "PROMPT_TOKENS_MEAN",
    "REQUEST_THROUGHPUT",
    "SCHEDULE_LAG_P99_MS",
    "TIMED_PHASES",
    "TOKENS_PER_CHUNK_MEAN",
    "TOKENS_PER_DOLLAR",
    "TOTAL",
    "TOTAL_TOKEN_THROUGHPUT",
    "TRIAL_METRICS",
    "Better",
    "Latency",
    "Metric",
    "Scope",
    "Stat",
    "catalog_markdown",
    "latency",
    "lookup",
    "metrics_of",
    "names_of",
    "phase_metric",
    "phase_of",
    "replace_docs_block",
]


class Scope(str, Enum):
    """Where a metric is measured, and so how a metric reference names it."""

    LEVEL = "level"
    """One load level of a load workload: ``WORKLOAD.LEVEL.METRIC``."""
    EVAL = "eval"
    """An eval workload (it has no levels): ``WORKLOAD.METRIC``."""
    CAPACITY = "capacity"
    """A capacity workload (its levels vary per trial): ``WORKLOAD.METRIC``."""
    TRIAL = "trial"
    """The trial itself, once per trial: ``METRIC``."""


class Better(str, Enum):
    """Which direction of a metric is an improvement."""

    HIGHER = "higher"
    LOWER = "lower"
    NEITHER = "neither"
    """A fact about the run (a count, a token length), not a goal."""


@dataclass(frozen=True)
class Metric:
    """One entry of the catalog."""

    name: str
    """The stored name (``ttft_p99_ms``), the last part of a metric reference."""
    scope: Scope
    unit: str
    """``ms``, ``s``, ``req/s``, ``tokens/s``, ``tokens``, ``requests``, ``fraction``..."""
    better: Better
    description: str
    """One line: what it measures."""
    absent: str = ""
    """When a level (or trial) has no value for it, e.g. ``in closed loop``; empty:
    always produced."""


class Latency(str, Enum):
    """Per-request (or per-token) latencies; each has every :class:`Stat` in ms."""

    TTFT = "ttft"
    TPOT = "tpot"
    ITL = "itl"
    E2E = "e2e"
    CHUNK_GAP = "chunk_gap"

    @property
    def description(self) -> str:
        return _LATENCY_WORDS[self]


class Stat(str, Enum):
    """Summary statistics of a latency over the completed requests of a level."""

    MEAN = "mean"
    MEDIAN = "median"
    P90 = "p90"
    P99 = "p99"
    MAX = "max"


_LATENCY_WORDS: dict[Latency, str] = {
    Latency.TTFT: "time to first token",
    Latency.TPOT: "time per output token after the first",
    Latency.ITL: "inter-token latency, per token",
    Latency.E2E: "end-to-end latency of a request",
    Latency.CHUNK_GAP: "gap between consecutive streamed chunks",
}

_H, _L, _N = Better.HIGHER, Better.LOWER, Better.NEITHER
_LEVEL, _EVAL = Scope.LEVEL, Scope.EVAL

COMPLETED = Metric("completed", _LEVEL, "requests", _N, "requests that succeeded")
FAILED = Metric("failed", _LEVEL, "requests", _L, "requests that failed")
ERROR_RATE = Metric("error_rate", _LEVEL, "fraction", _L, "failed / sent")
DURATION_S = Metric("duration_s", _LEVEL, "s", _N, "wall time of the level")
REQUEST_THROUGHPUT = Metric(
    "request_throughput", _LEVEL, "req/s", _H, "completed requests per second"
)
OUTPUT_THROUGHPUT = Metric(
    "output_throughput", _LEVEL, "tokens/s", _H, "generated tokens per second"
)
INPUT_THROUGHPUT = Metric("input_throughput", _LEVEL, "tokens/s", _H, "prompt tokens per second")
TOTAL_TOKEN_THROUGHPUT = Metric(
    "total_token_throughput", _LEVEL, "tokens/s", _H, "prompt + generated tokens per second"
)
GOODPUT = Metric(
    "goodput", _LEVEL, "req/s", _H, "requests per second that met the workload's `slo`"
)
PROMPT_TOKENS_MEAN = Metric(
    "prompt_tokens_mean",
    _LEVEL,
    "tokens",
    _N,
    "mean prompt tokens per request",
    "when no completed request reported its prompt tokens",
)
COMPLETION_TOKENS_MEAN = Metric(
    "completion_tokens_mean",
    _LEVEL,
    "tokens",
    _N,
    "mean generated tokens per request",
    "when no request completed",
)
CONCURRENCY_MEAN = Metric(
    "concurrency_mean", _LEVEL, "requests", _N, "mean requests really in flight"
)
ACHIEVED_RATE = Metric(
    "achieved_rate", _LEVEL, "req/s", _N, "request rate actually sent", "in closed loop"
)
TOKENS_PER_CHUNK_MEAN = Metric(
    "tokens_per_chunk_mean",
    _LEVEL,
    "tokens",
    _N,
    "tokens per streamed chunk (above 1 with speculative decoding)",
    "when no streamed request completed",
)
ACCEPTANCE_LENGTH = Metric(
    "acceptance_length",
    _LEVEL,
    "tokens",
    _H,
    "mean tokens per speculative step (from engine counters when available)",
    "without engine counters and without streamed token counts",
)
SCHEDULE_LAG_P99_MS = Metric(
    "schedule_lag_p99_ms",
    _LEVEL,
    "ms",
    _L,
    "p99 lateness of sends against the plan (the client's own health)",
)
LOOP_LAG_P99_MS = Metric(
    "loop_lag_p99_ms",
    _LEVEL,
    "ms",
    _L,
    "p99 event-loop lag of the load generator (the client's own health)",
    "when the level ended before the first 5 ms sample",
)
CLIENT_HEALTH = frozenset({SCHEDULE_LAG_P99_MS.name, LOOP_LAG_P99_MS.name})
"""Metrics of the load generator's own health (how well it measured), not of the
server: reports keep them apart from the configuration's figures."""
GPU_MEM_USED_MAX_MIB = Metric(
    "gpu_mem_used_max_mib",
    _LEVEL,
    "MiB",
    _N,
    "highest GPU memory used during the level",
    "without a GPU probe",
)
GPU_UTIL_MEAN_PCT = Metric(
    "gpu_util_mean_pct", _LEVEL, "%", _N, "mean GPU utilization", "without a GPU probe"
)
GPU_POWER_MEAN_W = Metric(
    "gpu_power_mean_w", _LEVEL, "W", _N, "mean GPU power draw", "without a GPU probe"
)

_PRICED = "without `cost` in the sweep file, a GPU count or generated tokens"
COST_PER_MTOK = Metric(
    "cost_per_mtok",
    _LEVEL,
    "currency/Mtok",
    _L,
    "cost of a million generated tokens: `cost.gpu_hour` x GPUs / output throughput",
    _PRICED,
)
TOKENS_PER_DOLLAR = Metric(
    "tokens_per_dollar",
    _LEVEL,
    "tokens/currency",
    _H,
    "generated tokens per unit of `cost.currency` (1 / cost per token)",
    _PRICED,
)

PASS_RATE = Metric("pass_rate", _EVAL, "fraction", _H, "passed / total samples")
PASSED = Metric("passed", _EVAL, "samples", _H, "samples whose answer passed")
TOTAL = Metric("total", _EVAL, "samples", _N, "samples run (tasks x samples)")
EVAL_ERRORS = Metric(
    "errors", _EVAL, "samples", _L, "samples whose request failed (they count as not passed)"
)
EVAL_ERROR_RATE = Metric("error_rate", _EVAL, "fraction", _L, "errors / total samples")

_CAP = Scope.CAPACITY
CAPACITY = Metric(
    "capacity",
    _CAP,
    "req/s or requests",
    _H,
    "highest load (rate or concurrency) at which the SLO held for the workload's quantile "
    "of requests; 0 when it failed at `low`",
)
CAPACITY_LEVELS = Metric("capacity_levels", _CAP, "levels", _L, "load levels measured")
CAPACITY_ATTAINMENT = Metric(
    "capacity_attainment", _CAP, "fraction", _H, "requests that met the SLO at the capacity"
)
CAPACITY_OUTPUT_THROUGHPUT = Metric(
    "capacity_output_throughput",
    _CAP,
    "tokens/s",
    _H,
    "generated tokens per second at the capacity",
)

TIMED_PHASES: tuple[Phase, ...] = tuple(p for p in PHASES if p is not Phase.DONE)
"""The lifecycle phases whose seconds a trial records (``done`` is an end, not a span)."""


GPUS = Metric(
    "gpus",
    Scope.TRIAL,
    "GPUs",
    _L,
    "GPUs the trial held (`minimize: gpus`: the fewest that meet the constraints)",
    "when the sweep file names no GPUs and none was seen",
)


def _latency_metric(kind: Latency, stat: Stat) -> Metric:
    return Metric(
        f"{kind.value}_{stat.value}_ms",
        _LEVEL,
        "ms",
        _L,
        f"{stat.value} {kind.description}",
        "when no request completed"
        if kind is Latency.E2E
        else "when no streamed request completed",
    )


def _phase_metric(phase: Phase) -> Metric:
    return Metric(f"{phase.value}_s", Scope.TRIAL, "s", _L, f"seconds the {phase.value} phase took")


_NAMED: tuple[Metric, ...] = (
    COMPLETED,
    FAILED,
    ERROR_RATE,
    DURATION_S,
    REQUEST_THROUGHPUT,
    OUTPUT_THROUGHPUT,
    INPUT_THROUGHPUT,
    TOTAL_TOKEN_THROUGHPUT,
    GOODPUT,
    PROMPT_TOKENS_MEAN,
    COMPLETION_TOKENS_MEAN,
    CONCURRENCY_MEAN,
    ACHIEVED_RATE,
    TOKENS_PER_CHUNK_MEAN,
    ACCEPTANCE_LENGTH,
    SCHEDULE_LAG_P99_MS,
    LOOP_LAG_P99_MS,
    GPU_MEM_USED_MAX_MIB,
    GPU_UTIL_MEAN_PCT,
    GPU_POWER_MEAN_W,
    COST_PER_MTOK,
    TOKENS_PER_DOLLAR,
    PASS_RATE,
    PASSED,
    TOTAL,
    EVAL_ERRORS,
    EVAL_ERROR_RATE,
    CAPACITY,
    CAPACITY_LEVELS,
    CAPACITY_ATTAINMENT,
    CAPACITY_OUTPUT_THROUGHPUT,
)

_LATENCIES: dict[tuple[Latency, Stat], Metric] = {
    (kind, stat): _latency_metric(kind, stat) for kind in Latency for stat in Stat
}
_PHASES: dict[Phase, Metric] = {phase: _phase_metric(phase) for phase in TIMED_PHASES}

CATALOG: tuple[Metric, ...] = (*_NAMED, *_LATENCIES.values(), *_PHASES.values(), GPUS)
"""Every metric, in documentation order."""

_BY_KEY: dict[tuple[Scope, str], Metric] = {(m.scope, m.name): m for m in CATALOG}


def latency(kind: Latency, stat: Stat) -> Metric:
    """The metric of one statistic of one latency: ``latency(Latency.TTFT, Stat.P99)``
    is ``ttft_p99_ms``."""
    return _LATENCIES[(kind, stat)]


def phase_metric(phase: Phase) -> Metric:
    """The seconds a lifecycle phase took: ``phase_metric(Phase.LOAD)`` is ``load_s``.
    Raises KeyError for ``done``."""
    return _PHASES[phase]


def phase_of(name: str) -> Phase | None:
    """The phase a trial metric times (``load_s`` -> ``Phase.LOAD``), or None."""
    for phase, metric in _PHASES.items():
        if metric.name == name:
            return phase
    return None


def lookup(name: str, scope: Scope) -> Metric | None:
    """The catalog's entry for ``name`` in ``scope``, or None."""
    return _BY_KEY.get((scope, name))


def metrics_of(scope: Scope) -> Iterator[Metric]:
    """The metrics of one scope, in catalog order."""
    return (m for m in CATALOG if m.scope is scope)


def names_of(scope: Scope) -> frozenset[str]:
    return frozenset(m.name for m in metrics_of(scope))


LEVEL_METRICS: frozenset[str] = names_of(Scope.LEVEL)
"""Names of the metrics of one load level (``WORKLOAD.LEVEL.METRIC``)."""
EVAL_METRICS: frozenset[str] = names_of(Scope.EVAL)
"""Names of the metrics of an eval workload (``WORKLOAD.METRIC``)."""
CAPACITY_METRICS: frozenset[str] = names_of(Scope.CAPACITY)
"""Names of the metrics of a capacity workload (``WORKLOAD.METRIC``)."""
TRIAL_METRICS: frozenset[str] = names_of(Scope.TRIAL)
"""Names of the trial metrics: the seconds each lifecycle phase took and the GPUs
the trial held (``METRIC``)."""


# ---- the catalog as documentation ------------------------------------------------

DOCS_BEGIN = "<!-- metric catalog: generated by dev/metric-catalog-docs.py -->"
DOCS_END = "<!-- end of the generated metric catalog -->"
DOCS_FILE = "docs/sweep-file.md"


def _row(name: str, metric: Metric) -> str:
    absent = f"; absent {metric.absent}" if metric.absent else ""
    return f"| {name} | {metric.unit} | {metric.better.value} | {metric.description}{absent} |"


def catalog_markdown() -> str:
    """The catalog as the Markdown block between :data:`DOCS_BEGIN` and :data:`DOCS_END`."""
    head = ["| metric | unit | better | meaning |", "|---|---|---|---|"]
    out = [DOCS_BEGIN, "", "**Per level of a load workload** (`WORKLOAD.LEVEL.METRIC`):", ""]
    out += head
    out += [_row(f"`{m.name}`", m) for m in _NAMED if m.scope is Scope.LEVEL]
    kinds = ", ".join(f"`{k.value}` ({k.description})" for k in Latency)
    stats = ", ".join(f"`{s.value}`" for s in Stat)
    sample = _LATENCIES[(Latency.TTFT, Stat.P99)]
    out.append(
        f"| `{{kind}}_{{stat}}_ms` | ms | lower | latency statistics over the completed "
        f"requests, for `kind` in {kinds} and `stat` in {stats} — e.g. `{sample.name}` "
        f"(`e2e_*` absent when no request completed, the others when no streamed "
        "request completed) |"
    )
    out += ["", "**Per eval workload** (`WORKLOAD.METRIC`):", ""]
    out += head
    out += [_row(f"`{m.name}`", m) for m in metrics_of(Scope.EVAL)]
    out += ["", "**Per capacity workload** (`WORKLOAD.METRIC`):", ""]
    out += head
    out += [_row(f"`{m.name}`", m) for m in metrics_of(Scope.CAPACITY)]
    out += [
        "",
        "**Per trial** (`METRIC`): the seconds each lifecycle phase took, the GPUs it held.",
        "",
    ]
    out += head
    out += [_row(f"`{m.name}`", m) for m in metrics_of(Scope.TRIAL)]
    out += ["", DOCS_END]
    return "\n".join(out)


def replace_docs_block(text: str) -> str:
    """``text`` with its generated block replaced by the current catalog."""
    start = text.index(DOCS_BEGIN)
    end = text.index(DOCS_END, start) + len(DOCS_END)
    return text[:start] + catalog_markdown() + text[end:]
