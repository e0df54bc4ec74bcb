"""Run a workload against a target: every level (concurrency or rate) times every
repeat, each measured into one :class:`LevelResult`.

Per level: optional warm-up requests (excluded), spec-decode counters read before,
GPU telemetry sampled during, the requests themselves (in this process, or split
over worker processes whose samples are merged), counters read after, metrics.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import monotonic_ns
from typing import Any

import aiohttp

from servesweep.bench.capacity import CapacityPlan
from servesweep.bench.client import build_headers, get_text, make_session, post_json
from servesweep.bench.columns import joined
from servesweep.bench.datasets import (
    Prompt,
    build_body,
    load_prompts,
    request_order,
    synthetic_prompts,
)
from servesweep.bench.health import assess
from servesweep.bench.metrics import LevelContext, compute_columns, paused_gc
from servesweep.bench.plan import LevelPlan, PlanOutput, arrival_offsets, run_plan
from servesweep.bench.specdecode import (
    acceptance_from_counters,
    counter_names,
    parse_counters,
    parse_per_position,
)
from servesweep.bench.target import Target
from servesweep.bench.telemetry import GpuSampler, summarize_gpu
from servesweep.bench.workers import WorkerPool
from servesweep.decide.acceptance import AcceptanceContext
from servesweep.decide.intervals import DEFAULT_CONFIDENCE
from servesweep.decide.level_intervals import level_intervals
from servesweep.errors import BenchError
from servesweep.metrics_catalog import ACCEPTANCE_LENGTH, DURATION_S
from servesweep.models import LevelResult, level_label
from servesweep.servers.gpu.base import GpuProbe
from servesweep.spec.schema import CapacityWorkload, EvalWorkload, LoadWorkload, WorkloadSpec

__all__ = ["LoadOptions", "run_workload", "run_workload_sync"]

WARM_WINDOWS = 8
"""At most this many warm-up windows per launch (``warmup: auto``)."""
WARM_MIN_REQUESTS = 4
"""Requests of one warm-up window at least (twice the concurrency when larger)."""
_START_LEAD_NS = 20_000_000
"""Requests of a level start this long after the plan is handed out."""
_MAX_SYNTHETIC = 1000


@dataclass(frozen=True)
class LoadOptions:
    """How a workload is run, beside what it is (the spec) and where (the target).

    ``probe``/``gpus``: GPU telemetry sampled during each level. ``on_progress``:
    called with one line per level. ``workers``: generator processes (default:
    ``workload.workers``). ``isolated``: run even a single generator in a process of
    its own (not in the caller's, whose other threads would compete with it for the
    interpreter). ``base_dir``: where relative dataset paths start. ``after_level``
    is called with each level's result as it is measured; when it returns False, the
    remaining levels are not run (the results so far are returned). ``pool``: started
    generator processes to use (kept for the caller's next workloads) when there are
    as many as this workload needs."""

    probe: GpuProbe | None = None
    gpus: Sequence[int] = ()
    on_progress: Callable[[str], None] | None = None
    workers: int | None = None
    base_dir: str | None = None
    after_level: Callable[[LevelResult], bool] | None = None
    isolated: bool = False
    pool: WorkerPool | None = None


async def run_workload(
    target: Target, workload: WorkloadSpec, options: LoadOptions = LoadOptions()
) -> list[LevelResult]:
    """One :class:`LevelResult` per level x repeat (an eval workload: one result; a
    capacity workload: the levels it chose, then its summary, see bench/capacity.py),
    run as ``options`` say (:class:`LoadOptions`).

    Raises :class:`BenchError` (``DatasetError``) when the workload cannot run at all;
    failed requests are data in the result."""
    if isinstance(workload, EvalWorkload):
        from servesweep.bench.evals import run_eval_workload

        result: LevelResult = await run_eval_workload(target, workload, base_dir=options.base_dir)
        return [result]
    if isinstance(workload, CapacityWorkload):
        return await _run_capacity(target, CapacityPlan(workload, options.on_progress), options)
    probe, gpus, on_progress = options.probe, options.gpus, options.on_progress
    after_level, pool = options.after_level, options.pool
    n_workers = max(1, options.workers or int(getattr(workload, "workers", 1) or 1))
    headers = build_headers(target.api_key)
    path = "/v1/chat/completions" if workload.endpoint == "chat" else "/v1/completions"
    levels: list[tuple[int | None, float | None]] = [(c, None) for c in workload.concurrency]
    levels += [(None, r) for r in workload.rate]
    results: list[LevelResult] = []
    async with make_session(target.timeout_s) as session:
        prompts, data_info = await _prompts(target, workload, session, headers, options.base_dir)
        extras = [dict(target.request_extras), dict(workload.extra_body)]
        ignore_eos = workload.ignore_eos and target.supports_ignore_eos
        bodies = [
            build_body(
                p,
                model=target.model,
                endpoint=workload.endpoint,
                stream=workload.stream,
                max_tokens=workload.max_tokens,
                temperature=workload.temperature,
                ignore_eos=ignore_eos,
                extras=extras,
            )
            for p in prompts
        ]
        data_info["ignore_eos"] = ignore_eos
        runner = _Runner(target, workload, session, headers, target.url(path), bodies, data_info)
        own = None
        if pool is None or pool.n != n_workers:
            pool = None
            if n_workers > 1 or options.isolated:
                own = pool = WorkerPool(n_workers, target.timeout_s)
                await own.__aenter__()
        try:
            for conc, rate in levels:
                for repeat in range(workload.repeats):
                    res = await runner.level(conc, rate, repeat, pool, probe, gpus)
                    results.append(res)
                    if on_progress is not None:
                        on_progress(_progress_line(res))
                    if after_level is not None and not after_level(res):
                        return results
        finally:
            if own is not None:
                own.close()
    return results


async def _run_capacity(
    target: Target, plan: CapacityPlan, options: LoadOptions
) -> list[LevelResult]:
    """Measure the levels ``plan`` chooses, one at a time, with the GPU telemetry,
    generator processes and dataset directory of ``options``."""
    each = LoadOptions(
        probe=options.probe, gpus=options.gpus, workers=options.workers, base_dir=options.base_dir
    )
    level = plan.next_level(None, None)
    while level is not None:
        results = await run_workload(target, level, each)
        level = plan.next_level(level, results[0])
    return plan.results


def run_workload_sync(
    target: Target, workload: WorkloadSpec, options: LoadOptions = LoadOptions()
) -> list[LevelResult]:
    """:func:`run_workload` for callers without an event loop."""
    return asyncio.run(run_workload(target, workload, options))


def _progress_line(r: LevelResult) -> str:
    m = r.metrics
    line = (
        f"{r.workload} {r.level} #{r.repeat}: {m.get('completed', 0):.0f} ok, "
        f"{m.get('failed', 0):.0f} failed, {m.get('request_throughput', 0):.1f} req/s, "
        f"{m.get('output_throughput', 0):.0f} tok/s"
    )
    if "ttft_median_ms" in m:
        line += f", TTFT p50 {m['ttft_median_ms']:.1f} ms"
    return line


async def _prompts(
    target: Target,
    workload: LoadWorkload,
    session: aiohttp.ClientSession,
    headers: dict[str, str],
    base_dir: str | None,
) -> tuple[list[Prompt], dict[str, Any]]:
    if workload.dataset != "synthetic":
        prompts = load_prompts(workload.dataset, base_dir=base_dir)
        return prompts, {"dataset": workload.dataset, "prompts": len(prompts)}
    if workload.input_tokens is None:
        raise BenchError(f"workload {workload.name}: dataset 'synthetic' needs 'input_tokens'")
    count = min(_MAX_SYNTHETIC, (workload.requests or _MAX_SYNTHETIC) + workload.warmup_requests)
    count_tokens = count_prompt = None
    if target.tokenize_path:
        url = target.url(target.tokenize_path)

        async def tokenize(payload: dict[str, Any]) -> int:
            answer = await post_json(session, url, {"model": target.model, **payload}, headers)
            n = answer.get("count") if isinstance(answer, dict) else None
            if not isinstance(n, int):
                tokens = answer.get("tokens") if isinstance(answer, dict) else None
                n = len(tokens) if isinstance(tokens, list) else 0
            return n

        async def count_tokens(text: str) -> int:
            return await tokenize({"prompt": text})

        if workload.endpoint == "chat":
            # the server counts the prompt inside the model's chat template (a system
            # turn, role markers): its /tokenize applies the template to messages, as
            # the chat endpoint does (vLLM: add_generation_prompt, no extra specials)
            async def count_prompt(text: str) -> int:
                return await tokenize({"messages": [{"role": "user", "content": text}]})

    try:
        prompts, info = await synthetic_prompts(
            count,
            workload.input_tokens,
            seed=workload.seed,
            count_tokens=count_tokens,
            count_prompt=count_prompt,
        )
    except BenchError as exc:  # the tokenizer endpoint failed: fall back, say so
        prompts, info = await synthetic_prompts(count, workload.input_tokens, seed=workload.seed)
        info["tokenize_error"] = str(exc)
    return prompts, {"dataset": "synthetic", "prompts": len(prompts), "calibration": info}


@dataclass(frozen=True)
class _Measured:
    """What one level's run left to be turned into its result: when it started (the
    plan's ``t0`` in monotonic ns, wall-clock ``started_at``), the generators'
    outputs, the GPU sampler, the spec-decode counters before and after (and the
    first error reading them), and how many generator processes ran it."""

    t0: int
    started_at: float
    outputs: list[PlanOutput]
    sampler: GpuSampler | None
    before: dict[str, float]
    after: dict[str, float]
    counter_error: str | None
    n_workers: int


class _Runner:
    def __init__(
        self,
        target: Target,
        workload: LoadWorkload,
        session: aiohttp.ClientSession,
        headers: dict[str, str],
        url: str,
        bodies: list[bytes],
        data_info: dict[str, Any],
    ) -> None:
        self.target = target
        self.w = workload
        self.session = session
        self.headers = headers
        self.url = url
        self.bodies = bodies
        self.data_info = data_info
        n = (workload.requests or len(bodies)) + workload.warmup_requests
        self.order = request_order(len(bodies), max(n, len(bodies)), workload.seed)
        self.warm: dict[str, Any] | None = None
        """What the launch's warm-up did (``warmup: launch``), for the first level."""
        self.level_warm: dict[str, Any] | None = None
        """What the fixed warm-up before the current level did (``none`` for 0)."""

    def _plan(self, **kw: Any) -> LevelPlan:
        return LevelPlan(
            url=self.url,
            headers=self.headers,
            bodies=self.bodies,
            order=self.order,
            stream=self.w.stream,
            **kw,
        )

    async def _warm_launch(self, conc: int | None, rate: float | None) -> dict[str, Any]:
        """Warm a freshly launched server until its measurements stop drifting: windows
        of ``max(4, 2 x concurrency)`` requests until two in a row agree within their
        noise (per-request tokens/s, means within 1.96 standard errors of their
        difference), at most :data:`WARM_WINDOWS` windows. Returns what it did."""
        c = conc if conc is not None else max(1, round(rate or 1))
        size = max(WARM_MIN_REQUESTS, 2 * c)
        windows: list[dict[str, float]] = []
        stable = False
        previous: tuple[float, float] | None = None
        started = time.monotonic()
        for k in range(WARM_WINDOWS):
            t0 = monotonic_ns() + _START_LEAD_NS
            start = max(0, len(self.order) - size * (k + 1))
            out = await run_plan(
                self._plan(t0_ns=t0, first_index=start, count=size, concurrency=c), self.session
            )
            rates = out.raws.tokens_per_s()
            if len(rates) < 2:
                windows.append({"requests": float(size)})
                continue
            mean = statistics.fmean(rates)
            se = statistics.stdev(rates) / math.sqrt(len(rates))
            windows.append({"requests": float(size), "tokens_per_s": round(mean, 3),
                            "se": round(se, 3)})  # fmt: skip
            if previous is not None and abs(mean - previous[0]) <= 1.96 * math.hypot(
                se, previous[1]
            ):
                stable = True
                break
            previous = (mean, se)
        return {
            "mode": "auto",
            "requests": int(sum(w["requests"] for w in windows)),
            "windows": windows,
            "stable": stable,
            "seconds": round(time.monotonic() - started, 3),
        }

    async def _warmup(self, conc: int | None, rate: float | None) -> dict[str, Any] | None:
        """Warm before a level. The launch's warm-up (``warmup: launch``) runs once and
        is kept in ``self.warm``; a fixed ``warmup: N`` runs before every level and is
        returned as this level's record (``mode`` ``fixed``, or ``none`` for 0). None:
        nothing to record here (``auto`` after the launch's first load workload, which
        warmed the server)."""
        if self.w.warmup == "launch" and self.warm is None:
            self.warm = await self._warm_launch(conc, rate)
            return None
        if not isinstance(self.w.warmup, int):
            return None
        w = self.w.warmup
        if not w:
            return {"mode": "none", "requests": 0}
        c = min(w, conc if conc is not None else max(1, round(rate or 1)))
        started = time.monotonic()
        t0 = monotonic_ns() + _START_LEAD_NS
        # warm-up prompts come from the end of the order: not the measured ones
        start = max(0, len(self.order) - w)
        await run_plan(
            self._plan(t0_ns=t0, first_index=start, count=w, concurrency=c), self.session
        )
        return {"mode": "fixed", "requests": w, "seconds": round(time.monotonic() - started, 3)}

    async def _counters(self) -> tuple[dict[str, float], str | None]:
        counters = self.target.spec_decode_counters
        names = counter_names(counters)
        if not names or not self.target.metrics_path:
            return {}, None
        try:
            text = await get_text(
                self.session, self.target.url(self.target.metrics_path), self.headers
            )
        except BenchError as exc:
            return {}, str(exc)
        values = parse_counters(text, names)
        per_pos = counters.get("accepted_per_pos")
        if per_pos:
            values.update(parse_per_position(text, per_pos))
        gauge = counters.get("accept_length")
        if gauge:  # a gauge of several engines is averaged, not summed
            values.update(parse_counters(text, [gauge], mean=True))
        return values, None

    def _plans(
        self, conc: int | None, rate: float | None, n_workers: int, t0: int, repeat: int
    ) -> list[LevelPlan | None]:
        w = self.w
        deadline = t0 + int(w.duration * 1e9) if w.duration is not None else None
        count = w.requests
        if rate is not None:
            n = count if count is not None else 0
            if w.duration is not None:
                by_time = max(1, int(rate * w.duration))
                n = min(n, by_time) if count is not None else by_time
            offsets = arrival_offsets(n, rate, w.arrival, w.burstiness, w.seed + repeat)
            return [
                self._plan(
                    t0_ns=t0,
                    first_index=k,
                    stride=n_workers,
                    offsets_ns=offsets[k::n_workers],
                    deadline_ns=deadline,
                )
                for k in range(n_workers)
            ]
        c = conc or 1
        plans: list[LevelPlan | None] = []
        for k in range(n_workers):
            share = c // n_workers + (1 if k < c % n_workers else 0)
            n_k = (
                None if count is None else count // n_workers + (1 if k < count % n_workers else 0)
            )
            if share == 0 or n_k == 0:
                plans.append(None)
                continue
            plans.append(
                self._plan(
                    t0_ns=t0,
                    first_index=k,
                    stride=n_workers,
                    count=n_k,
                    deadline_ns=deadline,
                    concurrency=share,
                )
            )
        return plans

    async def level(
        self,
        conc: int | None,
        rate: float | None,
        repeat: int,
        pool: WorkerPool | None,
        probe: GpuProbe | None,
        gpus: Sequence[int],
    ) -> LevelResult:
        self.level_warm = await self._warmup(conc, rate)
        before, counter_error = await self._counters()
        sampler = GpuSampler(probe, gpus) if probe is not None else None
        if sampler is not None:
            sampler.start()
        started_at = time.time()
        n_workers = pool.n if pool is not None else 1
        t0 = monotonic_ns() + (_START_LEAD_NS * (5 if pool is not None else 1))
        plans = self._plans(conc, rate, n_workers, t0, repeat)
        try:
            if pool is not None:
                outputs = await pool.run(plans)
            else:
                plan = plans[0]
                outputs = [] if plan is None else [await run_plan(plan, self.session)]
        finally:
            if sampler is not None:
                sampler.stop()
        after, counter_error_after = await self._counters()
        measured = _Measured(
            t0=t0,
            started_at=started_at,
            outputs=outputs,
            sampler=sampler,
            before=before,
            after=after,
            counter_error=counter_error or counter_error_after,
            n_workers=n_workers,
        )
        return self._result(conc, rate, repeat, measured)

    def _result(
        self, conc: int | None, rate: float | None, repeat: int, measured: _Measured
    ) -> LevelResult:
        t0, started_at, outputs = measured.t0, measured.started_at, measured.outputs
        sampler, before, after = measured.sampler, measured.before, measured.after
        counter_error, n_workers = measured.counter_error, measured.n_workers
        raws = joined([o.raws for o in outputs])
        lags = [x for o in outputs for x in o.loop_lags_ns]
        steady = None
        if conc is not None:
            fulls = [o.full_at_ns for o in outputs]
            drains = [o.drain_at_ns for o in outputs if o.drain_at_ns is not None]
            if all(f is not None for f in fulls) and fulls and drains:
                start = max(f for f in fulls if f is not None)
                end = min(drains)
                if end > start:
                    steady = (start, end)
        ctx = LevelContext(
            t0_ns=t0,
            concurrency=conc,
            rate=rate,
            slo=self.w.slo,
            steady=steady,
            loop_lags_ns=lags,
            stream=self.w.stream,
            ignore_eos=(self.w.ignore_eos, bool(self.data_info.get("ignore_eos"))),
        )
        with paused_gc():
            metrics, info, samples, warnings = compute_columns(raws, ctx)
        health = assess(metrics, rate=rate, stream=self.w.stream)
        info["generator_health"] = health.to_info()
        info.update(self.data_info)
        if self.warm is not None and not self.warm.get("reported"):
            info["warmup"] = {k: v for k, v in self.warm.items() if k != "reported"}
            self.warm["reported"] = True
            if not self.warm["stable"]:
                warnings.append(
                    f"the launch's warm-up did not settle in {WARM_WINDOWS} windows "
                    f"({self.warm['requests']} requests): the first level may still be "
                    "drifting; set a fixed 'warmup' or measure in more 'launches'"
                )
        elif self.level_warm is not None:
            info["warmup"] = dict(self.level_warm)
        info["workers"] = n_workers
        info["t0_monotonic_ns"] = t0
        cut = sum(o.cut_off for o in outputs)
        if cut:
            grace = max(o.grace_s or 0.0 for o in outputs)
            info["cut_at_duration"] = cut
            warnings.append(
                f"{cut} requests were still in flight {grace:.1f} s after the level's duration "
                f"({self.w.duration:g} s) ended: cancelled and counted as timeouts; the server "
                "stalled or the duration is shorter than a request"
            )
        unknown = sorted(set(self.w.slo) - {"ttft_ms", "tpot_ms", "e2e_ms", "e2el_ms"})
        if unknown:
            warnings.append(f"unknown SLO keys ignored: {unknown} (use ttft_ms, tpot_ms, e2e_ms)")
        acc, detail = acceptance_from_counters(self.target.spec_decode_counters, before, after)
        if acc is not None:
            metrics[ACCEPTANCE_LENGTH.name] = acc
            info["acceptance_source"] = detail.pop("source", "engine_counters")
            info["spec_decode"] = detail
        elif self.target.spec_counters_when_speculating and not counter_error:
            # the engine's counters exist whenever it speculates (vLLM defines them
            # only with a speculative config): none, or no draft, is no speculation,
            # and tokens per chunk are no acceptance length
            info["spec_decode"] = {**detail, "speculation": "none in this level"}
        elif "acceptance_estimate_from_chunks" in info:
            metrics[ACCEPTANCE_LENGTH.name] = info["acceptance_estimate_from_chunks"]
            info["acceptance_source"] = "tokens_per_chunk_estimate"
            if detail:
                info["spec_decode"] = detail
        if counter_error:
            info["spec_decode_counter_error"] = counter_error
        if ACCEPTANCE_LENGTH.name in metrics:
            info["acceptance_context"] = AcceptanceContext(
                self.w.dataset, bool(info.get("ignore_eos")), self.w.endpoint
            ).to_info()
        if sampler is not None:
            inside = [s for s in sampler.samples if s[0] >= t0 - 250_000_000]
            gm, ginfo = summarize_gpu(inside)
            metrics.update(gm)
            info["gpu"] = ginfo
            if sampler.errors:
                info["gpu_probe_errors"] = sampler.errors
        acc_value = metrics.get(ACCEPTANCE_LENGTH.name)
        with paused_gc():
            intervals = level_intervals(
                samples,
                duration_s=metrics[DURATION_S.name],
                slo=self.w.slo,
                acceptance=None
                if acc_value is None
                else (acc_value, str(info.get("acceptance_source", ""))),
                confidence=DEFAULT_CONFIDENCE,
                values=metrics,
            )
        return LevelResult(
            workload=self.w.name,
            level=level_label(conc, rate),
            repeat=repeat,
            metrics=metrics,
            samples=samples,
            warnings=tuple(warnings),
            info=info,
            started_at=started_at,
            duration_s=metrics[DURATION_S.name],
            unreliable=health.reason if health.state == "unreliable" else None,
            intervals=intervals,
            confidence=DEFAULT_CONFIDENCE,
        )
