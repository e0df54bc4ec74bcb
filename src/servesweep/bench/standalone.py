"""``servesweep bench --url URL``: benchmark an already-running OpenAI-compatible
server without a sweep file, and render the results as a table or JSON."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import pydantic
from rich import box
from rich.table import Table

from servesweep.acceptance import UNTRUSTED_MARK, AcceptanceContext
from servesweep.bench.client import build_headers, get_text, make_session
from servesweep.bench.load import run_workload
from servesweep.bench.target import Target
from servesweep.errors import BenchError, ConfigError
from servesweep.models import LevelResult
from servesweep.servers.gpu.base import GpuProbe
from servesweep.spec.schema import WorkloadSpec

__all__ = ["ACCEPTANCE_SOURCES", "format_results", "results_as_dicts", "run_standalone"]

VLLM_SPEC_COUNTERS = {
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
}


def run_standalone(
    url: str,
    *,
    model: str | None = None,
    concurrency: Sequence[int] = (1,),
    requests: int | None = 32,
    rate: Sequence[float] = (),
    dataset: str = "builtin:chat",
    max_tokens: int = 256,
    endpoint: str = "chat",
    api_key_env: str | None = None,
    duration: float | None = None,
    input_tokens: int | None = None,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    warmup: int = 0,
    ignore_eos: bool = False,
    temperature: float = 0.0,
    stream: bool = True,
    seed: int = 0,
    slo: Mapping[str, float] | None = None,
    extra_body: Mapping[str, Any] | None = None,
    workers: int = 1,
    timeout_s: float = 600.0,
    tokenize_path: str | None = "/tokenize",
    metrics_path: str | None = "/metrics",
    spec_decode_counters: Mapping[str, str] | None = None,
    probe: GpuProbe | None = None,
    gpus: Sequence[int] = (),
    on_progress: Callable[[str], None] | None = None,
) -> list[LevelResult]:
    """Run one workload against ``url`` (``http://host:port``, ``/v1`` optional).

    With ``rate`` the levels are open-loop rates and ``concurrency`` is ignored.
    ``model`` None: the first model ``/v1/models`` lists. ``api_key_env``: the name
    of the environment variable holding the API key (the key is never printed).
    Raises :class:`ConfigError` for bad options, :class:`BenchError` when the
    server cannot be asked at all."""
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    if not base.startswith(("http://", "https://")):
        raise ConfigError(f"not an http(s) URL: {url!r}", key="--url")
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ConfigError(f"environment variable {api_key_env} is not set", key="--api-key-env")
    spec: dict[str, Any] = {
        "name": "bench",
        "endpoint": endpoint,
        "dataset": dataset,
        "input_tokens": input_tokens,
        "arrival": arrival,
        "burstiness": burstiness,
        "requests": requests,
        "duration": duration,
        "warmup": warmup,
        "max_tokens": max_tokens,
        "ignore_eos": ignore_eos,
        "temperature": temperature,
        "stream": stream,
        "seed": seed,
        "slo": dict(slo or {}),
        "extra_body": dict(extra_body or {}),
    }
    if rate:
        spec["rate"] = list(rate)
    else:
        spec["concurrency"] = list(concurrency)
    try:
        workload = WorkloadSpec(**spec)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ConfigError(str(first.get("msg", exc)), key=where or None) from exc
    return asyncio.run(
        _run(
            base,
            model,
            api_key,
            workload,
            workers=workers,
            timeout_s=timeout_s,
            tokenize_path=tokenize_path,
            metrics_path=metrics_path,
            counters=VLLM_SPEC_COUNTERS if spec_decode_counters is None else spec_decode_counters,
            probe=probe,
            gpus=gpus,
            on_progress=on_progress,
        )
    )


async def _run(
    base: str,
    model: str | None,
    api_key: str | None,
    workload: WorkloadSpec,
    *,
    workers: int,
    timeout_s: float,
    tokenize_path: str | None,
    metrics_path: str | None,
    counters: Mapping[str, str],
    probe: GpuProbe | None,
    gpus: Sequence[int],
    on_progress: Callable[[str], None] | None,
) -> list[LevelResult]:
    if model is None:
        model = await _first_model(base, api_key)
    target = Target(
        base_url=base,
        model=model,
        api_key=api_key,
        tokenize_path=tokenize_path,
        metrics_path=metrics_path,
        spec_decode_counters=dict(counters),
        timeout_s=timeout_s,
    )
    return await run_workload(
        target, workload, probe=probe, gpus=gpus, on_progress=on_progress, workers=workers
    )


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
