"""Model factories for the width and depth sweeps (calibration of width-unstable and depth-unstable).

Each factory takes the size keyword it is swept over and builds a fresh model; each entry of
``FACTORIES`` names the factory, its keyword, the optimizer that trains it and the task it learns.
The pairs differ only in how they scale with size:

* small GPT, swept over ``d_model`` (4 heads, so the head width grows with ``d_model``):
  ``gpt_sp`` (nanoGPT: every weight N(0, 0.02), output projections N(0, 0.02/sqrt(2L))),
  ``gpt_default`` (PyTorch's default init), ``gpt_mup`` (muP with the ``mup`` package: the
  default init of the hidden matrices, a ``MuReadout`` with zero init and multiplier
  base_width/width, zero query init, attention scale 1/d_head instead of 1/sqrt(d_head), and
  ``MuAdam``, which scales the Adam lr of hidden matrices by base_width/width);
* MLP, swept over ``width``: ``mlp_default`` (PyTorch's default init) and ``mlp_std002``
  (every weight N(0, 0.02));
* pre-LN residual stack, swept over ``n_layer``: ``stack_plain`` (no depth scaling),
  ``stack_init_scaled`` (branch ends initialised at 1/sqrt(2L) of the default), ``stack_zero_ends``
  (branch ends initialised to zero), ``stack_multiplier`` (each branch multiplied by 1/sqrt(2L)
  in the forward).

The GPT's attention logits pass through an ``nn.Identity`` named ``logits`` so that a forward
hook on leaf modules sees them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BLOCK, HEADS = 64, 64, 4
GPT_LAYERS, GPT_BASE = 2, 64
IN_DIM, CLASSES = 32, 10
MLP_LAYERS = 3
STACK_WIDTH = 128


# ------------------------------------------------------------------ small GPT
class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int, scale: float) -> None:
        super().__init__()
        self.heads, self.scale = heads, scale
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        self.logits = nn.Identity()
        self.register_buffer("mask", torch.ones(BLOCK, BLOCK, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = self.logits((q @ k.transpose(-2, -1)) * self.scale)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.c_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, scale: float) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads, scale)
        self.mlp = MLP(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's layout (untied readout, learned positions), ``n_layer`` pre-LN blocks."""

    def __init__(self, d_model: int, n_layer: int = GPT_LAYERS, heads: int = HEADS, attn_scale: float = 0.0,
                 readout: nn.Module = None) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not a multiple of {heads} heads")
        scale = attn_scale or 1 / math.sqrt(d_model // heads)
        self.wte = nn.Embedding(VOCAB, d_model)
        self.wpe = nn.Embedding(BLOCK, d_model)
        self.h = nn.ModuleList(Block(d_model, heads, scale) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = readout if readout is not None else nn.Linear(d_model, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt_sp(d_model: int = 64, n_layer: int = GPT_LAYERS) -> GPT:
    """Standard parametrization with nanoGPT's fixed init: N(0, 0.02), projections N(0, 0.02/sqrt(2L))."""
    model = GPT(d_model, n_layer)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.dim() >= 2:
            std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
            nn.init.normal_(p, std=std)
    return model


def gpt_default(d_model: int = 64, n_layer: int = GPT_LAYERS) -> GPT:
    """PyTorch's default init everywhere (Linear: U(+-1/sqrt(fan_in)), Embedding: N(0, 1))."""
    return GPT(d_model, n_layer)


def _gpt_mup_unshaped(d_model: int, n_layer: int) -> GPT:
    from mup import MuReadout

    head_dim, base_head_dim = d_model // HEADS, GPT_BASE // HEADS
    # 1/d_head, equal to 1/sqrt(d_head) at the base width
    scale = math.sqrt(base_head_dim) / head_dim
    model = GPT(d_model, n_layer, attn_scale=scale,
                readout=MuReadout(d_model, VOCAB, bias=False, readout_zero_init=True))
    with torch.no_grad():
        for block in model.h:
            block.attn.c_attn.weight[:d_model].zero_()
            block.attn.c_attn.bias[:d_model].zero_()
    return model


def gpt_mup(d_model: int = 64, n_layer: int = GPT_LAYERS) -> GPT:
    """The muP twin of ``gpt_default``, base width 64; train it with ``mup_adam``."""
    from mup import set_base_shapes

    model = _gpt_mup_unshaped(d_model, n_layer)
    base = _gpt_mup_unshaped(GPT_BASE, n_layer)
    delta = _gpt_mup_unshaped(2 * GPT_BASE, n_layer)
    set_base_shapes(model, base, delta=delta)
    return model


# ------------------------------------------------------------------ MLP
class DeepMLP(nn.Module):
    def __init__(self, width: int, layers: int = MLP_LAYERS) -> None:
        super().__init__()
        dims = [IN_DIM] + [width] * layers
        self.fc = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.act = nn.ModuleList(nn.ReLU() for _ in range(layers))
        self.out = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fc, act in zip(self.fc, self.act):
            x = act(fc(x))
        return self.out(x)


def mlp_default(width: int = 64) -> DeepMLP:
    """PyTorch's default init."""
    return DeepMLP(width)


def mlp_std002(width: int = 64) -> DeepMLP:
    """Every weight N(0, 0.02) whatever the width, biases zero."""
    model = DeepMLP(width)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        else:
            nn.init.normal_(p, std=0.02)
    return model


# ------------------------------------------------------------------ pre-LN residual stack
class ResBlock(nn.Module):
    def __init__(self, width: int, multiplier: float) -> None:
        super().__init__()
        self.multiplier = multiplier
        self.ln = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 2 * width)
        self.act = nn.GELU()
        self.proj = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.multiplier * self.proj(self.act(self.fc(self.ln(x))))


class ResStack(nn.Module):
    """``inp`` -> ``n_layer`` pre-LN blocks ``x + m * proj(gelu(fc(ln(x))))`` -> ``ln_f`` -> ``out``.

    GPT-2's init: every weight N(0, 0.02), biases zero.
    """

    def __init__(self, n_layer: int, width: int = STACK_WIDTH, multiplier: float = 1.0) -> None:
        super().__init__()
        self.inp = nn.Linear(IN_DIM, width)
        self.h = nn.ModuleList(ResBlock(width, multiplier) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(width)
        self.out = nn.Linear(width, CLASSES)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.h:
            x = block(x)
        return self.out(self.ln_f(x))


def stack_plain(n_layer: int = 2) -> ResStack:
    """GPT-2's init without its depth scaling."""
    return ResStack(n_layer)


def stack_init_scaled(n_layer: int = 2) -> ResStack:
    """GPT-2's recipe: each branch end's weight initialised 1/sqrt(2L) times smaller (init only)."""
    model = ResStack(n_layer)
    with torch.no_grad():
        for block in model.h:
            block.proj.weight.mul_(1 / math.sqrt(2 * n_layer))
    return model


def stack_zero_ends(n_layer: int = 2) -> ResStack:
    """Each branch end (weight and bias) initialised to zero."""
    model = ResStack(n_layer)
    with torch.no_grad():
        for block in model.h:
            block.proj.weight.zero_()
            block.proj.bias.zero_()
    return model


def stack_multiplier(n_layer: int = 2) -> ResStack:
    """Depth-muP: each branch multiplied by 1/sqrt(2L) in the forward, at init and during training."""
    return ResStack(n_layer, multiplier=1 / math.sqrt(2 * n_layer))


# ------------------------------------------------------------------ optimizers, tasks, table
def adam(model: nn.Module, lr: float = 1e-3) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=lr)


def mup_adam(model: nn.Module, lr: float = 1e-3) -> torch.optim.Optimizer:
    from mup import MuAdam

    return MuAdam(model.parameters(), lr=lr)


class MarkovTask:
    """Token sequences from a fixed random Markov chain over ``VOCAB`` tokens.

    The next token depends on the previous token and on the token two places back modulo
    ``GROUPS``: each of the ``VOCAB * GROUPS`` contexts allows ``CHOICES`` next tokens with random
    probabilities. The previous token alone predicts part of it (embeddings and readout learn
    that); the rest needs attention. The loss floor is the chain's entropy rate (``floor``).
    """

    GROUPS, CHOICES = 4, 4

    def __init__(self, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        contexts = VOCAB * self.GROUPS
        probs = torch.zeros(contexts, VOCAB)
        nxt = torch.rand(contexts, VOCAB, generator=gen).argsort(dim=1)[:, :self.CHOICES]
        weights = torch.rand(contexts, self.CHOICES, generator=gen) + 0.2
        probs.scatter_(1, nxt, weights / weights.sum(1, keepdim=True))
        self.probs = probs
        self.floor = float(-(probs * probs.clamp_min(1e-30).log()).sum(1).mean())

    def batch(self, gen: torch.Generator, size: int) -> Tuple[torch.Tensor, torch.Tensor]:
        seq = torch.empty(size, BLOCK + 1, dtype=torch.long)
        seq[:, :2] = torch.randint(0, VOCAB, (size, 2), generator=gen)
        for t in range(2, BLOCK + 1):
            ctx = (seq[:, t - 2] % self.GROUPS) * VOCAB + seq[:, t - 1]
            seq[:, t] = torch.multinomial(self.probs[ctx], 1, generator=gen).squeeze(1)
        return seq[:, :-1], seq[:, 1:]

    @staticmethod
    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


class TeacherTask:
    """Inputs N(0, 1) in ``IN_DIM`` dimensions, labels sampled from a fixed random tanh teacher's softmax."""

    def __init__(self, seed: int = 0, hidden: int = 64, temperature: float = 3.0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.w1 = torch.randn(IN_DIM, hidden, generator=gen) / math.sqrt(IN_DIM)
        self.w2 = torch.randn(hidden, CLASSES, generator=gen) * temperature / math.sqrt(hidden)
        x = torch.randn(100_000, IN_DIM, generator=gen)
        p = (torch.tanh(x @ self.w1) @ self.w2).softmax(-1)
        self.floor = float(-(p * p.clamp_min(1e-30).log()).sum(1).mean())  # the teacher's own loss

    def batch(self, gen: torch.Generator, size: int) -> Tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(size, IN_DIM, generator=gen)
        p = (torch.tanh(x @ self.w1) @ self.w2).softmax(-1)
        return x, torch.multinomial(p, 1, generator=gen).squeeze(1)

    @staticmethod
    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, target)


@dataclass(frozen=True)
class Factory:
    name: str
    build: Callable[..., nn.Module]
    keyword: str  # the size keyword the sweep varies
    kind: str  # "width" or "depth"
    optimizer: Callable[..., torch.optim.Optimizer]
    task: str  # "markov" or "teacher"
    pair: str


FACTORIES: Dict[str, Factory] = {f.name: f for f in [
    Factory("gpt_sp", gpt_sp, "d_model", "width", adam, "markov", "gpt"),
    Factory("gpt_default", gpt_default, "d_model", "width", adam, "markov", "gpt"),
    Factory("gpt_mup", gpt_mup, "d_model", "width", mup_adam, "markov", "gpt"),
    Factory("mlp_default", mlp_default, "width", "width", adam, "teacher", "mlp"),
    Factory("mlp_std002", mlp_std002, "width", "width", adam, "teacher", "mlp"),
    Factory("stack_plain", stack_plain, "n_layer", "depth", adam, "teacher", "stack"),
    Factory("stack_init_scaled", stack_init_scaled, "n_layer", "depth", adam, "teacher", "stack"),
    Factory("stack_zero_ends", stack_zero_ends, "n_layer", "depth", adam, "teacher", "stack"),
    Factory("stack_multiplier", stack_multiplier, "n_layer", "depth", adam, "teacher", "stack"),
]}

TASKS = {"markov": MarkovTask, "teacher": TeacherTask}


NEEDS_MUP = frozenset({"gpt_mup"})
"""Factories that need the benchmark-only ``mup`` package (not a test dependency: it asks for torchvision)."""


def check_mup_twin() -> None:
    """The muP twin is what the calibration says it is (run before every calibration that trains it,
    and by ``python benchmarks/sweep_factories.py``): attention scale 1/d_head (1/sqrt(d_head) at the
    base width), zero readout and query, the readout's width multiplier, and MuAdam's hidden lr
    scaled by base width / width while the embedding keeps its lr."""
    scales = {d: gpt_mup(d_model=d, n_layer=1).h[0].attn.scale for d in (64, 128, 256)}
    head = {d: d // HEADS for d in scales}
    assert math.isclose(scales[64], 1 / math.sqrt(head[64]), rel_tol=1e-6)
    for d in (128, 256):
        assert math.isclose(scales[d] * head[d], scales[64] * head[64], rel_tol=1e-6)
    model = gpt_mup(d_model=128, n_layer=1)
    assert torch.count_nonzero(model.lm_head.weight) == 0
    c_attn = model.h[0].attn.c_attn
    assert torch.count_nonzero(c_attn.weight[:128]) == 0 and torch.count_nonzero(c_attn.bias[:128]) == 0
    assert torch.count_nonzero(c_attn.weight[128:]) > 0
    assert math.isclose(model.lm_head.width_mult(), 2.0)
    model = gpt_mup(d_model=256, n_layer=1)
    opt = mup_adam(model, lr=1e-3)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert math.isclose(lr_of[id(model.h[0].mlp.c_fc.weight)], 1e-3 * 64 / 256)
    assert math.isclose(lr_of[id(model.wte.weight)], 1e-3)


if __name__ == "__main__":
    check_mup_twin()
    print("the muP twin: attention scale 1/d_head, zero readout and query, readout multiplier, MuAdam lrs: ok")
