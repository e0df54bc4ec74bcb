"""The simulated engine's scheduler: what a request generates and when.

Timing is scheduled against absolute deadlines on the event loop (never
accumulated sleeps), so lateness does not add up over a stream: the first token
is due ``ttft_ms (+ prompt_tokens / prefill_tok_s)`` after admission, every later
chunk one decode step after the previous deadline. A decode step lasts
``step_ms * spec.step_factor * (1 + batch_slowdown * (running - 1))`` and emits
``1 + accepted`` tokens in one chunk. With ``on_trace`` set, every finished
generation reports its :class:`Trace`: when each chunk was due and when it was
really emitted (loop time, i.e. ``time.monotonic()``), the ground truth clients are
checked against.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from servesweep.sim.config import MODEL_MAX_LEN, SimConfig
from servesweep.sim.oracle import Oracle
from servesweep.sim.specdecode import SpecModel
from servesweep.sim.tokenizer import count_tokens, split_pieces

__all__ = ["MAX_MODEL_LEN", "Engine", "Plan", "Trace"]

MAX_MODEL_LEN = MODEL_MAX_LEN
_SPIN_STREAMS = 2
"""Up to this many running requests, the last ~1.2 ms before a deadline are spent
yielding to the loop instead of in epoll (whose timeout has 1 ms granularity)."""
_SPIN_S = 0.0012

_VOCAB_TEXT = (
    "the of and to in is that for it as with was on be by this are from at or an have not "
    "which but all were can more one their has been will also there would so into its "
    "model token server memory batch stream request latency throughput kernel cache draft "
    "accept verify decode prefill tensor parallel expert layer weight shard queue sample "
    "river mountain garden window paper signal engine number answer question reason simple"
)
_WORDS: tuple[str, ...] = tuple(_VOCAB_TEXT.split())


def _hash01(*parts: object) -> float:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass
class Plan:
    """What one request will produce."""

    pieces: list[str]
    """One text piece per token, in order."""
    prompt_tokens: int
    finish_reason: str
    index: int
    """Arrival order of generation requests in this process (0, 1, ...)."""
    oracle_task: str | None = None


@dataclass
class Trace:
    """When one generation's chunks were due and emitted (``time.monotonic()`` seconds)."""

    index: int
    arrival: float
    """When the handler started: TTFT counts from here (or from ``admitted``)."""
    admitted: float
    """When it got a slot (``--max-num-seqs``): equal to ``arrival`` unless it queued."""
    due: list[float] = field(default_factory=list)
    emitted: list[float] = field(default_factory=list)
    """When the sim started to write each chunk (never before it was due)."""
    written: list[float] = field(default_factory=list)
    """When the write of each chunk returned: the bytes were with the kernel."""
    tokens: list[int] = field(default_factory=list)

    def fields(self) -> dict[str, object]:
        """JSON-ready, microsecond resolution."""
        return {
            "index": self.index,
            "arrival": round(self.arrival, 6),
            "admitted": round(self.admitted, 6),
            "due": [round(t, 6) for t in self.due],
            "emitted": [round(t, 6) for t in self.emitted],
            "written": [round(t, 6) for t in self.written],
            "tokens": self.tokens,
        }


class Engine:
    def __init__(self, cfg: SimConfig, oracle: Oracle) -> None:
        self.cfg = cfg
        self.on_trace: Callable[[Trace], None] | None = None
        """Called with each finished generation's timing (the truth file's lines)."""
        self.spec = SpecModel(cfg.budget, cfg.topk, cfg.window)
        self.oracle = oracle
        rng = random.Random(cfg.seed)
        self._text = [" " + rng.choice(_WORDS) for _ in range(8192)]
        self._slots = asyncio.Semaphore(cfg.max_num_seqs)
        self.requests = 0
        self.running = 0
        self.waiting = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.finished: Counter[str] = Counter()
        self.drafts_total = 0
        self.draft_tokens_total = 0
        self.accepted_tokens_total = 0
        self.accepted_per_pos: Counter[int] = Counter()
        """Accepted draft tokens by position in the draft (vLLM's per-position counter)."""

    # -- what to say ----------------------------------------------------------

    def next_index(self) -> int:
        index = self.requests
        self.requests += 1
        return index

    def fails(self, index: int) -> bool:
        """Deterministic ``--error-rate``: this request gets an HTTP 500."""
        return self.cfg.error_rate > 0 and _hash01(self.cfg.seed, "error", index) < (
            self.cfg.error_rate
        )

    def plan(self, prompt: str, max_tokens: int | None, ignore_eos: bool, index: int) -> Plan:
        prompt_tokens = count_tokens(prompt)
        limit = MAX_MODEL_LEN if max_tokens is None else max(0, max_tokens)
        answer = self.oracle.respond(prompt) if self.oracle.tasks else None
        if answer is not None:
            text, task, _correct = answer
            pieces = split_pieces(text)
            finish = "length" if len(pieces) > limit else "stop"
            return Plan(pieces[:limit], prompt_tokens, finish, index, task.task_id)
        lo, hi = self.cfg.eos_min, self.cfg.eos_max
        natural = lo + int(_hash01(self.cfg.seed, "eos", prompt) * (hi - lo + 1))
        n = limit if ignore_eos else min(limit, natural)
        finish = "length" if n == limit and (ignore_eos or natural > limit) else "stop"
        start = int(_hash01(self.cfg.seed, "text", index) * len(self._text))
        words = self._text
        pieces = [words[(start + i) % len(words)] for i in range(n)]
        return Plan(pieces, prompt_tokens, finish, index)

    # -- when to say it -------------------------------------------------------

    def step_seconds(self) -> float:
        slowdown = 1.0 + self.cfg.batch_slowdown * max(self.running - 1, 0)
        cold = self.cfg.cold_requests
        if self.requests < cold:
            # a fresh launch: cold kernels and caches, warming request by request
            slowdown *= 1.0 + (self.cfg.cold_slowdown - 1.0) * (1.0 - self.requests / cold)
        # verifying every other running sequence's drafts (a batch that fills the step)
        verify = self.cfg.verify_batch_cost * self.cfg.budget * max(self.running - 1, 0)
        return self.cfg.step_ms / 1000.0 * (self.spec.step_factor * slowdown + verify)

    def first_token_seconds(self, prompt_tokens: int) -> float:
        prefill = prompt_tokens / self.cfg.prefill_tok_s if self.cfg.prefill_tok_s > 0 else 0.0
        return self.cfg.ttft_ms / 1000.0 + prefill

    async def _sleep_until(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        delay = deadline - loop.time()
        if self.running > _SPIN_STREAMS:
            if delay > 0:
                await asyncio.sleep(delay)
            return
        if delay > _SPIN_S:
            await asyncio.sleep(delay - _SPIN_S)
        while loop.time() < deadline:
            await asyncio.sleep(0)

    async def run(
        self,
        plan: Plan,
        emit: Callable[[list[str]], Awaitable[None]],
        arrival: float | None = None,
    ) -> None:
        """Emit ``plan``'s pieces chunk by chunk at their deadlines.

        The first token is due ``first_token_seconds`` after ``arrival`` (loop time
        the request arrived) or after admission when the request had to wait for a
        slot (``--max-num-seqs``).
        """
        loop = asyncio.get_running_loop()
        if arrival is None:
            arrival = loop.time()
        queued = self._slots.locked()
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        admitted = loop.time() if queued else arrival
        trace = None if self.on_trace is None else Trace(plan.index, arrival, admitted)
        arrival = admitted
        self.running += 1
        rng = random.Random(f"{self.cfg.seed}:spec:{plan.index}")
        try:
            self.prompt_tokens_total += plan.prompt_tokens
            pieces = plan.pieces
            if not pieces:
                return
            deadline = arrival + self.first_token_seconds(plan.prompt_tokens)
            await self._sleep_until(loop, deadline)
            if trace is not None:
                trace.due.append(deadline)
                trace.emitted.append(loop.time())
                trace.tokens.append(1)
            await emit(pieces[:1])
            if trace is not None:
                trace.written.append(loop.time())
            self.generation_tokens_total += 1
            sent = 1
            while sent < len(pieces):
                deadline += self.step_seconds()
                accepted = self.spec.sample_step(rng)
                if self.spec.enabled:
                    self.drafts_total += 1
                    self.draft_tokens_total += self.cfg.budget
                    self.accepted_tokens_total += accepted
                    self.accepted_per_pos.update(range(accepted))
                chunk = pieces[sent : sent + 1 + accepted]
                await self._sleep_until(loop, deadline)
                if trace is not None:
                    trace.due.append(deadline)
                    trace.emitted.append(loop.time())
                    trace.tokens.append(len(chunk))
                await emit(chunk)
                if trace is not None:
                    trace.written.append(loop.time())
                sent += len(chunk)
                self.generation_tokens_total += len(chunk)
            self.finished[plan.finish_reason] += 1
            if trace is not None and self.on_trace is not None:
                self.on_trace(trace)
        finally:
            self.running -= 1
            self._slots.release()

    # -- how it went ----------------------------------------------------------

    def metrics_text(self) -> str:
        """Prometheus text exposition with vLLM's metric names."""
        label = f'{{engine="0",model_name="{self.cfg.model}"}}'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{label} {float(self.running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{label} {float(self.waiting)}",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{label} {float(self.prompt_tokens_total)}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{label} {float(self.generation_tokens_total)}",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
        ]
        for reason in ("stop", "length"):
            lines.append(
                f'vllm:request_success_total{{engine="0",finished_reason="{reason}",'
                f'model_name="{self.cfg.model}"}} {float(self.finished[reason])}'
            )
        for name, value, help_ in (
            ("spec_decode_num_drafts_total", self.drafts_total, "Number of spec decoding drafts."),
            (
                "spec_decode_num_draft_tokens_total",
                self.draft_tokens_total,
                "Number of draft tokens.",
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                self.accepted_tokens_total,
                "Number of accepted tokens.",
            ),
        ):
            lines += [
                f"# HELP vllm:{name} {help_}",
                f"# TYPE vllm:{name} counter",
                f"vllm:{name}{label} {float(value)}",
            ]
        if self.spec.enabled:
            name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            lines += [
                f"# HELP {name} Accepted tokens by position in the draft.",
                f"# TYPE {name} counter",
            ]
            for pos in range(math.ceil(self.spec.depth)):
                lines.append(
                    f'{name}{{engine="0",model_name="{self.cfg.model}",position="{pos}"}} '
                    f"{float(self.accepted_per_pos[pos])}"
                )
        return "\n".join(lines) + "\n"
