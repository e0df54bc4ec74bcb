"""Each engine's memory rules: how a configuration's params and a model's facts become
bytes per device. Pure functions; the numbers each rule uses are stated in its
docstring and in docs/sweep-file.md ("Memory prediction").

Every rule returns a :class:`MemoryPrediction` before its verdict (see
:meth:`MemoryPrediction.with_verdict`), except where the engine itself refuses the
configuration (vLLM: no room for one request of ``max-model-len``; SGLang: no room
for the KV pool), which is ``oom`` with that reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from servesweep.servers.memory.facts import ModelFacts
from servesweep.servers.memory.gguf import tensor_bytes
from servesweep.servers.memory.prediction import (
    Calibration,
    Capacity,
    MemoryPrediction,
    unknown,
)

__all__ = ["RULES", "Params", "TrialShape", "predict"]

MiB = 2**20
GiB = 2**30
CUDA_CONTEXT = 512 * MiB
"""What a CUDA process holds before its first allocation (context, cuBLAS, NCCL
buffers): no engine's buffer report counts it; calibration replaces it."""


class Params:
    """A trial's merged params, looked up blind to dashes, underscores and dots."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        self._values: dict[str, Any] = {}
        for key, value in params.items():
            if isinstance(value, Mapping):
                for sub, inner in value.items():
                    self._values[_norm(f"{key}.{sub}")] = inner
            self._values[_norm(key)] = value

    def get(self, *names: str, default: Any = None) -> Any:
        for name in names:
            value = self._values.get(_norm(name))
            if value is not None:
                return value
        return default

    def num(self, *names: str, default: float) -> float:
        value = self.get(*names)
        try:
            return float(value) if value is not None and not isinstance(value, bool) else default
        except (TypeError, ValueError):
            return default

    def int(self, *names: str, default: int) -> int:
        return int(self.num(*names, default=float(default)))

    def flag(self, *names: str) -> bool:
        value = self.get(*names)
        if isinstance(value, str):
            return value.lower() in ("1", "true", "on", "yes")
        return bool(value)


def _norm(name: str) -> str:
    return name.replace("_", "-").replace(".", "-").lstrip("-").lower()


@dataclass(frozen=True)
class TrialShape:
    """Everything a rule reads about one configuration."""

    engine: str
    params: Params
    gpus: int
    """GPUs the trial runs on (0: none, the host)."""
    capacity: Capacity
    model: ModelFacts | None
    model_error: str = ""
    draft: ModelFacts | None = None
    draft_error: str = ""
    calibration: Calibration = field(default_factory=Calibration)


def _kv_row(facts: ModelFacts, type_k: str, type_v: str) -> int:
    """KV bytes per token per layer in llama.cpp's types (``f16``, ``q8_0``, ...)."""
    k = tensor_bytes(type_k, (facts.n_kv_heads * facts.head_dim_k,))
    v = tensor_bytes(type_v, (facts.n_kv_heads * facts.head_dim_v,))
    if facts.mla:
        k = tensor_bytes(type_k, (facts.kv_lora_rank + facts.qk_rope_head_dim,))
        v = tensor_bytes(type_v, (facts.kv_lora_rank,))
    return k + v


def _cache_bytes(dtype: Any, model_bytes: float) -> float:
    text = str(dtype or "auto").lower()
    if text.startswith(("fp8", "float8", "int8")):
        return 1.0
    if text in ("fp4", "nvfp4"):
        return 0.5
    if text in ("float32", "fp32"):
        return 4.0
    return model_bytes if text == "auto" else 2.0


# -- llama.cpp ------------------------------------------------------------------------

_FLOAT_CACHE = ("f16", "f32", "bf16")


def _llamacpp(shape: TrialShape) -> MemoryPrediction:
    """llama.cpp (``llama-server`` and llama-cpp-python).

    Weights: the GGUF's tensors (aligned as llama.cpp maps them); with GPUs, the last
    ``n-gpu-layers`` blocks (and the output head once all blocks are offloaded) split
    evenly over the GPUs, the token embedding stays in host memory. KV cache: layers x
    KV heads x (key + value head size) in ``cache-type-k/-v`` (default f16) x
    ``ctx-size`` cells (0: the model's training context; llama-server divides them
    among ``parallel`` sequences, the total stays). Workspace: the compute buffer,
    ``ubatch-size`` tokens x the larger of the logits (vocabulary + hidden, f32) and
    the activations (36 bytes per hidden unit; without flash attention, the scores of
    every head over a sequence's context, ``ctx-size / parallel``), plus the f16 mask
    with flash attention (on by default in llama-server: ``-fa auto``), and the host's
    output buffer (``parallel`` x vocabulary x 4); on a GPU with flash attention and a
    quantized ``cache-type-k/-v``, f16 copies of one layer's keys and values over all
    ``ctx-size`` cells; fitted to llama-server's buffer report (docs/benchmarks.md).
    On a GPU, the CUDA context and library workspaces (512 MiB until a trial's NVML
    figure calibrates it: :attr:`Calibration.overhead`). On the host, the CPU backend's
    repacked copies of quantized block weights (:attr:`ModelFacts.repack_bytes`) count
    with the weights. Draft model (``spec-draft-model``, loaded with a context of its
    own whether or not a ``spec-type`` drafts with it): its weights and that context's
    KV cache over ``ctx-size`` cells (``spec-draft-type-k/-v``, default f16; an older
    build's ``ctx-size-draft``); its compute and output buffers count with the
    workspace."""
    facts = shape.model
    if facts is None:
        return unknown(shape.engine, shape.model_error, shape.capacity)
    if facts.format != "gguf":
        return unknown(shape.engine, f"{facts.source}: llama.cpp loads GGUF files only")
    p = shape.params
    ctx = p.int("ctx-size", "c", "n-ctx", default=4096 if shape.engine == "llama-server" else 2048)
    if ctx <= 0:
        ctx = facts.n_ctx_train or 4096
    ubatch = p.int("ubatch-size", "ub", "n-ubatch", default=512)
    batch = p.int("batch-size", "b", "n-batch", default=2048)
    ubatch = min(ubatch, batch, ctx)
    parallel = max(p.int("parallel", "np", default=1), 1)
    type_k = str(p.get("cache-type-k", "ctk", default="f16")).lower()
    type_v = str(p.get("cache-type-v", "ctv", default="f16")).lower()
    on_gpu = shape.capacity.device == "gpu" and shape.gpus > 0
    n_layers = facts.n_layers
    if on_gpu:
        ngl = p.int("n-gpu-layers", "ngl", "gpu-layers", default=999)
        ngl = n_layers + 1 if ngl < 0 else min(ngl, n_layers + 1)
        first = n_layers - min(ngl, n_layers)
        weights = sum(facts.layer_bytes[first:]) + (facts.output_bytes if ngl > n_layers else 0)
        layers = n_layers - first
        split = shape.gpus
    else:
        weights, layers, split = facts.weights_bytes, n_layers, 1
    try:
        kv = _kv_row(facts, type_k, type_v) * layers * ctx
    except ValueError as exc:
        return unknown(shape.engine, f"cache type: {exc}", shape.capacity)
    # llama-server: -fa auto (on where the device has the kernels); llama-cpp-python: off
    default_fa = "auto" if shape.engine == "llama-server" else "off"
    fa = str(p.get("flash-attn", "fa", default=default_fa)).lower()
    flash = fa in ("on", "1", "true", "auto")
    unified = p.flag("kv-unified", "kvu") or shape.engine != "llama-server"
    ctx_seq = ctx if unified else max(ctx // parallel, 1)
    workspace = _compute_bytes(facts, ubatch, ctx_seq, flash) + parallel * facts.vocab * 4
    if flash and on_gpu and not facts.mla:
        # CUDA's flash attention reads a quantized cache through f16 copies of one
        # layer's K and V over every cell (measured on an H200: docs/benchmarks.md)
        dims = (facts.head_dim_k if type_k not in _FLOAT_CACHE else 0) + (
            facts.head_dim_v if type_v not in _FLOAT_CACHE else 0
        )
        workspace += ctx * facts.n_kv_heads * dims * 2
    if not on_gpu:  # the CPU backend's repacked copies of quantized block weights
        weights += facts.repack_bytes
    draft = 0
    if p.get("model-draft", "md", "spec-draft-model"):
        d = shape.draft
        if d is None:
            return unknown(shape.engine, f"draft model: {shape.draft_error}", shape.capacity)
        ctx_draft = p.int("ctx-size-draft", "cd", default=ctx) or ctx
        type_dk = str(p.get("spec-draft-type-k", "cache-type-k-draft", "ctkd", default="f16"))
        type_dv = str(p.get("spec-draft-type-v", "cache-type-v-draft", "ctvd", default="f16"))
        try:
            draft_kv = _kv_row(d, type_dk.lower(), type_dv.lower()) * d.n_layers * ctx_draft
        except ValueError as exc:
            return unknown(shape.engine, f"draft cache type: {exc}", shape.capacity)
        draft = d.weights_bytes + (0 if on_gpu else d.repack_bytes) + draft_kv
        # the draft's own context: its compute buffer and one output row per sequence
        workspace += _compute_bytes(d, ubatch, ctx_seq, flash) + parallel * d.vocab * 4
    cal = shape.calibration
    weights, kv = int(weights * cal.weights), int(kv * cal.kv_cache)
    workspace = int(workspace * cal.workspace) + (_context(cal) if on_gpu else 0)
    capacity = shape.capacity.bytes or 0
    return MemoryPrediction(
        engine=shape.engine,
        verdict="fits",
        weights=weights // split,
        kv_cache=kv // split,
        draft=draft // split,
        workspace=workspace,
        capacity=capacity,
        device_bytes=capacity,
        device="gpu" if on_gpu else "host",
        kv_tokens=ctx,
        reason=f"{facts.weights_how}, {layers}/{n_layers} layers here, ctx-size {ctx}",
        details={"ctx": ctx, "ubatch": ubatch, "parallel": parallel, "layers": layers},
    )


def _compute_bytes(facts: ModelFacts, ubatch: int, ctx_seq: int, flash: bool) -> int:
    """llama.cpp's compute buffer for ``ubatch`` tokens: the larger of the logits and
    the activations per token, and the f16 mask (flash attention) or the attention
    scores of every head over a sequence's context (without)."""
    hidden, vocab = facts.hidden, facts.vocab
    logits = vocab * 4 + hidden * 4
    if flash:  # the f16 mask over a sequence's context; activations, reused
        per_token, mask = max(logits, hidden * 36), ubatch * ctx_seq * 2
    else:  # the attention scores of every head over a sequence's context
        scores = ctx_seq * max(facts.n_heads, 1) * 4 + ctx_seq * 4 + hidden * 24
        per_token, mask = max(logits, scores), 0
    return ubatch * per_token + mask


def context_bytes(cal: Calibration) -> int:
    """Per-GPU memory outside every component: measured once calibrated."""
    return cal.overhead if cal.trials and cal.overhead else CUDA_CONTEXT


_context = context_bytes


# -- vLLM ----------------------------------------------------------------------------


def _sharded_weights(facts: ModelFacts, tp: int, pp: int, ep: int) -> int:
    dense = facts.weights_bytes - facts.expert_bytes
    return int(dense / tp / pp + facts.expert_bytes / ep / pp)


def _kv_per_token(facts: ModelFacts, tp: int, pp: int, cache: float) -> float:
    """KV bytes per token on one GPU: heads split by TP (at least one per GPU), layers
    by PP; MLA's latent is not split by TP."""
    layers = facts.n_layers / pp
    if facts.mla:
        return layers * (facts.kv_lora_rank + facts.qk_rope_head_dim) * cache
    heads = max(facts.n_kv_heads / tp, 1.0)
    return layers * heads * (facts.head_dim_k + facts.head_dim_v) * cache


def _vllm(shape: TrialShape) -> MemoryPrediction:
    """vLLM: the engine takes ``gpu-memory-utilization`` (default 0.9) of each GPU;
    weights are split by ``tensor-parallel-size`` and ``pipeline-parallel-size``
    (routed experts by TP x DP with ``enable-expert-parallel``); the workspace is the
    profile run's activations for ``max-num-batched-tokens`` (default 8192: 16 bytes
    per hidden unit and 6 per intermediate unit and token), the sampler's buffers for
    ``max-num-seqs`` (default 256; 4 f32 copies of the vocabulary per sequence), with
    speculative decoding the verify step's (the same per sequence and draft position
    of ``num_speculative_tokens`` + 1), CUDA graphs (8 MiB per captured size, 67 sizes
    up to 512 by default, none with ``enforce-eager``) and the CUDA context; the KV
    cache (the target's and the draft's, per token) is what is left, and vLLM refuses
    to start when it holds fewer than ``max-model-len`` tokens (default: the model's
    context)."""
    facts = shape.model
    if facts is None:
        return unknown(shape.engine, shape.model_error, shape.capacity)
    p = shape.params
    tp = max(p.int("tensor-parallel-size", "tp", default=1), 1)
    pp = max(p.int("pipeline-parallel-size", "pp", default=1), 1)
    dp = max(p.int("data-parallel-size", "dp", default=1), 1)
    ep = tp * dp if p.flag("enable-expert-parallel") else tp
    util = p.num("gpu-memory-utilization", default=0.9)
    seqs = p.int("max-num-seqs", default=256)
    tokens = p.int("max-num-batched-tokens", default=8192)
    max_len = p.int("max-model-len", default=facts.n_ctx_train or 8192)
    weights = _sharded_weights(facts, tp, pp, ep)
    act = tokens * (facts.hidden * 2 * 8 + facts.intermediate / tp * 2 * 3)
    sampler = seqs * facts.vocab * 4 * 4  # f32 logits, probabilities, top-k/top-p sort
    graphs = 0
    if not p.flag("enforce-eager"):
        sizes = p.get("cuda-graph-sizes", "compilation-config.cudagraph-capture-sizes")
        count = len(sizes) if isinstance(sizes, list) else 0
        if not count:
            top = p.int("max-cudagraph-capture-size", default=min(512, 2 * seqs))
            count = len([s for s in (1, 2, 4, *range(8, 513, 8)) if s <= top])
        graphs = count * 8 * MiB
    cache = _cache_bytes(p.get("kv-cache-dtype"), facts.dtype_bytes)
    per_token = _kv_per_token(facts, tp, pp, cache)
    draft, extra_tokens = _vllm_draft(shape, tp, cache)
    if isinstance(draft, MemoryPrediction):
        return draft
    cal = shape.calibration
    per_token = (per_token + extra_tokens) * cal.kv_cache
    weights, draft = int(weights * cal.weights), int(draft * cal.weights)
    k = p.int("speculative-config.num-speculative-tokens", default=0)
    verify = seqs * (k + 1) * facts.vocab * 4 * 4 if k else 0
    workspace = int((act + sampler + graphs + verify) * cal.workspace) + _context(cal)
    total = shape.capacity.bytes or 0
    budget = int(util * total)
    left = budget - weights - draft - workspace
    given = p.get("kv-cache-memory-bytes", "kv-cache-memory")
    kv = int(float(given)) if given is not None else max(left, 0)
    need = int(per_token * max_len)
    base = MemoryPrediction(
        engine=shape.engine,
        verdict="fits",
        weights=weights,
        draft=draft,
        workspace=workspace,
        capacity=budget,
        device_bytes=total,
        kv_tokens=int(kv / per_token) if per_token else 0,
        kv_needed=need if given is None else 0,
        reason=f"{facts.weights_how}; gpu-memory-utilization {util:g} of the GPU",
    )
    if kv < need:
        return replace(
            base,
            verdict="oom",
            kv_cache=need,
            reason=f"KV cache room for {base.kv_tokens} tokens, max-model-len {max_len} needs "
            f"{need // MiB} MiB",
        )
    return replace(base, kv_cache=kv)


def _vllm_draft(shape: TrialShape, tp: int, cache: float) -> tuple[Any, float]:
    """(draft weights, draft KV bytes per token) of vLLM's speculative config."""
    p = shape.params
    method = str(p.get("speculative-config.method", default="")).lower()
    model = p.get("speculative-config.model")
    if not model or method in ("ngram", "suffix"):
        return 0, 0.0
    if p.get("speculative-config.num-speculative-tokens") in (0, "0"):
        return 0, 0.0  # no draft tokens: no speculative decoding
    if shape.draft is None:
        return unknown(shape.engine, f"draft model: {shape.draft_error}", shape.capacity), 0.0
    dtp = max(p.int("speculative-config.draft-tensor-parallel-size", default=tp), 1)
    d = shape.draft
    return int(d.weights_bytes / dtp), _kv_per_token(d, dtp, 1, cache)


# -- SGLang --------------------------------------------------------------------------


def _sglang(shape: TrialShape) -> MemoryPrediction:
    """SGLang: ``mem-fraction-static`` (default 0.88) of each GPU holds the weights
    (split by ``tp-size``; routed experts by ``ep-size``) and the KV pool (all of what
    is left, or ``max-total-tokens``); outside it, the workspace: ``chunked-prefill-size``
    tokens of activations (default 8192), CUDA graphs up to ``cuda-graph-max-bs``
    (default 160; 8 MiB per captured size) and the CUDA context. A speculative draft
    (``speculative-draft-model-path``) sits in the static share; its verify step adds
    ``cuda-graph-max-bs`` x ``speculative-num-draft-tokens`` logits."""
    facts = shape.model
    if facts is None:
        return unknown(shape.engine, shape.model_error, shape.capacity)
    p = shape.params
    tp = max(p.int("tp-size", "tp", "tensor-parallel-size", default=1), 1)
    pp = max(p.int("pp-size", "pipeline-parallel-size", default=1), 1)
    ep = max(p.int("ep-size", "ep", default=tp), 1)
    frac = p.num("mem-fraction-static", default=0.88)
    chunk = p.int("chunked-prefill-size", default=8192)
    graph_bs = p.int("cuda-graph-max-bs", default=160)
    total = shape.capacity.bytes or 0
    cal = shape.calibration
    weights = int(_sharded_weights(facts, tp, pp, ep) * cal.weights)
    cache = _cache_bytes(p.get("kv-cache-dtype"), facts.dtype_bytes)
    per_token = _kv_per_token(facts, tp, pp, cache) * cal.kv_cache
    draft = 0
    verify = 0
    if p.get("speculative-algorithm"):
        steps = p.int("speculative-num-steps", default=3)
        topk = p.int("speculative-eagle-topk", default=1)
        drafts = p.int(
            "speculative-ddtree-budget",
            "speculative-num-draft-tokens",
            "speculative-dflash-block-size",
            default=steps * topk + 1,
        )
        if p.get("speculative-draft-model-path"):
            if shape.draft is None:
                return unknown(shape.engine, f"draft model: {shape.draft_error}", shape.capacity)
            draft = int(shape.draft.weights_bytes / tp)
            per_token += _kv_per_token(shape.draft, tp, 1, cache)
        verify = graph_bs * (drafts + steps * topk) * (facts.vocab * 4 + facts.hidden * 2 * 4)
    static = int(frac * total)
    pool = static - weights - draft
    tokens = int(pool / per_token) if per_token and pool > 0 else 0
    limit = p.get("max-total-tokens")
    if limit is not None and tokens > int(limit):
        tokens = int(limit)
    act = chunk * (facts.hidden * 2 * 8 + facts.intermediate / tp * 2 * 3)
    workspace = int(
        (act + graph_bs * 8 * MiB + facts.vocab * 4 * chunk // 8 + verify) * cal.workspace
    )
    workspace += _context(cal)
    base = MemoryPrediction(
        engine=shape.engine,
        verdict="fits",
        weights=weights,
        draft=draft,
        workspace=workspace,
        kv_cache=int(tokens * per_token),
        capacity=total,
        device_bytes=total,
        kv_tokens=tokens,
        reason=f"{facts.weights_how}; mem-fraction-static {frac:g}",
    )
    if tokens <= 0:
        return replace(
            base,
            verdict="oom",
            kv_cache=0,
            reason=f"weights take {(weights + draft) // MiB} MiB of the static "
            f"{static // MiB} MiB: no room for the KV pool",
        )
    return base


# -- TensorRT-LLM, the simulated engine ----------------------------------------------


def _trtllm(shape: TrialShape) -> MemoryPrediction:
    """TensorRT-LLM: weights split by ``tp_size``; the KV cache takes
    ``kv_cache_config.free_gpu_memory_fraction`` (default 0.9) of what is free after
    weights and the workspace (``max_num_tokens`` of activations, default 8192)."""
    facts = shape.model
    if facts is None:
        return unknown(shape.engine, shape.model_error, shape.capacity)
    p = shape.params
    tp = max(
        p.int("tp-size", "tp_size", "extra-llm-api-options.tensor-parallel-size", default=1), 1
    )
    frac = p.num("extra-llm-api-options.kv-cache-config.free-gpu-memory-fraction", default=0.9)
    tokens = p.int("max-num-tokens", default=8192)
    total = shape.capacity.bytes or 0
    weights = _sharded_weights(facts, tp, 1, tp)
    workspace = int(
        tokens * (facts.hidden * 2 * 8 + facts.intermediate / tp * 2 * 3) + CUDA_CONTEXT
    )
    free = total - weights - workspace
    kv = int(max(free, 0) * frac)
    per_token = _kv_per_token(facts, tp, 1, facts.dtype_bytes)
    return MemoryPrediction(
        engine=shape.engine,
        verdict="fits" if free > 0 else "oom",
        weights=weights,
        kv_cache=kv,
        workspace=workspace,
        capacity=total,
        device_bytes=total,
        kv_tokens=int(kv / per_token) if per_token else 0,
        reason=f"{facts.weights_how}; free_gpu_memory_fraction {frac:g}",
    )


def _sim(shape: TrialShape) -> MemoryPrediction:
    """The simulated engine: ``mem-per-gpu`` (default 1 GiB) on each of its GPUs, all
    of it at load; the fake GPUs count it exactly, so the margin is 0."""
    from servesweep.fakegpu.units import parse_size

    value = shape.params.get("mem-per-gpu", default="1GiB")
    try:
        per_gpu = value if isinstance(value, int) else parse_size(str(value))
    except ValueError:
        return unknown(shape.engine, f"mem-per-gpu {value!r} is not a size", shape.capacity)
    total = shape.capacity.bytes or 0
    return MemoryPrediction(
        engine=shape.engine,
        verdict="fits",
        weights=per_gpu,
        exact=True,
        capacity=total,
        device_bytes=total,
        reason="mem-per-gpu, all of it at load",
    )


RULES: dict[str, Callable[[TrialShape], MemoryPrediction]] = {
    "llama-server": _llamacpp,
    "llamacpp": _llamacpp,
    "vllm": _vllm,
    "sglang": _sglang,
    "trtllm": _trtllm,
    "sim": _sim,
}


def predict(shape: TrialShape) -> MemoryPrediction:
    """The prediction for one configuration, verdict included."""
    rule = RULES.get(shape.engine)
    if rule is None:
        return unknown(shape.engine, f"no memory model for engine {shape.engine!r}")
    raw = rule(shape)
    if raw.verdict != "unknown" and not shape.capacity.bytes:
        return replace(raw, verdict="unknown", reason="the device's memory is unknown")
    return replace(raw.with_verdict(), calibrated=shape.calibration.trials)
