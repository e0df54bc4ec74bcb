"""A tiny random-weight llama GGUF, written at test time, that real llama.cpp loads.

The model is a 2-layer llama (64 dims) with a small SentencePiece-style vocabulary
(control tokens, 256 byte-fallback tokens, ASCII characters, letter pairs and common
English words with their prefixes: 2.4 characters per token on servesweep's builtin
prompts, so none of them needs more than ~320 tokens of context).
Weights are random: the text it generates is noise, so tests assert on mechanics
(tokens streamed, usage counts, timings), never on content.

The output rows of the control and byte tokens are zero and the other rows are
scaled so their logits are large (std ~6): end-of-sequence and byte tokens are
practically never sampled, even at temperature 1. So a request generates exactly
``max_tokens`` tokens (as ``ignore_eos`` would), all of them whole ASCII pieces:
usage counts equal streamed chunks (byte tokens can make llama-cpp-python count
more tokens than ``max_tokens`` while it completes a UTF-8 sequence).

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

__all__ = ["TinyLlamaShape", "write_tiny_gguf"]

# Common English words and letter pairs: with every prefix of "▁word" in the vocab,
# SentencePiece merges reach whole words, so prompts cost a few characters per token
# (a character-level vocab would overflow small contexts that real models handle).
_WORDS = (
    "the", "a", "an", "and", "or", "but", "if", "then", "else", "of", "to", "in", "on",
    "at", "by", "for", "with", "from", "into", "about", "between", "under", "over",
    "without", "is", "are", "was", "be", "been", "it", "its", "this", "that", "these",
    "those", "what", "which", "who", "why", "how", "when", "where", "i", "you", "we",
    "they", "he", "she", "me", "my", "your", "our", "their", "do", "does", "can",
    "could", "should", "would", "will", "have", "has", "make", "give", "write", "explain",
    "describe", "list", "use", "using", "suggest", "compare", "summarize", "translate",
    "return", "returns", "function", "python", "code", "value", "values", "string",
    "number", "numbers", "list", "file", "data", "test", "input", "output", "example",
    "difference", "words", "word", "sentence", "sentences", "short", "long", "one", "two",
    "three", "four", "five", "ten", "each", "every", "all", "some", "more", "most",
    "first", "last", "next", "day", "week", "year", "years", "time", "minutes", "people",
    "city", "world", "work", "good", "small", "large", "new", "old", "main", "way", "up",
    "not", "no", "yes", "so", "as", "than", "only", "also", "just", "like", "very",
    "server", "model", "token", "sweep", "fast", "slow", "hello", "print", "def",
    "class", "import", "true", "false", "none", "while", "self", "key", "keys", "dict",
    "sorted", "sort", "count", "total", "sum", "max", "min", "len", "range", "result",
    "answer", "question", "reason", "idea", "ideas", "light", "water", "food", "dinner",
    "travel", "train", "station", "history", "science", "energy", "because", "after",
    "before", "during", "through", "other", "same", "different", "simple", "plain",
)  # fmt: skip
_PAIRS = (
    "th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te",
    "of", "ed", "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou",
    "io", "le", "ve", "co", "me", "de", "hi", "ri", "ro", "ic", "ne", "ea", "ra", "ce",
    "li", "ch", "ll", "be", "ma", "si", "om", "ur", "ing", "ion", "tion", "ent", "ers",
)  # fmt: skip


_N_SPECIAL = 3 + 256
"""Control tokens, then the byte-fallback tokens; normal pieces follow."""


@dataclass(frozen=True)
class TinyLlamaShape:
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    context_length: int = 4096


def _vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [
        gguf.TokenType.UNKNOWN,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
    ]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    pieces = ["▁", *string.ascii_letters, *string.digits, *".,:;!?()[]{}'\"-+=*/_<>#%&@"]
    pieces += list(_PAIRS) + [f"▁{p}" for p in _PAIRS]
    for word in _WORDS:
        for w in (f"▁{word}", word, f"▁{word.capitalize()}", word.capitalize()):
            pieces += [w[:n] for n in range(2, len(w) + 1)]
    seen = set(tokens)
    for piece in pieces:
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(gguf.TokenType.NORMAL)
    # SentencePiece scores: higher is merged first; longer pieces score higher.
    scores = [0.0] * _N_SPECIAL + [float(len(t)) - 10.0 for t in tokens[_N_SPECIAL:]]
    return tokens, scores, [int(t) for t in types]


def write_tiny_gguf(path: Path, *, seed: int = 0, shape: TinyLlamaShape | None = None) -> Path:
    """Write the model to ``path`` (about 0.5 MB) and return the path."""
    shape = shape or TinyLlamaShape()
    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab()
    n_vocab = len(tokens)
    head_dim = shape.n_embd // shape.n_head
    n_kv = head_dim * shape.n_head_kv

    def rand(*dims: int, std: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(dims) * std).astype(np.float32)

    arch = "llama"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("servesweep-tiny-random")
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    # numpy shape (rows, cols) is GGUF ne = [cols, rows]: (out_features, in_features).
    writer.add_tensor("token_embd.weight", rand(n_vocab, shape.n_embd, std=1.0))
    for i in range(shape.n_layer):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(shape.n_embd, dtype=np.float32))
        writer.add_tensor(f"{blk}.attn_q.weight", rand(shape.n_embd, shape.n_embd))
        writer.add_tensor(f"{blk}.attn_k.weight", rand(n_kv, shape.n_embd))
        writer.add_tensor(f"{blk}.attn_v.weight", rand(n_kv, shape.n_embd))
        writer.add_tensor(f"{blk}.attn_output.weight", rand(shape.n_embd, shape.n_embd))
        writer.add_tensor(f"{blk}.ffn_norm.weight", np.ones(shape.n_embd, dtype=np.float32))
        writer.add_tensor(f"{blk}.ffn_gate.weight", rand(shape.n_ff, shape.n_embd))
        writer.add_tensor(f"{blk}.ffn_up.weight", rand(shape.n_ff, shape.n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", rand(shape.n_embd, shape.n_ff))
    writer.add_tensor("output_norm.weight", np.ones(shape.n_embd, dtype=np.float32))
    # Hidden states leave the final RMS norm with norm ~sqrt(n_embd); std 0.8 gives
    # logits with std ~6, so the zeroed rows (control and byte tokens, logit 0) lose
    # to the best of the normal pieces by a factor of ~e^15.
    output = rand(n_vocab, shape.n_embd, std=0.8)
    output[:_N_SPECIAL] = 0.0
    writer.add_tensor("output.weight", output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
