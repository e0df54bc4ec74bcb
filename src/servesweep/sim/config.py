"""Command line of the simulated engine: every flag is a sweepable launch parameter."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass

from servesweep.fakegpu.units import parse_size
from servesweep.helpstyle import click_style

__all__ = ["MODEL_MAX_LEN", "SimConfig", "build_parser", "parse_args"]

MODEL_MAX_LEN = 4096
"""The longest context the simulated model holds (``max_model_len`` at most)."""

_DESCRIPTION = """\
servesweep's simulated inference engine: an OpenAI-compatible server that loads,
serves, crashes and releases fake GPU memory like vLLM or SGLang, deterministically.
Endpoints: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (SSE
streaming), GET /health, GET /metrics, POST /tokenize. Every response carries an
x-sim-instance header (PID and start time) naming the process that answered.
See docs/sim.md for the timing and speculative-decoding formulas."""

_EPILOG = """\
environment: CUDA_VISIBLE_DEVICES (default --gpus), SERVESWEEP_FAKE_GPUS (default
--fake-gpus), SERVESWEEP_SIM_TRUTH (default --truth)."""


@dataclass(frozen=True)
class SimConfig:
    host: str
    port: int
    model: str
    gpus: tuple[int, ...]
    fake_gpus: str | None
    mem_per_gpu: int
    load_time: float
    ttft_ms: float
    prefill_tok_s: float
    step_ms: float
    batch_slowdown: float
    max_num_seqs: int
    seed: int
    budget: int
    topk: int
    window: int
    verify_batch_cost: float
    release_delay: float
    shutdown_delay: float
    shutdown_generation: str
    ignore_sigterm: bool
    reuse_port: bool
    orphan_worker: bool
    crash_at_load: bool
    hang_at_load: bool
    error_rate: float
    crash_after: int | None
    models_before_ready: bool
    correct_rate: float
    oracle: tuple[str, ...] | None
    truth: str | None
    eos_min: int
    eos_max: int
    cold_requests: int = 0
    """A fresh start decodes ``cold_slowdown`` times slower, warming linearly back to
    normal over this many requests (cold kernels and caches of a new launch)."""
    cold_slowdown: float = 1.0
    max_model_len: int = MODEL_MAX_LEN
    """The context length asked (``--max-model-len``); it runs at most :data:`MODEL_MAX_LEN`."""


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _gpus(text: str) -> tuple[int, ...]:
    try:
        gpus = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid GPU list {text!r}: use e.g. 0,1") from exc
    if any(g < 0 for g in gpus):
        raise argparse.ArgumentTypeError(f"invalid GPU list {text!r}: indexes are >= 0")
    return gpus


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid fraction {text!r}") from exc
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"invalid fraction {text!r}: must be in [0, 1]")
    return value


def _non_negative(kind: type[float] | type[int]) -> Callable[[str], float | int]:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from exc
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
        return value

    return parse


PROG = "python -m servesweep.sim"
"""The program name in usage and errors when the engine runs as a module."""


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    nn_float, nn_int = _non_negative(float), _non_negative(int)
    p = argparse.ArgumentParser(
        prog=prog,
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("server")
    g.add_argument(
        "--host", metavar="ADDR", default="127.0.0.1", help="address to bind (default 127.0.0.1)"
    )
    g.add_argument(
        "--port", metavar="N", type=int, default=8000, help="port to bind (default 8000)"
    )
    g.add_argument(
        "--model", metavar="NAME", default="sim-model", help="served model name (default sim-model)"
    )
    g.add_argument(
        "--seed", metavar="N", type=int, default=0, help="seed of every random choice (default 0)"
    )
    g.add_argument(
        "--max-model-len",
        metavar="N",
        type=int,
        default=MODEL_MAX_LEN,
        help=f"context length; the simulated model holds at most {MODEL_MAX_LEN} tokens and a "
        "larger value is cut to that without a word, as /v1/models then says (max_model_len)",
    )
    g.add_argument(
        "--truth",
        metavar="FILE",
        default=os.environ.get("SERVESWEEP_SIM_TRUTH"),
        help="append ground-truth JSON lines (event, t, pid) to this file "
        "(default env SERVESWEEP_SIM_TRUTH)",
    )

    g = p.add_argument_group("GPUs")
    g.add_argument(
        "--gpus",
        metavar="LIST",
        type=_gpus,
        default=None,
        help="GPU indexes to use, e.g. 0,1 (default CUDA_VISIBLE_DEVICES, else 0)",
    )
    g.add_argument(
        "--fake-gpus",
        metavar="DIR",
        default=os.environ.get("SERVESWEEP_FAKE_GPUS"),
        help="fake GPU directory (default env SERVESWEEP_FAKE_GPUS; neither: no GPU accounting)",
    )
    g.add_argument(
        "--tensor-parallel-size",
        metavar="N",
        type=int,
        default=None,
        help="like a real engine: refuse to start unless exactly N GPUs are visible",
    )
    g.add_argument(
        "--mem-per-gpu",
        metavar="SIZE",
        type=_size,
        default=_size("1GiB"),
        help="memory per GPU (default 1GiB)",
    )

    g = p.add_argument_group("timing")
    g.add_argument(
        "--load-time", metavar="S", type=nn_float, default=1.0, help="weights load, s (default 1)"
    )
    g.add_argument(
        "--ttft-ms",
        metavar="MS",
        type=nn_float,
        default=20.0,
        help="time to first token at concurrency 1, ms (default 20)",
    )
    g.add_argument(
        "--prefill-tok-s",
        metavar="TOK_S",
        type=nn_float,
        default=0.0,
        help="prefill speed; adds prompt_tokens/prefill_tok_s to TTFT (default 0: none)",
    )
    g.add_argument(
        "--step-ms", metavar="MS", type=nn_float, default=10.0, help="decode step, ms (default 10)"
    )
    g.add_argument(
        "--cold-requests",
        metavar="N",
        type=nn_int,
        default=0,
        help="a fresh start is cold, warming linearly over N requests (default 0: never)",
    )
    g.add_argument(
        "--cold-slowdown",
        metavar="F",
        type=nn_float,
        default=1.0,
        help="decode steps right after start take F times longer (default 1)",
    )
    g.add_argument(
        "--batch-slowdown",
        metavar="F",
        type=nn_float,
        default=0.05,
        help="step time x (1 + F*(running-1)) (default 0.05)",
    )
    g.add_argument(
        "--max-num-seqs",
        metavar="N",
        type=int,
        default=256,
        help="requests decoded at once; more wait in a queue (default 256)",
    )
    g.add_argument(
        "--eos-range",
        metavar="MIN:MAX",
        default="16:256",
        help="without ignore_eos a request stops at a deterministic length in this range",
    )

    g = p.add_argument_group("speculative decoding (docs/sim.md)")
    g.add_argument(
        "--budget", metavar="N", type=nn_int, default=0, help="draft tokens (default 0: off)"
    )
    g.add_argument(
        "--topk", metavar="K", type=int, default=1, help="draft candidates per level (default 1)"
    )
    g.add_argument(
        "--window", metavar="W", type=nn_int, default=0, help="draft attention window (0: none)"
    )
    g.add_argument(
        "--verify-batch-cost",
        metavar="F",
        type=nn_float,
        default=0.0,
        help="step time + step_ms*F*budget*(running-1): verifying the other sequences' "
        "drafts, so the best budget falls as the batch grows (default 0)",
    )

    g = p.add_argument_group("failure modes")
    g.add_argument(
        "--release-delay",
        metavar="S",
        type=nn_float,
        default=0.0,
        help="GPU memory held S s after exit",
    )
    g.add_argument(
        "--shutdown-delay",
        metavar="S",
        type=nn_float,
        default=0.0,
        help="on SIGTERM keep answering /v1/models and /health for S s before exiting",
    )
    g.add_argument(
        "--shutdown-generation",
        choices=("serve", "fail"),
        default="serve",
        help="generation during the shutdown delay: serve (the old instance answers; "
        "default) or fail (HTTP 503)",
    )
    g.add_argument("--ignore-sigterm", action="store_true", help="ignore SIGTERM (needs KILL)")
    g.add_argument("--reuse-port", action="store_true", help="bind with SO_REUSEPORT")
    g.add_argument(
        "--orphan-worker",
        action="store_true",
        help="a worker child in its own session holds the GPU memory and survives "
        "the parent's SIGKILL (like a TP worker)",
    )
    g.add_argument("--crash-at-load", action="store_true", help="traceback, exit 1, during load")
    g.add_argument("--hang-at-load", action="store_true", help="stop progressing, never ready")
    g.add_argument(
        "--error-rate",
        metavar="P",
        type=_fraction,
        default=0.0,
        help="HTTP 500 on this fraction of generations",
    )
    g.add_argument(
        "--crash-after",
        metavar="N",
        type=nn_int,
        default=None,
        help="exit abruptly after N generations",
    )
    g.add_argument(
        "--models-before-ready",
        action="store_true",
        help="bind early: /v1/models 200 and /health 503 while loading, generation 503",
    )

    g = p.add_argument_group("correctness oracle")
    g.add_argument(
        "--correct-rate",
        metavar="P",
        type=_fraction,
        default=1.0,
        help="probability that a known eval task is answered correctly (default 1)",
    )
    g.add_argument(
        "--oracle",
        metavar="FILE",
        action="append",
        default=None,
        help="task JSONL file (repeatable; default: the builtin eval task files)",
    )
    return click_style(p)


def parse_args(argv: list[str] | None, prog: str = PROG) -> SimConfig:
    """Parse ``argv``; argparse exits 2 with ``error: ...`` on invalid flags. ``prog``
    names the program in usage and errors (``servesweep sim`` from the CLI)."""
    parser = build_parser(prog)
    ns = parser.parse_args(argv)
    gpus = ns.gpus
    if gpus is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = _gpus(visible) if visible is not None else (0,)
    try:
        lo, hi = (int(x) for x in ns.eos_range.split(":"))
        if not 1 <= lo <= hi:
            raise ValueError
    except ValueError:
        parser.error(f"argument --eos-range: invalid value {ns.eos_range!r} (use MIN:MAX)")
    if ns.topk < 1:
        parser.error(f"argument --topk: must be >= 1: {ns.topk}")
    if ns.max_num_seqs < 1:
        parser.error(f"argument --max-num-seqs: must be >= 1: {ns.max_num_seqs}")
    if not 0 <= ns.port <= 65535:
        parser.error(f"argument --port: invalid port {ns.port}")
    tp = ns.tensor_parallel_size
    if tp is not None and tp != len(gpus):
        parser.error(
            f"argument --tensor-parallel-size: {tp} needs {tp} GPUs, but {len(gpus)} are "
            f"visible ({','.join(str(g) for g in gpus)})"
        )
    return SimConfig(
        host=ns.host,
        port=ns.port,
        model=ns.model,
        gpus=gpus,
        fake_gpus=ns.fake_gpus or None,
        mem_per_gpu=ns.mem_per_gpu,
        load_time=ns.load_time,
        ttft_ms=ns.ttft_ms,
        prefill_tok_s=ns.prefill_tok_s,
        step_ms=ns.step_ms,
        batch_slowdown=ns.batch_slowdown,
        max_num_seqs=ns.max_num_seqs,
        seed=ns.seed,
        max_model_len=ns.max_model_len,
        budget=ns.budget,
        topk=ns.topk,
        window=ns.window,
        verify_batch_cost=ns.verify_batch_cost,
        release_delay=ns.release_delay,
        shutdown_delay=ns.shutdown_delay,
        shutdown_generation=ns.shutdown_generation,
        ignore_sigterm=ns.ignore_sigterm,
        reuse_port=ns.reuse_port,
        orphan_worker=ns.orphan_worker,
        crash_at_load=ns.crash_at_load,
        hang_at_load=ns.hang_at_load,
        error_rate=ns.error_rate,
        crash_after=ns.crash_after,
        models_before_ready=ns.models_before_ready,
        correct_rate=ns.correct_rate,
        oracle=tuple(ns.oracle) if ns.oracle is not None else None,
        truth=ns.truth or None,
        eos_min=lo,
        eos_max=hi,
        cold_requests=ns.cold_requests,
        cold_slowdown=ns.cold_slowdown,
    )
