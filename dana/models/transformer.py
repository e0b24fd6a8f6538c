"""A small causal Transformer language model (GPT), nanoGPT's ``model.py`` made small.

Token and position embeddings, ``layers`` pre-norm blocks (causal self-attention and a
4x MLP, GELU), a final LayerNorm and the output head tied to the token embedding
(weight tying: Press and Wolf 2017; Radford et al. 2019). Inputs are ``N x T`` token
ids (``T`` at most ``context``), outputs ``N x T x vocab`` logits: position ``t``
predicts token ``t + 1`` from tokens ``0..t`` only (a causal mask). No dropout: the
simulator's batched engine (``torch.func.vmap``) refuses random operations.

    >>> import torch
    >>> net = GPT(vocab=256, context=16, layers=1, width=32, heads=2)
    >>> net(torch.zeros(3, 16, dtype=torch.long)).shape
    torch.Size([3, 16, 256])
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        n, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(n, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        # nanoGPT's explicit attention (not F.scaled_dot_product_attention, which
        # torch.func.vmap runs one sample at a time on the CPU): the simulator's batched
        # engine computes several workers' gradients in one call.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = att @ v
        return self.proj(y.transpose(1, 2).reshape(n, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A causal Transformer over ``vocab`` tokens with a context of ``context`` tokens."""

    def __init__(self, vocab: int, context: int, layers: int, width: int, heads: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.context = context
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual writes
            if name.endswith(("proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: Tensor) -> Tensor:
        t = idx.shape[-1]
        if t > self.context:
            raise ValueError(f"a sequence of {t} tokens is longer than the context {self.context}")
        positions = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))
