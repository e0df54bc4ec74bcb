"""What a memory prediction needs to know about a model, read from its files.

:class:`ModelFacts` is plain data: tensor bytes (per layer for a GGUF, split into
routed experts and the rest for safetensors), the attention shape that sizes the KV
cache (layers, KV heads, key and value head sizes, or MLA's latent rank plus its
rotary part) and the sizes that shape the workspace (hidden size, vocabulary).

Sources, tried in order (:func:`read_model_facts`): a GGUF file (its header), a
directory with ``config.json`` (weights from the safetensors headers, else the
index's ``total_size``, else counted from the config), a ``config.json`` file
(``server.model_config``), a Hugging Face id found in the local hub cache. A model
that none of these reads raises :class:`ModelFilesUnreadable` with the reason.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesweep.errors import ConfigError
from servesweep.servers.memory.gguf import GgufFile, ggml_type_name, read_gguf

__all__ = ["ModelFacts", "ModelFilesUnreadable", "read_model_facts"]

_DTYPE_BYTES = {
    "float32": 4.0,
    "float": 4.0,
    "float16": 2.0,
    "half": 2.0,
    "bfloat16": 2.0,
    "float8_e4m3fn": 1.0,
    "float8": 1.0,
}
_ST_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "BOOL": 1,
}
_MAX_HEADER = 1 << 27


class ModelFilesUnreadable(ConfigError):
    """The model's files cannot be read: the prediction's verdict is ``unknown``."""


@dataclass(frozen=True)
class ModelFacts:
    source: str
    """The file or folder the facts were read from."""
    format: str
    """``gguf`` or ``hf`` (config.json and safetensors)."""
    n_layers: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int
    hidden: int
    vocab: int
    weights_bytes: int
    """Every tensor of the model."""
    weights_how: str
    """How the bytes were found: ``gguf tensors``, ``safetensors headers``,
    ``safetensors index``, ``counted from config.json``."""
    dtype_bytes: float = 2.0
    """Bytes per element of activations and of the default KV cache."""
    layer_bytes: tuple[int, ...] = ()
    """GGUF: bytes of each block (``blk.N.*``)."""
    input_bytes: int = 0
    """GGUF: the token embedding (kept in host memory by llama.cpp)."""
    output_bytes: int = 0
    """GGUF: the output head and final norm (offloaded after the last layer)."""
    expert_bytes: int = 0
    """Routed experts' tensors (split by expert parallelism)."""
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    """MLA (DeepSeek/Kimi style): the cache holds the latent plus the rotary key."""
    n_ctx_train: int = 0
    intermediate: int = 0
    n_heads: int = 0
    repack_bytes: int = 0
    """GGUF: the block weights llama.cpp's CPU backend copies into its own layout for
    its matrix kernels (x86 with AVX2: ``q4_0``, ``q4_k``, ``iq4_nl`` with rows a multiple
    of 8; its ``CPU_REPACK`` buffer), held beside the mapped file."""

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def kv_elements_per_token(self) -> int:
        """Cache elements per token over all layers (K and V)."""
        if self.mla:
            return self.n_layers * (self.kv_lora_rank + self.qk_rope_head_dim)
        return self.n_layers * self.n_kv_heads * (self.head_dim_k + self.head_dim_v)


def read_model_facts(model: str, model_config: str | None = None) -> ModelFacts:
    """The facts of ``model`` (a GGUF file, a model folder, a Hugging Face id in the
    local cache), or of ``model_config`` (a config.json) when given."""
    if model_config:
        return _from_config_file(Path(model_config))
    path = Path(model).expanduser()
    if path.is_file():
        if path.name == "config.json":
            return _from_config_file(path)
        return _from_gguf(read_gguf(path))
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if (path / "config.json").is_file():
            return _from_config_file(path / "config.json")
        if len(ggufs) == 1:
            return _from_gguf(read_gguf(ggufs[0]))
        raise ModelFilesUnreadable(f"{path}: no config.json or single GGUF file in the folder")
    cached = _hub_snapshot(model)
    if cached is not None:
        return _from_config_file(cached / "config.json")
    raise ModelFilesUnreadable(
        f"model {model!r} is not a file, a folder or a Hugging Face id in the local cache "
        "(set server.model_config to its config.json)"
    )


def _hub_snapshot(model: str) -> Path | None:
    if model.count("/") != 1 or model.startswith(("/", ".")):
        return None
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub"
    )
    snapshots = Path(hub) / f"models--{model.replace('/', '--')}" / "snapshots"
    try:
        found = sorted(
            (p for p in snapshots.iterdir() if (p / "config.json").is_file()),
            key=lambda p: p.stat().st_mtime,
        )
    except OSError:
        return None
    return found[-1] if found else None


# -- GGUF ---------------------------------------------------------------------------


_REPACKED = {"q4_0": 8, "q4_k": 8, "iq4_nl": 8}
"""ggml types llama.cpp's CPU backend repacks on x86 with AVX2, and the multiple of rows
it needs (ggml-cpu/repack.cpp). Measured: the Q4_K blocks of Qwen2.5-Coder (docs/real-models.md)."""


def _from_gguf(f: GgufFile) -> ModelFacts:
    n_layers = int(f.arch_value("block_count", 0) or 0)
    n_heads = int(f.arch_value("attention.head_count", 0) or 0)
    hidden = int(f.arch_value("embedding_length", 0) or 0)
    if not n_layers or not n_heads or not hidden:
        raise ModelFilesUnreadable(
            f"{f.path}: the GGUF metadata has no block_count, head_count or embedding_length "
            f"for architecture {f.architecture!r}"
        )
    kv_heads = f.arch_value("attention.head_count_kv", n_heads)
    if isinstance(kv_heads, list):  # per-layer counts: the largest sizes the cache
        kv_heads = max(int(k) for k in kv_heads)
    if isinstance(n_heads, list):
        n_heads = max(int(k) for k in n_heads)
    head_k = int(f.arch_value("attention.key_length", hidden // n_heads))
    head_v = int(f.arch_value("attention.value_length", hidden // n_heads))
    layer_bytes = [0] * n_layers
    input_bytes = output_bytes = expert_bytes = other = repack = 0
    align = f.alignment
    for t in f.tensors:
        size = -(-t.nbytes // align) * align
        if t.name.startswith("blk."):
            index = t.name.split(".")[1]
            if index.isdigit() and int(index) < n_layers:
                layer_bytes[int(index)] += size
                rows = _REPACKED.get(ggml_type_name(t.ggml_type), 0)
                if rows and len(t.shape) == 2 and t.shape[1] % rows == 0:
                    repack += t.nbytes
                if "_exps" in t.name:
                    expert_bytes += size
                continue
        if t.name.startswith("token_embd"):
            input_bytes += size
        elif t.name.startswith("output"):
            output_bytes += size
        else:
            other += size
    vocab = f.metadata.get("tokenizer.ggml.tokens")
    vocab_n = int(f.arch_value("vocab_size", 0) or 0) or (
        vocab if isinstance(vocab, int) else len(vocab) if isinstance(vocab, list) else 0
    )
    kv_lora = int(f.arch_value("attention.kv_lora_rank", 0) or 0)
    rope = int(f.arch_value("rope.dimension_count", 0) or 0) if kv_lora else 0
    return ModelFacts(
        source=f.path,
        format="gguf",
        n_layers=n_layers,
        n_kv_heads=int(kv_heads),
        head_dim_k=head_k,
        head_dim_v=head_v,
        hidden=hidden,
        vocab=vocab_n,
        weights_bytes=sum(layer_bytes) + input_bytes + output_bytes + other,
        weights_how="gguf tensors",
        layer_bytes=tuple(layer_bytes),
        input_bytes=input_bytes,
        output_bytes=output_bytes + other,
        expert_bytes=expert_bytes,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
        n_ctx_train=int(f.arch_value("context_length", 0) or 0),
        intermediate=int(f.arch_value("feed_forward_length", 0) or 0)
        if not isinstance(f.arch_value("feed_forward_length", 0), list)
        else 0,
        n_heads=int(n_heads),
        repack_bytes=repack,
    )


# -- config.json and safetensors ------------------------------------------------------


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelFilesUnreadable(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ModelFilesUnreadable(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelFilesUnreadable(f"{path}: expected a JSON object")
    return data


def _int(cfg: dict[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return int(value)
    return default


def _from_config_file(path: Path) -> ModelFacts:
    outer = _load_json(path)
    cfg = dict(outer)
    if isinstance(outer.get("text_config"), dict):
        cfg = {**outer, **outer["text_config"]}
    n_layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    n_heads = _int(cfg, "num_attention_heads", "n_head")
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    if not n_layers or not n_heads or not hidden:
        raise ModelFilesUnreadable(
            f"{path}: no num_hidden_layers, num_attention_heads or hidden_size"
        )
    kv_heads = _int(cfg, "num_key_value_heads", "n_head_kv", default=n_heads)
    head = _int(cfg, "head_dim", default=hidden // n_heads)
    kv_lora = _int(cfg, "kv_lora_rank")
    rope = _int(cfg, "qk_rope_head_dim") if kv_lora else 0
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    dtype_bytes = _DTYPE_BYTES.get(dtype, 2.0)
    weights, experts, how = _weights(path.parent, cfg, n_layers, hidden, n_heads, kv_heads, head)
    return ModelFacts(
        source=str(path),
        format="hf",
        n_layers=n_layers,
        n_kv_heads=kv_heads,
        head_dim_k=head,
        head_dim_v=_int(cfg, "v_head_dim", default=head),
        hidden=hidden,
        vocab=_int(cfg, "vocab_size", default=32000),
        weights_bytes=weights,
        weights_how=how,
        dtype_bytes=dtype_bytes if dtype_bytes >= 2 else 2.0,
        expert_bytes=experts,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
        n_ctx_train=_int(cfg, "max_position_embeddings", "n_positions"),
        intermediate=_int(cfg, "intermediate_size", "n_inner"),
        n_heads=n_heads,
    )


def _is_expert(name: str) -> bool:
    return ".experts." in name and "shared_expert" not in name


def _weights(
    folder: Path, cfg: dict[str, Any], n_layers: int, hidden: int, n_heads: int, kv: int, head: int
) -> tuple[int, int, str]:
    """(bytes, routed experts' bytes, how) from the safetensors beside config.json."""
    files = sorted(folder.glob("*.safetensors"))
    if files:
        total = experts = 0
        for file in files:
            for name, nbytes in _safetensors_sizes(file):
                total += nbytes
                if _is_expert(name):
                    experts += nbytes
        return total, experts, "safetensors headers"
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        data = _load_json(index)
        size = data.get("metadata", {}).get("total_size")
        if isinstance(size, int) and size > 0:
            return size, _experts_share(cfg, size), "safetensors index"
    count, expert_count = _count_params(cfg, n_layers, hidden, n_heads, kv, head)
    quant = cfg.get("quantization_config")
    per = _DTYPE_BYTES.get(str(cfg.get("torch_dtype") or "bfloat16"), 2.0)
    if isinstance(quant, dict):
        bits = quant.get("bits") or quant.get("w_bit")
        method = str(quant.get("quant_method", ""))
        if isinstance(bits, int) and bits > 0:
            per = bits / 8 * 1.03  # group scales and zeros
        elif "fp8" in method or "fp4" in method:
            per = 1.0 if "fp8" in method else 0.56
    return int(count * per), int(expert_count * per), "counted from config.json"


def _experts_share(cfg: dict[str, Any], total: int) -> int:
    count, experts = _count_params(
        cfg,
        _int(cfg, "num_hidden_layers"),
        _int(cfg, "hidden_size"),
        _int(cfg, "num_attention_heads", default=1),
        _int(cfg, "num_key_value_heads", "num_attention_heads", default=1),
        _int(cfg, "head_dim", default=0)
        or _int(cfg, "hidden_size") // _int(cfg, "num_attention_heads", default=1),
    )
    return int(total * experts / count) if count else 0


def _count_params(
    cfg: dict[str, Any], n_layers: int, hidden: int, n_heads: int, kv: int, head: int
) -> tuple[int, int]:
    """(parameters, routed experts' parameters) of a decoder from its config."""
    vocab = _int(cfg, "vocab_size", default=32000)
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    kv_lora = _int(cfg, "kv_lora_rank")
    if kv_lora:
        q_lora = _int(cfg, "q_lora_rank")
        nope = _int(cfg, "qk_nope_head_dim")
        rope = _int(cfg, "qk_rope_head_dim")
        v_head = _int(cfg, "v_head_dim", default=head)
        q = (
            hidden * q_lora + q_lora * n_heads * (nope + rope)
            if q_lora
            else (hidden * n_heads * (nope + rope))
        )
        attn = q + hidden * (kv_lora + rope) + kv_lora * n_heads * (nope + v_head)
        attn += n_heads * v_head * hidden
    else:
        attn = hidden * n_heads * head + 2 * hidden * kv * head + n_heads * head * hidden
    inter = _int(cfg, "intermediate_size", default=4 * hidden)
    n_experts = _int(cfg, "n_routed_experts", "num_experts", "num_local_experts")
    expert_params = 0
    if n_experts:
        moe_inter = _int(cfg, "moe_intermediate_size", default=inter)
        shared = _int(cfg, "n_shared_experts", "num_shared_experts")
        dense_first = _int(cfg, "first_k_dense_replace")
        moe_layers = max(n_layers - dense_first, 0)
        expert_params = moe_layers * n_experts * 3 * hidden * moe_inter
        mlp = moe_layers * (shared * 3 * hidden * moe_inter + hidden * n_experts)
        mlp += dense_first * 3 * hidden * inter
    else:
        mlp = n_layers * 3 * hidden * inter
    total = embed + n_layers * attn + mlp + expert_params + n_layers * 2 * hidden
    return total, expert_params


def _safetensors_sizes(file: Path) -> list[tuple[str, int]]:
    """(tensor name, bytes) of one safetensors file, from its header only."""
    try:
        with open(file, "rb") as raw:
            head = raw.read(8)
            if len(head) != 8:
                raise ModelFilesUnreadable(f"{file}: too short for a safetensors file")
            (length,) = struct.unpack("<Q", head)
            if length > _MAX_HEADER:
                raise ModelFilesUnreadable(f"{file}: a {length}-byte header (not safetensors?)")
            header = json.loads(raw.read(length))
    except OSError as exc:
        raise ModelFilesUnreadable(f"cannot read {file}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ModelFilesUnreadable(f"{file}: the safetensors header is not JSON") from exc
    out = []
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        offsets = info.get("data_offsets")
        if isinstance(offsets, list) and len(offsets) == 2:
            out.append((name, int(offsets[1]) - int(offsets[0])))
    return out
