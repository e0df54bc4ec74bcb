"""The search landscape's memory, as a real engine's would be: a vLLM-like engine
serving a 7.6 B model (Qwen2-7B's shape, bf16) with a one-layer EAGLE-style draft on a
24 GiB GPU, ``gpu-memory-utilization 0.9``, ``max-model-len 32768``.

The engine's truth (:func:`engine_memory`) is written here with its own constants, as
a real engine differs from any model of it: its activation peak per batched token is
40 % below what servesweep's predictor assumes (servers/memory/rules.py), its sampler
and verify buffers per sequence and draft token 25 % above, its CUDA graphs per
captured size 19 % above and its CUDA context 25 % above. The constants were chosen
so that the configurations that do not fit are close to those of the landscape's
earlier formula (15 of 48, 13 of them the same; the formula had 16). A configuration
is an OOM when weights, draft, workspace and the KV cache for one request of
``max-model-len`` exceed 0.9 of the GPU. What the predictor gets is what a user has:
the model's and the draft's ``config.json`` and the engine's settings
(:func:`sweep_server`); what calibrates it is what vLLM prints while loading
(:meth:`TrueMemory.measured`), for every configuration that came up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesweep.servers.memory.calibrate import MeasuredMemory

GiB = 2**30
MiB = 2**20
GPU_BYTES = 24 * GiB
UTIL = 0.9
MAX_MODEL_LEN = 32768

MODEL: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
DRAFT: dict[str, Any] = {
    **MODEL,
    "num_hidden_layers": 1,
    "architectures": ["EagleQwen2ForCausalLM"],
}

# the engine's own constants (what it really allocates)
_ACT_HIDDEN = 10  # bytes per batched token per hidden unit (predictor: 16)
_ACT_INTER = 3.6  # per intermediate unit (predictor: 6)
_SAMPLER = 20  # bytes per sequence per vocabulary entry (predictor: 16)
_VERIFY = 20  # per sequence, draft position and vocabulary entry (predictor: 16)
_GRAPH = 9.5 * MiB  # per captured CUDA graph size (predictor: 8 MiB)
_CONTEXT = 640 * MiB  # CUDA context, cuBLAS, NCCL (predictor: 512 MiB)


def _params(cfg: dict[str, Any]) -> int:
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h + h + 2 * kv  # + biases, norms
    return 2 * cfg["vocab_size"] * h + layers * per_layer + h


def _kv_per_token(cfg: dict[str, Any]) -> int:
    head = cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head * 2 * 2


@dataclass(frozen=True)
class TrueMemory:
    weights: int
    draft: int
    workspace: int
    kv_min: int
    kv_per_token: int
    graphs: int

    @property
    def budget(self) -> int:
        return int(UTIL * GPU_BYTES)

    @property
    def needed(self) -> int:
        return self.weights + self.draft + self.workspace + self.kv_min

    @property
    def oom(self) -> bool:
        return self.needed > self.budget

    def measured(self) -> MeasuredMemory:
        """What the engine prints while loading (``Model loading took``, ``Available KV
        cache memory``, ``GPU KV cache size``, ``Graph capturing ... took``)."""
        kv = self.budget - self.weights - self.draft - self.workspace
        return MeasuredMemory(
            engine="vllm",
            weights=self.weights + self.draft,
            kv_cache=kv,
            kv_tokens=kv // self.kv_per_token,
            workspace=self.graphs,
            device="GPU",
        )


def engine_memory(seqs: int, tokens: int, spec_tokens: int) -> TrueMemory:
    """What the engine allocates for one configuration (its truth, see the module doc)."""
    h, inter, vocab = MODEL["hidden_size"], MODEL["intermediate_size"], MODEL["vocab_size"]
    sizes = len([s for s in (1, 2, 4, *range(8, 513, 8)) if s <= min(512, 2 * seqs)])
    graphs = int(sizes * _GRAPH)
    draft = _params(DRAFT) * 2 if spec_tokens else 0
    per_token = _kv_per_token(MODEL) + (_kv_per_token(DRAFT) if spec_tokens else 0)
    workspace = int(
        tokens * (h * _ACT_HIDDEN + inter * _ACT_INTER)
        + seqs * vocab * _SAMPLER
        + (seqs * (spec_tokens + 1) * vocab * _VERIFY if spec_tokens else 0)
        + graphs
        + _CONTEXT
    )
    return TrueMemory(
        weights=_params(MODEL) * 2,
        draft=draft,
        workspace=workspace,
        kv_min=per_token * MAX_MODEL_LEN,
        kv_per_token=per_token,
        graphs=graphs,
    )


def write_models(folder: Path) -> tuple[Path, Path]:
    """The model's and the draft's ``config.json`` (no weights: the predictor counts
    them from the config, as for a model whose files live on another machine)."""
    model, draft = folder / "model", folder / "draft"
    for path, cfg in ((model, MODEL), (draft, DRAFT)):
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(cfg))
    return model, draft


def sweep_server(model: Path, draft: Path) -> dict[str, Any]:
    """The ``server`` section the predictor reads."""
    return {
        "engine": "vllm",
        "model": str(model),
        "args": {
            "gpu-memory-utilization": UTIL,
            "max-model-len": MAX_MODEL_LEN,
            "speculative-config.method": "eagle",
            "speculative-config.model": str(draft),
        },
    }
