"""Hand-written transformers for the attention, residual and token-collapse tests.

``NanoGPT`` follows nanoGPT (pre-LN blocks, fused ``c_attn``, causal SDPA, tied LM head,
GPT-2's init with ``c_proj`` at ``0.02 / sqrt(2 * n_layer)``); ``ViT`` follows
lucidrains' vit-pytorch (explicit ``softmax(q @ k^T * scale)`` in ``nn.Softmax``, blocks in
``nn.ModuleList([attention, feed-forward])``).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """``init="gpt2"``: GPT-2's init; ``init="normal"``: every weight matrix ``N(0, 1)``."""

    def __init__(self, vocab: int = 512, dim: int = 256, heads: int = 4, layers: int = 6, block: int = 64,
                 init: str = "gpt2") -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, dim), wpe=nn.Embedding(block, dim),
            h=nn.ModuleList(Block(dim, heads) for _ in range(layers)), ln_f=nn.LayerNorm(dim)))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            if init == "normal":
                nn.init.normal_(p, 0.0, 1.0)
            else:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


class ViTAttention(nn.Module):
    def __init__(self, dim: int, heads: int = 8, dim_head: int = 64, scale_power: float = -0.5) -> None:
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.scale = dim_head ** scale_power
        self.norm = nn.LayerNorm(dim)
        self.attend = nn.Softmax(dim=-1)
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        b, n, _ = x.shape
        q, k, v = (t.reshape(b, n, self.heads, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        attn = self.attend(dots)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, n, -1)
        return self.to_out(out)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ViT(nn.Module):
    """Patches of a 3 x image x image picture, pre-norm blocks, mean-pooled classifier head."""

    def __init__(self, image: int = 64, patch: int = 8, dim: int = 384, depth: int = 6, heads: int = 6,
                 dim_head: int = 64, mlp: int = 1536, classes: int = 10, scale_power: float = -0.5) -> None:
        super().__init__()
        self.patch = patch
        patch_dim = 3 * patch * patch
        self.to_patch = nn.Sequential(nn.LayerNorm(patch_dim), nn.Linear(patch_dim, dim), nn.LayerNorm(dim))
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2, dim))
        self.layers = nn.ModuleList(
            nn.ModuleList([ViTAttention(dim, heads, dim_head, scale_power), FeedForward(dim, mlp)])
            for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        b, c, h, w = img.shape
        p = self.patch
        x = img.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1).reshape(b, (h // p) * (w // p), -1)
        x = self.to_patch(x) + self.pos
        for attn, ff in self.layers:
            x = attn(x) + x
            x = ff(x) + x
        return self.head(self.norm(x).mean(dim=1))


class AttentionOnly(nn.Module):
    """Self-attention layers with no residual path and no MLP (Dong et al. 2021's pure attention)."""

    def __init__(self, dim: int = 256, heads: int = 8, depth: int = 6, norm: bool = True) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(dim) if norm else nn.Identity() for _ in range(depth))
        self.layers = nn.ModuleList(nn.MultiheadAttention(dim, heads, batch_first=True) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, attn in zip(self.norms, self.layers):
            y = norm(x)
            x = attn(y, y, y, need_weights=False)[0]
        return x


class ResidualAttention(AttentionOnly):
    """The same layers with a residual path around each: the tokens stay apart."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, attn in zip(self.norms, self.layers):
            y = norm(x)
            x = x + attn(y, y, y, need_weights=False)[0]
        return x


def dcgan_generator(latent: int = 100, features: int = 64) -> nn.Sequential:
    """DCGAN's generator: ConvTranspose2d (bias=True, the default) feeding BatchNorm2d."""
    return nn.Sequential(
        nn.ConvTranspose2d(latent, features * 8, 4, 1, 0), nn.BatchNorm2d(features * 8), nn.ReLU(True),
        nn.ConvTranspose2d(features * 8, features * 4, 4, 2, 1), nn.BatchNorm2d(features * 4), nn.ReLU(True),
        nn.ConvTranspose2d(features * 4, features * 2, 4, 2, 1), nn.BatchNorm2d(features * 2), nn.ReLU(True),
        nn.ConvTranspose2d(features * 2, 3, 4, 2, 1), nn.Tanh())
