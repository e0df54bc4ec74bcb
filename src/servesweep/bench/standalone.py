"""``servesweep bench --url URL``: benchmark an already-running OpenAI-compatible
server without a sweep file, and render the results as a table or JSON."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pydantic
from rich import box
from rich.table import Table

from servesweep.bench.client import build_headers, get_text, make_session
from servesweep.bench.load import LoadOptions, run_workload
from servesweep.bench.target import Target
from servesweep.decide.acceptance import UNTRUSTED_MARK, AcceptanceContext
from servesweep.errors import BenchError, ConfigError
from servesweep.models import LevelResult
from servesweep.spec.schema import WorkloadSpec, workload_spec
from servesweep.spec.schema_search import UNION_TAGS

__all__ = [
    "ACCEPTANCE_SOURCES",
    "BenchServer",
    "bench_workload",
    "format_results",
    "results_as_dicts",
    "run_standalone",
]

VLLM_SPEC_COUNTERS = {
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
}


@dataclass(frozen=True)
class BenchServer:
    """The already-running server ``servesweep bench`` measures.

    ``url``: ``http://host:port`` (``/v1`` optional). ``model`` None: the first model
    ``/v1/models`` lists. ``api_key_env``: the name of the environment variable
    holding the API key (the key is never printed). ``timeout_s``: per request.
    ``spec_decode_counters`` None: vLLM's. Raises :class:`ConfigError` for a URL
    that is not http(s)."""

    url: str
    model: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 600.0
    tokenize_path: str | None = "/tokenize"
    metrics_path: str | None = "/metrics"
    spec_decode_counters: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if not self.base.startswith(("http://", "https://")):
            raise ConfigError(f"not an http(s) URL: {self.url!r}", key="--url")

    @property
    def base(self) -> str:
        """The URL without a trailing ``/`` or ``/v1``."""
        base = self.url.rstrip("/")
        return base[: -len("/v1")] if base.endswith("/v1") else base

    def api_key(self) -> str | None:
        """The API key from ``api_key_env`` (None without one); :class:`ConfigError`
        when that variable is not set."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(
                f"environment variable {self.api_key_env} is not set", key="--api-key-env"
            )
        return key


def bench_workload(**fields: Any) -> WorkloadSpec:
    """The workload of ``servesweep bench``: a :class:`WorkloadSpec` named ``bench``
    without warm-up unless ``fields`` say otherwise; ``rate`` levels replace the
    ``concurrency`` ones. Raises :class:`ConfigError` naming the bad field."""
    spec: dict[str, Any] = {"name": "bench", "warmup": 0, **fields}
    if spec.get("rate"):
        spec.pop("concurrency", None)
    try:
        return workload_spec(**spec)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in UNION_TAGS)
        raise ConfigError(str(first.get("msg", exc)), key=where or None) from exc


def run_standalone(
    server: BenchServer, workload: WorkloadSpec, options: LoadOptions | None = None
) -> list[LevelResult]:
    """Run one workload (see :func:`bench_workload`) against ``server``, as
    ``options`` say. Raises :class:`ConfigError` for bad options,
    :class:`BenchError` when the server cannot be asked at all."""
    return asyncio.run(_run(server, server.api_key(), workload, options or LoadOptions()))


async def _run(
    server: BenchServer, api_key: str | None, workload: WorkloadSpec, options: LoadOptions
) -> list[LevelResult]:
    model = server.model
    if model is None:
        model = await _first_model(server.base, api_key)
    counters = server.spec_decode_counters
    target = Target(
        base_url=server.base,
        model=model,
        api_key=api_key,
        tokenize_path=server.tokenize_path,
        metrics_path=server.metrics_path,
        spec_decode_counters=dict(VLLM_SPEC_COUNTERS if counters is None else counters),
        timeout_s=server.timeout_s,
    )
    return await run_workload(target, workload, options)


async def _first_model(base: str, api_key: str | None) -> str:
    async with make_session(30.0) as session:
        text = await get_text(session, base + "/v1/models", build_headers(api_key))
    try:
        data = json.loads(text)
        return str(data["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise BenchError(
            f"{base}/v1/models lists no model; give the model name with --model"
        ) from exc


def _f(m: Mapping[str, float], key: str, fmt: str = "{:.1f}") -> str:
    return fmt.format(m[key]) if key in m else "-"


def _pair(m: Mapping[str, float], a: str, b: str, fmt: str = "{:.1f}") -> str:
    return f"{_f(m, a, fmt)}/{_f(m, b, fmt)}"


ACCEPTANCE_SOURCES = {
    "engine_counters": "counters",
    "engine_gauge": "gauge",
    "tokens_per_chunk_estimate": "chunk est.",
}
"""How the ``accept len`` column names where an acceptance length came from."""

_ACCEPT_NOTE = (
    "accept len: speculative decoding's mean acceptance length, tokens per target forward "
    "pass (bonus token included), from the engine's counters, the engine's own gauge, or "
    "estimated from the tokens per stream chunk (chunk est., an upper bound); "
    "see docs/metrics.md"
)


def format_results(results: Sequence[LevelResult]) -> Table:
    """One row per level and repeat: requests ok/failed, throughput, latency
    percentiles (ms), tokens per chunk, acceptance length with its source
    (:data:`ACCEPTANCE_SOURCES`, marked ``?`` when measured on random-token prompts or
    with ``ignore_eos``), concurrency really in flight; below the table, each warning
    and error once, what ``accept len`` means when it is shown and why a ``?`` figure is
    not trusted."""
    several = len({r.workload for r in results}) > 1
    table = Table(title="servesweep bench", box=box.SIMPLE_HEAD, pad_edge=False)
    columns = [
        "level", "ok/err", "req/s", "out tok/s", "TTFT p50/p99", "TPOT p50",
        "ITL p50/p99", "E2E p50", "tok per chunk", "accept len", "in flight",
    ]  # fmt: skip
    if several:
        columns.insert(0, "workload")
    rows: list[list[str]] = []
    notes: list[str] = []
    untrusted: dict[str, None] = {}
    for r in results:
        m = r.metrics
        level = r.level if r.repeat == 0 else f"{r.level} #{r.repeat}"
        acc = "-"
        if "acceptance_length" in m:
            source = str(r.info.get("acceptance_source") or "")
            acc = f"{m['acceptance_length']:.2f} {ACCEPTANCE_SOURCES.get(source, source)}".rstrip()
            ctx = AcceptanceContext.of_info(r.info)
            if ctx is not None and ctx.caveat is not None:
                acc += f" {UNTRUSTED_MARK}"
                untrusted.setdefault(f"{UNTRUSTED_MARK} ({ctx.describe()}): {ctx.caveat}", None)
        row = [
            level,
            _pair(m, "completed", "failed", "{:.0f}"),
            _f(m, "request_throughput", "{:.2f}"),
            _f(m, "output_throughput", "{:.0f}"),
            _pair(m, "ttft_median_ms", "ttft_p99_ms"),
            _f(m, "tpot_median_ms", "{:.2f}"),
            _pair(m, "itl_median_ms", "itl_p99_ms", "{:.2f}"),
            _f(m, "e2e_median_ms", "{:.0f}"),
            _f(m, "tokens_per_chunk_mean", "{:.2f}"),
            acc,
            _f(m, "concurrency_mean", "{:.1f}"),
        ]
        if several:
            row.insert(0, r.workload)
        rows.append(row)
        name = f"{r.workload} {level}" if several else level
        if r.unreliable:
            notes.append(f"{name}: unreliable: {r.unreliable}; raise --workers")
        notes += [f"{name}: {w}" for w in r.warnings]
        for kind, count in (r.info.get("errors") or {}).items():
            example = (r.info.get("error_examples") or {}).get(kind, "")
            notes.append(f"{name}: {count} x {kind} {example[:120]}".rstrip())
    for i, col in enumerate(columns):
        width = max([len(row[i]) for row in rows] + [3])  # numbers stay whole, headers wrap
        justify: Literal["left", "right"] = "left" if col in ("workload", "level") else "right"
        table.add_column(col, justify=justify, min_width=width, no_wrap=False)
    for row in rows:
        table.add_row(*row)
    if any("acceptance_length" in r.metrics for r in results):
        notes.append(_ACCEPT_NOTE)
        notes += list(untrusted)
    if notes:
        table.caption = "\n".join(notes)
        table.caption_justify = "left"
    return table


def results_as_dicts(
    results: Sequence[LevelResult], *, samples: bool = False
) -> list[dict[str, Any]]:
    """JSON-ready records (``--json``); per-request samples only when asked."""
    out = []
    for r in results:
        d: dict[str, Any] = {
            "workload": r.workload,
            "level": r.level,
            "repeat": r.repeat,
            "metrics": dict(r.metrics),
            "warnings": list(r.warnings),
            "unreliable": r.unreliable,
            "info": dict(r.info),
            "started_at": r.started_at,
            "duration_s": r.duration_s,
        }
        if samples:
            d["samples"] = [dataclasses.asdict(s) for s in r.samples]
        out.append(d)
    return out
