"""llama-server's draft model in the memory prediction: its weights, its own context's
KV cache, compute and output buffers, and the target's output rows for the positions
a verify step checks (llama.cpp: ``common_speculative_init_result``,
``server_output_limits``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.gguf_model import TinyLlamaShape, write_tiny_gguf
from servesweep.servers.memory import Capacity, MemoryModel, read_model_facts
from servesweep.servers.memory.rules import Params, _spec_n_max
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
    # a draft model is loaded, with its context, even where no spec-type drafts with it
    weights = draft.stat().st_size  # the tiny GGUF is nearly all tensor data
    assert weights * 0.9 < loaded.draft
    kv_per_cell = DRAFT.n_layer * DRAFT.n_head_kv * (DRAFT.n_embd // DRAFT.n_head) * 2 * 2
    bigger = model.predict({"ctx-size": 4096, "spec-draft-model": str(draft)})
    # the draft's context has as many cells as the target's (f16 K and V), and its
    # compute buffer's f16 mask (flash attention) spans them for 512 ubatch tokens
    assert bigger.draft - loaded.draft == kv_per_cell * 3072 + 512 * 3072 * 2
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


def test_speculation_widens_the_targets_output_buffer(tmp_path: Path) -> None:
    model, draft = _model(tmp_path)
    base = {"ctx-size": 1024, "spec-draft-model": str(draft)}
    idle = model.predict(base)
    n8 = model.predict({**base, "spec-type": "draft-simple", "spec-draft-n-max": 8})
    n2 = model.predict({**base, "spec-type": "draft-simple", "spec-draft-n-max": 2})
    row = read_model_facts(str(tmp_path / "target.gguf")).vocab * 4  # f32 logits
    assert n8.workspace - idle.workspace == 8 * row
    assert n2.workspace - idle.workspace == 2 * row
    assert n8.draft == n2.draft == idle.draft


@pytest.mark.parametrize(
    ("params", "n_max"),
    [
        ({}, 0),
        ({"spec-draft-model": "d.gguf"}, 0),  # no spec-type: nothing is drafted
        ({"spec-type": "draft-simple"}, 3),  # llama.cpp's default draft length
        ({"spec-type": "draft-simple", "spec-draft-n-max": 6}, 6),
        ({"spec-type": "ngram-mod"}, 64),
        ({"spec-type": "ngram-simple,draft-simple", "spec-draft-n-max": 4}, 48),
        ({"spec-type": ["ngram-cache"]}, 8),
        ({"draft-max": 16}, 16),  # an older build's flag, as written
    ],
)
def test_draft_length_follows_llama_cpp(params: dict[str, object], n_max: int) -> None:
    assert _spec_n_max(Params(params)) == n_max
