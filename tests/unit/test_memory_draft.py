"""llama-server's draft model in the memory prediction: its weights and its own
context's KV cache (llama.cpp: ``common_speculative_init_result``), its compute and
output buffers in the workspace; and the CPU backend's repacked copies of quantized
block weights."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.gguf_model import TinyLlamaShape, write_tiny_gguf
from servesweep.servers.memory import Capacity, MemoryModel, read_model_facts
from servesweep.spec.load import load_sweep_text

GiB = 2**30
TARGET = TinyLlamaShape(n_embd=256, n_layer=4, n_head=4, n_head_kv=2, n_ff=512)
DRAFT = TinyLlamaShape(n_embd=128, n_layer=2, n_head=2, n_head_kv=1, n_ff=256)


def _model(tmp_path: Path) -> tuple[MemoryModel, Path]:
    target = write_tiny_gguf(tmp_path / "target.gguf", shape=TARGET)
    draft = write_tiny_gguf(tmp_path / "draft.gguf", shape=DRAFT)
    text = json.dumps(
        {
            "name": "mem",
            "server": {"engine": "llama-server", "model": str(target)},
            "workloads": [{"name": "chat"}],
        }
    )
    spec = load_sweep_text(text).spec
    return MemoryModel.of_sweep(spec, Capacity(64 * GiB, "host", "test")), draft


def test_the_draft_holds_weights_kv_cache_and_buffers(tmp_path: Path) -> None:
    model, draft = _model(tmp_path)
    plain = model.predict({"ctx-size": 1024})
    loaded = model.predict({"ctx-size": 1024, "spec-draft-model": str(draft)})
    assert plain.draft == 0 and loaded.verdict == "fits"
    kv_per_cell = DRAFT.n_layer * DRAFT.n_head_kv * (DRAFT.n_embd // DRAFT.n_head) * 2 * 2
    # a draft model is loaded, with its context, even where no spec-type drafts with it
    facts = read_model_facts(str(draft))
    assert loaded.draft == facts.weights_bytes + kv_per_cell * 1024
    bigger = model.predict({"ctx-size": 4096, "spec-draft-model": str(draft)})
    # the draft's context has as many cells as the target's (f16 K and V)
    assert bigger.draft - loaded.draft == kv_per_cell * 3072
    # its compute and output buffers count with the workspace
    assert loaded.workspace > plain.workspace
    q8 = model.predict(
        {
            "ctx-size": 4096,
            "spec-draft-model": str(draft),
            "spec-draft-type-k": "q8_0",
            "spec-draft-type-v": "q8_0",
        }
    )
    assert q8.draft < bigger.draft
    # the target's own components do not change
    assert (loaded.weights, loaded.kv_cache) == (plain.weights, plain.kv_cache)


def test_repacked_quantized_blocks_count_on_the_host(tmp_path: Path) -> None:
    """llama.cpp's CPU backend copies q4_0/q4_k/iq4_nl block weights (rows a multiple of
    8) into its own layout: a CPU_REPACK buffer beside the mapped file."""
    import gguf
    import numpy as np

    path = tmp_path / "q4.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_head_count(2)
    writer.add_embedding_length(64)
    writer.add_context_length(256)
    q4 = np.zeros((16, 64 // 32 * 18), dtype=np.uint8)  # 16 rows of 64 q4_0 weights
    odd = np.zeros((12, 64 // 32 * 18), dtype=np.uint8)  # 12 rows: not repacked
    writer.add_tensor("blk.0.ffn_up.weight", q4, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    writer.add_tensor("blk.0.ffn_down.weight", odd, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    writer.add_tensor("token_embd.weight", q4, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert read_model_facts(str(path)).repack_bytes == 16 * 36
