"""A self-speculation draft made from a trained GGUF model itself (LayerSkip-style
early exit): the model's first ``n_layers`` transformer blocks with its token
embeddings, its output norm and its output head, written into a GGUF of their own
whose ``block_count`` is ``n_layers``. Everything else (the tokenizer, the chat
template, the hyper-parameters) is copied unchanged, so llama.cpp accepts the file
as a draft of the full model (same vocabulary) and its drafts are the full model's
own guess after ``n_layers`` of its layers.

Tensors are copied byte for byte in their quantized form (no requantization).
SmolLM2 ties its output head to the token embeddings (no ``output.weight``):
llama.cpp then reads the head from ``token_embd.weight``, which the draft keeps.

The draft is cached next to the model (``<model stem>.first<N>.gguf``) and written
once per machine: into a temporary file renamed into place, so concurrent test
processes never see half a file. A stamp beside it (``.source``) names the model it
was cut from (name, size, modification time; also in the draft's own metadata under
:data:`SOURCE_KEY`): a cached draft is reused only while the stamp matches the model.

    draft = self_spec_draft(model, n_layers=8)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import gguf

__all__ = ["SOURCE_KEY", "self_spec_draft", "write_self_spec_draft"]

SOURCE_KEY = "servesweep.self_spec.source"
"""Metadata key of the draft: ``NAME SIZE MTIME_NS`` of the model it was cut from."""


def _source_stamp(model: Path) -> str:
    st = model.stat()
    return f"{model.name} {st.st_size} {st.st_mtime_ns}"


def _kept(name: str, n_layers: int) -> bool:
    if not name.startswith("blk."):
        return True  # token_embd, output_norm, output (and rope factors, if any)
    return int(name.split(".", 2)[1]) < n_layers


def write_self_spec_draft(model: Path, n_layers: int, out: Path) -> Path:
    """Write the draft of ``model`` with its first ``n_layers`` blocks to ``out``."""
    reader = gguf.GGUFReader(model)
    arch_field = reader.fields[gguf.Keys.General.ARCHITECTURE]
    arch = str(arch_field.contents())
    block_key = f"{arch}.block_count"
    total = int(reader.fields[block_key].contents())
    if not 0 < n_layers < total:
        raise ValueError(f"n_layers must be between 1 and {total - 1} (the model has {total})")
    writer = gguf.GGUFWriter(out, arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by the writer itself
        value = field.contents()
        if field.name == block_key:
            value = n_layers
        elif field.name == gguf.Keys.General.NAME:
            value = f"{value} (first {n_layers} of {total} layers)"
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    writer.add_string(SOURCE_KEY, _source_stamp(model))
    tensors = [t for t in reader.tensors if _kept(t.name, n_layers)]
    for t in tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return out


def self_spec_draft(model: Path, n_layers: int) -> Path:
    """The draft of ``model`` with its first ``n_layers`` blocks, cached beside it."""
    path = model.with_name(f"{model.stem}.first{n_layers}.gguf")
    stamp = path.with_name(path.name + ".source")
    source = _source_stamp(model)
    if path.exists() and stamp.exists() and stamp.read_text(encoding="utf-8") == source:
        return path
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=model.parent)
    os.close(fd)
    try:
        write_self_spec_draft(model, n_layers, Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    stamp.write_text(source, encoding="utf-8")
    return path
