"""The models and tasks of ``bench_first_step.py``: four case families, each a model builder and a task.

Every task is synthetic, fixed by its own seed (the task seed never changes) and learnable, so that
the loss goes down at a sound learning rate and there is a best one:

- ``mlp``: 4 Linear layers (64 -> 256 -> 256 -> 256 -> 10), ReLU, PyTorch's default init; inputs
  N(0, 1) of width 64, the class is the argmax of a fixed random teacher (Linear(64, 64), tanh,
  Linear(64, 10)); batch 64.
- ``cnn``: three conv-BN-ReLU blocks (3 -> 16 -> 32 -> 32 channels, a 2x2 max-pool after the first
  two), global average pool, Linear(32, 10), PyTorch's default init; images N(0, 1) of 3x16x16
  smoothed by a 3x3 box filter, the class is the argmax of a fixed random conv teacher (Conv(3, 8, 5),
  tanh, 4x4 average pool, Linear(128, 10)); batch 32.
- ``gpt``: a nanoGPT-style pre-LN GPT (token and position embeddings, fused q/k/v, causal SDPA, GELU
  MLP, final LayerNorm, head tied to the token embedding), 4 layers, 4 heads, width 64, block 32,
  nanoGPT's init: N(0, 0.02) weights and embeddings, zero biases, every ``c_proj`` N(0, 0.02 / sqrt(2L));
  next-token cross-entropy on the token task below; batch 16.
- ``postln``: ``nn.TransformerEncoderLayer`` x4 with ``norm_first=False`` (post-LN), width 64, 4
  heads, feed-forward 256, dropout 0, causal mask, token and position embeddings and a linear head,
  PyTorch's default init; same token task and batch.

The transformers are half the width (64, not 128) and half the block (32, not 64) of nanoGPT's small
character-level settings, so that 220 runs of each fit on a shared CPU. Adam's first step moves every
weight by about lr, so its ratio is lr over the weight's scale whatever the width: at nanoGPT's init
with 4 layers, lr 1e-3 gives 1e-3 / (0.02 / sqrt(8)) = 0.14 on ``c_proj`` at width 64 as at 768.

The token task: 32 symbols drawn from a fixed random Markov chain (each symbol allows 3 next symbols,
with fixed random probabilities); the loss floor (the chain's entropy rate) is 1.03 nats, far below
ln 32 = 3.47, and Adam at lr 1e-3 gets within 0.2 nats of it in 200 steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

TASK_SEED = 1234


# ------------------------------------------------------------------------------ models
def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def cnn() -> nn.Module:
    def block(cin: int, cout: int):
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(*block(3, 16), nn.MaxPool2d(2), *block(16, 32), nn.MaxPool2d(2), *block(32, 32),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


VOCAB, BLOCK, WIDTH, LAYERS, HEADS = 32, 32, 64, 4, 4


class CausalSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).view(b, t, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class GPTBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(WIDTH), CausalSelfAttention(), nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential()
        self.mlp.c_fc, self.mlp.gelu, self.mlp.c_proj = nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's model at nanoGPT's init, small."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(BLOCK, WIDTH)
        self.h = nn.ModuleList(GPTBlock() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * LAYERS))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class PostLN(nn.Module):
    """Post-LN transformer from ``nn.TransformerEncoderLayer``, PyTorch's default init."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(BLOCK, WIDTH)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True, norm_first=False)
            for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(BLOCK), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for layer in self.layers:
            x = layer(x, src_mask=self.mask[:t, :t], is_causal=True)
        return self.head(x)


# ------------------------------------------------------------------------------ tasks
class TeacherTask:
    """Inputs N(0, 1) (smoothed for images); the class is the argmax of a fixed random teacher."""

    def __init__(self, teacher: nn.Module, shape: Tuple[int, ...], batch: int, smooth: bool = False) -> None:
        self.teacher, self.shape, self.batch, self.smooth = teacher, shape, batch, smooth

    def sample(self, gen: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(self.batch, *self.shape, generator=gen)
        if self.smooth:
            x = F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False) * 3.0
        with torch.no_grad():
            y = self.teacher(x).argmax(-1)
        return x, y

    @staticmethod
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y)


class MarkovTask:
    """Sequences of a fixed random Markov chain; next-token cross-entropy."""

    POOL = 4096  # sequences drawn once; a run's seed picks its batches from them

    def __init__(self, batch: int) -> None:
        gen = torch.Generator().manual_seed(TASK_SEED)
        self.batch = batch
        probs = torch.zeros(VOCAB, VOCAB)
        for row in probs:
            nxt = torch.randperm(VOCAB, generator=gen)[:3]
            row[nxt] = torch.rand(3, generator=gen) + 0.2
        self.probs = probs / probs.sum(1, keepdim=True)
        seq = torch.empty(self.POOL, BLOCK + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(VOCAB, (self.POOL,), generator=gen)
        for t in range(1, BLOCK + 1):
            seq[:, t] = torch.multinomial(self.probs[seq[:, t - 1]], 1, generator=gen)[:, 0]
        self.pool = seq
        # the chain's entropy rate, the loss a perfect model reaches
        p = self.probs.clamp_min(1e-30)
        self.floor = float(-(self.probs * p.log()).sum(1).mean())

    def sample(self, gen: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
        seq = self.pool[torch.randint(self.POOL, (self.batch,), generator=gen)]
        return seq[:, :-1], seq[:, 1:]

    @staticmethod
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _mlp_teacher() -> nn.Module:
    torch.manual_seed(TASK_SEED)
    return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10)).requires_grad_(False)


def _cnn_teacher() -> nn.Module:
    torch.manual_seed(TASK_SEED)
    return nn.Sequential(nn.Conv2d(3, 8, 5, padding=2), nn.Tanh(), nn.AvgPool2d(4), nn.Flatten(),
                         nn.Linear(8 * 4 * 4, 10)).requires_grad_(False)


@dataclass
class Case:
    key: str
    label: str
    build: Callable[[], nn.Module]
    task: Callable[[], object]
    # weights whose output goes straight into a BatchNorm: the loss does not depend on their scale
    feeds_norm: Tuple[str, ...] = ()


CASES: Dict[str, Case] = {c.key: c for c in [
    Case("mlp", "MLP 64-256-256-256-10, ReLU, default init", mlp,
         lambda: TeacherTask(_mlp_teacher(), (64,), 64)),
    Case("cnn", "CNN 3 conv-BN-ReLU blocks (16-32-32), default init", cnn,
         lambda: TeacherTask(_cnn_teacher(), (3, 16, 16), 32, smooth=True), ("0.weight", "4.weight", "8.weight")),
    Case("gpt", "nanoGPT d64 L4 H4 block 32, 0.02 init", GPT, lambda: MarkovTask(16)),
    Case("postln", "post-LN TransformerEncoder d64 L4 H4 block 32, default init", PostLN, lambda: MarkovTask(16)),
]}
