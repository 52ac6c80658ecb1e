"""Models that declare an init of their own, built from code, each with the line that applies it removable.

- ``TinyHF``: a custom Hugging Face ``PreTrainedModel`` (its ``post_init()`` optional);
- ``NanoGPT``: Karpathy's nanoGPT layout (``self.apply(self._init_weights)`` optional, then the
  ``c_proj`` rescale to ``0.02 / sqrt(2 n_layer)`` that runs either way);
- ``TitanLlama``: a torchtitan-style Llama, built on ``meta`` and moved with ``to_empty()``, whose
  ``init_weights()`` (root and blocks, depth-scaled output projections) may or may not be called.
"""
import math
from typing import Any, Tuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd); self.c_proj = nn.Linear(n_embd, n_embd); self.n_head = n_head
    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd); self.gelu = nn.GELU(); self.c_proj = nn.Linear(4 * n_embd, n_embd)
    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))

class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd); self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd); self.mlp = MLP(n_embd)
    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

class NanoGPT(nn.Module):
    def __init__(self, vocab=512, block_size=64, n_layer=4, n_head=4, n_embd=128, apply_init=True):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        if apply_init:
            self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.wq = nn.Linear(dim, dim, bias=False); self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False); self.wo = nn.Linear(dim, dim, bias=False)
    def init_weights(self, init_std):
        for lin in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(lin.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)
    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (w(x).view(B, T, self.heads, C // self.heads).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))

class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False); self.w2 = nn.Linear(hidden, dim, bias=False); self.w3 = nn.Linear(dim, hidden, bias=False)
    def init_weights(self, init_std):
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        for lin in (self.w2, self.w3):
            nn.init.trunc_normal_(lin.weight, mean=0.0, std=init_std)
    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

class TransformerBlock(nn.Module):
    def __init__(self, layer_id, dim, heads, hidden, n_layers):
        super().__init__()
        self.attention = Attention(dim, heads); self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm = nn.RMSNorm(dim); self.ffn_norm = nn.RMSNorm(dim)
        self.weight_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5
    def init_weights(self):
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)
    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))

class TitanLlama(nn.Module):
    def __init__(self, vocab=1024, dim=256, n_layers=4, heads=4, hidden=512):
        super().__init__()
        self.dim = dim
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, dim, heads, hidden, n_layers) for i in range(n_layers)})
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
    def init_weights(self, buffer_device=None):
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            layer.init_weights()
        self.norm.reset_parameters()
        final_out_std = self.dim ** -0.5
        cutoff_factor = 3
        nn.init.trunc_normal_(self.output.weight, mean=0.0, std=final_out_std, a=-cutoff_factor * final_out_std, b=cutoff_factor * final_out_std)
    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def titan_llama(init: bool, **sizes: Any) -> nn.Module:
    """Built on ``meta``, moved with ``to_empty()``; ``init``: then ``init_weights()``, as torchtitan does."""
    with torch.device("meta"):
        model = TitanLlama(**sizes)
    model.to_empty(device="cpu")
    if init:
        model.init_weights()
    return model


def tiny_hf(post_init: bool = True, **config: Any) -> nn.Module:
    """A custom Hugging Face model whose ``__init__`` may forget ``post_init()``."""
    pytest.importorskip("transformers")
    import transformers as tf

    tf.logging.set_verbosity_error()

    class TinyConfig(tf.PretrainedConfig):
        model_type = "tiny-declared"

        def __init__(self, vocab_size=256, hidden_size=128, num_layers=2, initializer_range=0.02, **kw):
            self.vocab_size, self.hidden_size = vocab_size, hidden_size
            self.num_layers, self.initializer_range = num_layers, initializer_range
            super().__init__(**kw)

    class TinyBlock(nn.Module):
        def __init__(self, h):
            super().__init__()
            self.norm, self.up, self.down = nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x):
            return x + self.down(F.gelu(self.up(self.norm(x))))

    class TinyHF(tf.PreTrainedModel):
        config_class = TinyConfig

        def __init__(self, config):
            super().__init__(config)
            self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
            self.blocks = nn.ModuleList(TinyBlock(config.hidden_size) for _ in range(config.num_layers))
            self.head = nn.Linear(config.hidden_size, config.vocab_size)
            if post_init:
                self.post_init()

        def forward(self, input_ids):
            x = self.embed(input_ids)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return TinyHF(TinyConfig(**config))


def gpt2(layers: int = 2, width: int = 128, vocab: int = 1000) -> nn.Module:
    pytest.importorskip("transformers")
    import transformers as tf

    tf.logging.set_verbosity_error()
    return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=layers, n_embd=width, n_head=2, vocab_size=vocab))


def undo_c_proj_scaling(model: nn.Module) -> None:
    """GPT-2's residual projections back at the per-layer 0.02, as when the block-level scaling stopped applying."""
    with torch.no_grad():
        for block in model.transformer.h:
            nn.init.normal_(block.attn.c_proj.weight, std=0.02)
            nn.init.normal_(block.mlp.c_proj.weight, std=0.02)


def ids(vocab: int, batch: int = 2, length: int = 32) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))
