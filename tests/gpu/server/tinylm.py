"""A randomly initialised transformer and a toy tokenizer for the GPU test servers.

The model is real GPU work (embedding, attention and MLP blocks, LM head) with
random weights: it produces deterministic nonsense, which is all a server test
needs. With ``world > 1`` each worker holds a tensor-parallel shard of every MLP
and attention projection, and the partial outputs are summed with an NCCL
all-reduce after each block, as real tensor-parallel engines do.

Without CUDA (local tests of the servers' mechanics only) everything runs on the
CPU in float32 and the all-reduce goes through gloo.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["EOS", "ModelDims", "TinyLM", "decode", "encode", "window"]

EOS = 0
_SYLLABLES = ("ka", "to", "mi", "re", "su", "no", "ha", "li", "pe", "go", "da", "vu")


def encode(text: str, vocab: int) -> list[int]:
    """Whitespace words hashed into ``1..vocab-1`` (0 is end of sequence)."""
    ids = [1 + zlib.crc32(word.encode()) % (vocab - 1) for word in text.split()]
    return ids or [1]


def decode(token: int) -> str:
    """A pronounceable word per token id (``ka``, ``tomi``...), with a leading space."""
    parts = []
    n = max(token, 1)
    while n:
        n, digit = divmod(n, len(_SYLLABLES))
        parts.append(_SYLLABLES[digit])
    return " " + "".join(parts)


@dataclass(frozen=True)
class ModelDims:
    vocab: int = 32000
    hidden: int = 1024
    layers: int = 4
    heads: int = 8
    ffn_mult: int = 4
    context: int = 32
    """Tokens of each sequence the model looks at per step (a sliding window)."""


class _Block(nn.Module):
    """Pre-norm attention + MLP, projections sharded over ``world`` ranks."""

    def __init__(self, dims: ModelDims, world: int) -> None:
        super().__init__()
        if dims.heads % world or (dims.hidden * dims.ffn_mult) % world:
            raise ValueError(
                f"heads ({dims.heads}) and ffn ({dims.hidden * dims.ffn_mult}) must divide "
                f"by the tensor-parallel size {world}"
            )
        self.heads = dims.heads // world
        self.head_dim = dims.hidden // dims.heads
        inner = self.heads * self.head_dim
        self.norm1 = nn.LayerNorm(dims.hidden)
        self.qkv = nn.Linear(dims.hidden, 3 * inner, bias=False)
        self.out = nn.Linear(inner, dims.hidden, bias=False)
        self.norm2 = nn.LayerNorm(dims.hidden)
        self.up = nn.Linear(dims.hidden, dims.hidden * dims.ffn_mult // world, bias=False)
        self.down = nn.Linear(dims.hidden * dims.ffn_mult // world, dims.hidden, bias=False)
        self.world = world

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, self.head_dim).unbind(2)
        att = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self._reduce(self.out(att.transpose(1, 2).reshape(b, t, -1)))
        h = nn.functional.gelu(self.up(self.norm2(x)))
        return x + self._reduce(self.down(h))


class TinyLM(nn.Module):
    """Embedding, ``layers`` blocks, LM head; one greedy step per call of :meth:`step`."""

    def __init__(self, dims: ModelDims, world: int = 1, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)  # every rank draws the same replicated weights
        self.dims = dims
        self.embed = nn.Embedding(dims.vocab, dims.hidden)
        self.pos = nn.Parameter(torch.randn(dims.context, dims.hidden) * 0.02)
        self.blocks = nn.ModuleList(_Block(dims, world) for _ in range(dims.layers))
        self.norm = nn.LayerNorm(dims.hidden)
        self.head = nn.Linear(dims.hidden, dims.vocab, bias=False)

    @torch.inference_mode()
    def step(self, windows: torch.Tensor) -> torch.Tensor:
        """Next token (greedy) for each row of ``windows`` (``[batch, context]`` ids)."""
        x = self.embed(windows) + self.pos[: windows.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x[:, -1]))
        return logits.float().argmax(dim=-1)


def window(tokens: list[int], context: int) -> list[int]:
    """The last ``context`` tokens, left-padded with 1s."""
    tail = tokens[-context:]
    return [1] * (context - len(tail)) + tail
