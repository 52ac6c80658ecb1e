"""Healthy models that the signal, gradient, dead-unit and saturation rules (IL003, IL005, IL006,
IL007) once flagged, each beside a broken twin of the same kind that must still be flagged.

Published architectures are built offline from their configs at the widths and vocabularies the
false alarms were seen at; depth is cut where it does not matter, sequences are short.
"""
import math
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import initlint

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

MINE = ("IL003", "IL005", "IL006", "IL007")


def found(report):
    """(code, module) of the warnings of the rules under test."""
    return {(f.code, m) for f in report.findings if f.code in MINE and f.severity != "info"
            for m in f.members or [f.module]}


def codes(report):
    return {c for c, _ in found(report)}


def transformers():
    pytest.importorskip("transformers")
    import transformers as tf

    tf.logging.set_verbosity_error()
    return tf


def tokens(vocab, batch=2, length=16):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------- branch gates
class GatedBlock(nn.Module):
    """A residual MLP block whose branch is multiplied by a learned scale: per channel after a
    LayerNorm (LayerScale, as in ConvNeXt and CaiT) or one scalar without a norm (ReZero, SkipInit)."""

    def __init__(self, width: int, per_channel: bool, value: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width) if per_channel else nn.Identity()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.scale = nn.Parameter(torch.full((width,) if per_channel else (), value))

    def forward(self, x):
        return x + self.scale * self.fc2(F.gelu(self.fc1(self.norm(x))))


class Gated(nn.Module):
    def __init__(self, per_channel: bool = True, value: float = 1e-6, width: int = 256, blocks: int = 6) -> None:
        super().__init__()
        self.inp = nn.Linear(32, width)
        self.blocks = nn.Sequential(*[GatedBlock(width, per_channel, value) for _ in range(blocks)])
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        return self.head(self.blocks(self.inp(x)))


class BasicBlock(nn.Module):
    """ResNet basic block; ``zero_gamma`` zero-initialises the last BatchNorm (``zero_init_residual``)."""

    def __init__(self, channels: int, zero_gamma: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        for conv in (self.conv1, self.conv2):
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
        if zero_gamma:
            nn.init.zeros_(self.bn2.weight)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class FixupBlock(nn.Module):
    """Fixup (Zhang et al. 2019): scalar biases, a scalar multiplier, the last conv zero-initialised."""

    def __init__(self, channels: int, blocks: int) -> None:
        super().__init__()
        self.bias1a, self.bias1b, self.bias2a, self.bias2b = (nn.Parameter(torch.zeros(1)) for _ in range(4))
        self.scale = nn.Parameter(torch.ones(1))
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        nn.init.normal_(self.conv1.weight, std=math.sqrt(2 / (channels * 9)) * blocks ** -0.5)
        nn.init.zeros_(self.conv2.weight)

    def forward(self, x):
        out = F.relu(self.conv1(x + self.bias1a) + self.bias1b)
        return F.relu(self.conv2(out + self.bias2a) * self.scale + self.bias2b + x)


class ConvResNet(nn.Module):
    def __init__(self, kind: str, channels: int = 64, blocks: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        nn.init.kaiming_normal_(self.stem.weight, nonlinearity="relu")
        self.bn = nn.BatchNorm2d(channels) if kind == "zero_gamma" else nn.Identity()
        make = (lambda: BasicBlock(channels, True)) if kind == "zero_gamma" else (lambda: FixupBlock(channels, blocks))
        self.blocks = nn.Sequential(*[make() for _ in range(blocks)])
        self.fc = nn.Linear(channels, 10)
        if kind == "fixup":
            nn.init.zeros_(self.fc.weight)
            nn.init.zeros_(self.fc.bias)

    def forward(self, x):
        return self.fc(self.blocks(F.relu(self.bn(self.stem(x)))).mean(dim=(2, 3)))


class ZeroProjGPT(nn.Module):
    """modded-nanoGPT's layout: RMS-normed pre-norm blocks whose output projections and head start at zero."""

    def __init__(self, vocab: int = 50304, width: int = 768, blocks: int = 2, heads: int = 6) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, width)
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width, bias=False) for _ in range(blocks))
        self.proj = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(blocks))
        self.up = nn.ModuleList(nn.Linear(width, 4 * width, bias=False) for _ in range(blocks))
        self.down = nn.ModuleList(nn.Linear(4 * width, width, bias=False) for _ in range(blocks))
        self.head = nn.Linear(width, vocab, bias=False)
        for layer in [*self.proj, *self.down, self.head]:
            nn.init.zeros_(layer.weight)

    def forward(self, ids):
        x = F.rms_norm(self.embed(ids), (self.embed.embedding_dim,))
        b, t, d = x.shape
        for qkv, proj, up, down in zip(self.qkv, self.proj, self.up, self.down):
            q, k, v = qkv(F.rms_norm(x, (d,))).view(b, t, 3, self.heads, -1).transpose(1, 3).unbind(2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + proj(y)
            x = x + down(F.relu(up(F.rms_norm(x, (d,)))).square())
        return self.head(F.rms_norm(x, (d,)))


def test_convnext_layerscale_is_not_vanishing_gradients():
    tf = transformers()
    torch.manual_seed(0)
    # ConvNeXt-T's widths (96..768) and LayerScale 1e-6 in every block; 2 blocks per stage of (3, 3, 9, 3)
    model = tf.ConvNextForImageClassification(tf.ConvNextConfig(depths=[2, 2, 2, 2]))
    report = initlint.audit(model, torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)))
    assert found(report) == set()


@pytest.mark.parametrize("per_channel,value", [(True, 1e-6), (True, 1e-5), (False, 0.0)],
                         ids=["layerscale-1e-6", "layerscale-1e-5", "rezero"])
def test_gated_branches_are_near_identity_by_design(per_channel, value):
    torch.manual_seed(0)
    assert found(initlint.audit(Gated(per_channel, value), torch.randn(16, 32))) == set()


def test_a_gate_is_read_from_its_value_and_the_branch_is_still_judged_up_to_it():
    torch.manual_seed(0)
    # the same blocks with the gate at 1 and randn weights inside: the branch explodes
    open_gate = Gated(True, 1.0)
    for block in open_gate.blocks:
        nn.init.normal_(block.fc1.weight)
        nn.init.normal_(block.fc2.weight)
    drift = [f for f in initlint.audit(open_gate, torch.randn(16, 32)).findings if f.code == "IL005"]
    assert drift and drift[0].module.startswith("blocks.") and drift[0].value > 100
    # gated at 1e-6, the branch still explodes before its gate
    closed = Gated(True, 1e-6)
    for block in closed.blocks:
        nn.init.normal_(block.fc1.weight)
        nn.init.normal_(block.fc2.weight)
    drift = [f for f in initlint.audit(closed, torch.randn(16, 32)).findings if f.code == "IL005"]
    assert drift and drift[0].module.startswith("blocks.") and drift[0].value > 100


@pytest.mark.parametrize("kind", ["zero_gamma", "fixup"])
def test_zero_initialised_residual_ends_are_clean(kind):
    torch.manual_seed(0)
    assert found(initlint.audit(ConvResNet(kind), torch.randn(8, 3, 16, 16))) == set()


def test_zero_initialised_output_projections_and_head_are_clean():
    torch.manual_seed(0)
    assert found(initlint.audit(ZeroProjGPT(), tokens(50304))) == set()


def test_zero_gradients_of_a_gated_branch_do_not_blind_the_gradient_rule():
    torch.manual_seed(0)
    from pyramid import pyramid

    class Tail(nn.Module):
        """A naive tanh pyramid followed by a ReZero block (alpha = 0: its layers get exactly zero gradient)."""

        def __init__(self):
            super().__init__()
            self.body = pyramid(10, "tanh", "naive")
            self.body[-1] = nn.Linear(self.body[-1].in_features, 32)
            self.block = GatedBlock(32, per_channel=False, value=0.0)

        def forward(self, x):
            return self.block(self.body(x))

    assert "IL006" in codes(initlint.audit(Tail()))


# ----------------------------------------------------------------------------- where drift is measured
def test_gemma3_stream_starts_at_the_scaled_embedding():
    tf = transformers()
    if not hasattr(tf, "Gemma3TextConfig"):
        pytest.skip(f"transformers {tf.__version__} has no Gemma 3 (4.50 and newer have)")
    torch.manual_seed(0)
    # Gemma 3 270M's widths (hidden 640: the embedding module multiplies by sqrt(640) = 25.3); the
    # vocabulary (262144) plays no part in where the stream starts, so a small one keeps this fast
    config = tf.Gemma3TextConfig(hidden_size=640, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=4,
                                 num_key_value_heads=1, head_dim=256, vocab_size=4096)
    assert found(initlint.audit(tf.Gemma3ForCausalLM(config), tokens(4096))) == set()


class ScaledEmbedding(nn.Embedding):
    """An embedding module that scales its own lookup, as Gemma's does."""

    def forward(self, ids):
        return super().forward(ids) * self.embedding_dim ** 0.5


class ScaledThenShrinking(nn.Module):
    """A scaled embedding then plain linear layers at std 0.01: the signal vanishes."""

    def __init__(self):
        super().__init__()
        self.embed = ScaledEmbedding(1000, 256)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.layers = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
        for layer in self.layers:
            nn.init.normal_(layer.weight, std=0.01)
            nn.init.zeros_(layer.bias)

    def forward(self, ids):
        return self.layers(self.embed(ids))


def test_drift_is_measured_from_an_embedding_modules_own_output():
    torch.manual_seed(0)
    report = initlint.audit(ScaledThenShrinking(), tokens(1000))
    [drift] = [f for f in report.findings if f.code == "IL005"]
    assert drift.module == "layers.0"
    assert "at the output of embed" in drift.message
    # 0.02 * sqrt(256) = 0.32 at the start, four layers of 0.01 * sqrt(256) = 0.16 each
    assert drift.value == pytest.approx(0.16 ** 4, rel=0.3)


@pytest.mark.slow
def test_llama_at_32_layers_grows_its_stream_additively_not_exponentially():
    tf = transformers()
    torch.manual_seed(0)
    # hidden 1024, 32 layers and vocabulary 32000 (embedding std 0.02); a narrow MLP and 4 KV heads keep the
    # build fast (the attention branches are what lift the stream from 0.02 in the first block)
    config = tf.LlamaConfig(hidden_size=1024, intermediate_size=256, num_hidden_layers=32, num_attention_heads=16,
                            num_key_value_heads=4, vocab_size=32000)
    report = initlint.audit(tf.LlamaForCausalLM(config), tokens(32000))
    assert found(report) == set()
    last = [op for op in report.graph if op.kind == "add" and op.module == "model.layers.31"][-1]
    assert report.probe.ops[last.id]["rms"] > 1.0  # the stream did grow from the embedding's 0.02


def test_mamba_mixer_gain_is_judged_per_block():
    tf = transformers()
    torch.manual_seed(0)
    config = tf.MambaConfig(hidden_size=768, num_hidden_layers=4, vocab_size=50280)
    report = initlint.audit(tf.MambaForCausalLM(config), tokens(50280))
    assert found(report) == set()


class PlainResidual(nn.Module):
    """Residual blocks without any normalisation at He init: the stream doubles its variance per block."""

    def __init__(self, blocks: int = 30, width: int = 128):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))
        for layer in self.layers:
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for layer in self.layers:
            x = x + F.relu(layer(x))
        return self.head(x)


def test_a_stream_that_compounds_through_residual_blocks_is_still_flagged():
    torch.manual_seed(0)
    [drift] = [f for f in initlint.audit(PlainResidual(), torch.randn(16, 128)).findings if f.code == "IL005"]
    assert drift.value > 1e4 and " over 30 weight layer(s)" in drift.message


def test_drift_without_weight_layers_never_says_over_0_layers():
    class Amplify(nn.Module):
        def forward(self, x):
            return x * 1000.0

    [drift] = [f for f in initlint.audit(Amplify(), torch.randn(16, 64)).findings if f.code == "IL005"]
    assert "over 0" not in drift.message and "with no weight layer in between" in drift.message


class FourierMixer(nn.Module):
    """FNet's block (Lee-Thorp et al. 2021): ``LayerNorm(x + fft(x).real)`` with the unnormalised 2-D
    DFT over tokens and features, then a post-norm feed-forward block; with ``to_output``, one more
    Fourier transform after the last norm (the twin: its scale reaches the model output)."""

    def __init__(self, width: int = 768, blocks: int = 2, to_output: bool = False):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(2 * blocks))
        self.ffn = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                                 for _ in range(blocks))
        self.to_output = to_output

    def forward(self, x):
        x = self.proj(x)
        for i, ffn in enumerate(self.ffn):
            x = self.norms[2 * i](x + torch.fft.fftn(x, dim=(1, 2)).real)
            x = self.norms[2 * i + 1](x + ffn(x))
        return torch.fft.fftn(x, dim=(1, 2)).real if self.to_output else x


@pytest.mark.parametrize("tokens", [16, 512])
def test_an_unnormalised_fourier_mixing_into_a_norm_is_no_drift_and_no_residual_branch(tokens):
    # x + fft(x).real is ~sqrt(tokens x width) times x (108x at 16 x 768 in FNet): no weight layer sets it,
    # the norm after it undoes it. It was IL005 "108x with no weight layer in between", and IL012 on the
    # projection that computes x (the stream's own op counted as the branch's layer).
    torch.manual_seed(0)
    report = initlint.audit(FourierMixer(), torch.randn(2, tokens, 768), select=["IL005", "IL012"])
    assert {(f.code, f.module) for f in report.findings} == set()


def test_an_unnormalised_fourier_mixing_that_reaches_the_output_is_still_drift():
    torch.manual_seed(0)
    report = initlint.audit(FourierMixer(to_output=True), torch.randn(2, 64, 768), select=["IL005"])
    [drift] = report.findings
    assert drift.code == "IL005" and "with no weight layer in between" in drift.message and drift.value > 100


class LocalMaskAttention(nn.Module):
    """LongT5's local attention in small: a learnt relative-position bias (an embedding) plus a mask of
    -1e10 outside a window of +-2 tokens, built from ``torch.arange``, added to the scores before the
    softmax; ``gain`` multiplies a stack of linear layers before it (the twin: 3 layers at 100x)."""

    def __init__(self, width: int = 64, gain: float = 0.0):
        super().__init__()
        self.stack = nn.Sequential(*(nn.Linear(width, width) for _ in range(3)))
        if gain:
            for layer in self.stack:
                nn.init.normal_(layer.weight, std=gain / math.sqrt(width))
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.bias = nn.Embedding(32, 1)
        self.gain = gain

    def forward(self, x):
        if self.gain:
            x = self.stack(x)
        pos = torch.arange(x.shape[1], device=x.device)
        rel = pos[None, :] - pos[:, None]
        bias = self.bias(rel.clamp(-16, 15) + 16).squeeze(-1)
        bias = bias + torch.where(rel.abs() <= 2, 0.0, -1e10)
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / math.sqrt(x.shape[-1]) + bias
        return scores.softmax(-1) @ self.v(x)


def test_a_mask_added_to_a_position_bias_is_not_a_signal_that_explodes():
    # LongT5 at its default config: IL005 "0.0405 at relative_attention_bias -> 1e+10 at Tensor.add_"
    torch.manual_seed(0)
    report = initlint.audit(LocalMaskAttention(), torch.randn(2, 16, 64), select=["IL005"])
    assert {(f.code, f.module) for f in report.findings} == set()


def test_an_exploding_signal_beside_the_same_mask_is_still_flagged():
    torch.manual_seed(0)
    report = initlint.audit(LocalMaskAttention(gain=100.0), torch.randn(2, 16, 64), select=["IL005"])
    assert [(f.code, f.module) for f in report.findings] == [("IL005", "stack.0")]


class WordLM(nn.Module):
    """PyTorch's word-level language model example: embedding, 2-layer LSTM, decoder over WikiText-2's
    33278 words, log_softmax, uniform(-0.1, 0.1) init."""

    def __init__(self, vocab: int = 33278, width: int = 200):
        super().__init__()
        self.encoder = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width, 2, batch_first=True)
        self.decoder = nn.Linear(width, vocab)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, ids):
        out, _ = self.rnn(self.encoder(ids))
        return F.log_softmax(self.decoder(out), dim=-1)


def test_log_softmax_offset_is_not_signal_growth():
    torch.manual_seed(0)
    model = WordLM()
    assert found(initlint.audit(model, tokens(33278))) == set()
    nn.init.normal_(model.decoder.weight, std=100.0)  # now the logits themselves explode
    report = initlint.audit(model, tokens(33278))
    drift = [f for f in report.findings if f.code == "IL005"]
    assert [f.module for f in drift] == ["decoder"] and "nn.Linear (decoder)" in drift[0].message


# ----------------------------------------------------------------------------- gradients that are small by structure
class GRUCell(nn.Module):
    """A GRU cell written out and unrolled over the sequence."""

    def __init__(self, inputs: int = 64, hidden: int = 128, classes: int = 10):
        super().__init__()
        self.hidden = hidden
        self.xh_to_r = nn.Linear(inputs + hidden, hidden)
        self.xh_to_z = nn.Linear(inputs + hidden, hidden)
        self.xh_to_n = nn.Linear(inputs + hidden, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        h = torch.zeros(x.shape[0], self.hidden)
        for t in range(x.shape[1]):
            xh = torch.cat([x[:, t], h], dim=1)
            r = torch.sigmoid(self.xh_to_r(xh))
            z = torch.sigmoid(self.xh_to_z(xh))
            n = torch.tanh(self.xh_to_n(torch.cat([x[:, t], r * h], dim=1)))
            h = (1 - z) * n + z * h
        return self.head(h)


def test_gru_reset_gate_gradient_is_structure_not_init():
    torch.manual_seed(0)
    assert found(initlint.audit(GRUCell(), torch.randn(16, 8, 64))) == set()


class ConvPool(nn.Module):
    """conv -> conv -> global mean-pool -> linear at He init."""

    def __init__(self, channels: int = 64, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.fc = nn.Linear(channels, classes)
        for conv in (self.conv1, self.conv2):
            nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
            nn.init.zeros_(conv.bias)
        nn.init.kaiming_normal_(self.fc.weight, nonlinearity="linear")

    def forward(self, x):
        return self.fc(F.relu(self.conv2(F.relu(self.conv1(x)))).mean(dim=(2, 3)))


def test_global_mean_pool_spreads_gradients_evenly():
    torch.manual_seed(0)
    assert found(initlint.audit(ConvPool(), torch.randn(8, 3, 32, 32))) == set()


@pytest.mark.parametrize("width,act", [(128, nn.ReLU), (64, nn.ReLU), (768, nn.GELU)])
def test_a_head_over_21841_classes_is_not_an_init_defect(width, act):
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(width, width), act(), nn.Linear(width, 21841))
    assert found(initlint.audit(head, torch.randn(16, width))) == set()


class TopTwoMoE(nn.Module):
    """A top-2 mixture of experts over tokens (softmax router, renormalised top-2 weights): ``sparse``
    runs each expert on its tokens only, ``dense`` on every token, weighted by a routing probability
    that is zero for the tokens routed elsewhere."""

    def __init__(self, width: int = 256, hidden: int = 1024, experts: int = 8, dense: bool = False):
        super().__init__()
        self.dense = dense
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
                                     for _ in range(experts))

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(self.router(flat), dim=-1)
        weights, chosen = torch.topk(probs, 2, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        if self.dense:
            routing = torch.zeros_like(probs).scatter(-1, chosen, weights)
            for e, expert in enumerate(self.experts):
                out = out + routing[:, e:e + 1] * expert(flat)
            return out.reshape(x.shape)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == e)
            if rows.numel():
                out = out.index_add(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        return out.reshape(x.shape)


class MoELM(nn.Module):
    def __init__(self, vocab: int = 1000, width: int = 256, blocks: int = 2, dense: bool = False):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(blocks))
        self.moes = nn.ModuleList(TopTwoMoE(width, dense=dense) for _ in range(blocks))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        for norm, moe in zip(self.norms, self.moes):
            x = x + moe(norm(x))
        return self.head(x)


@pytest.mark.parametrize("dense", [False, True], ids=["sparse", "dense"])
def test_top2_mixture_of_experts_routing_is_not_an_init_defect(dense):
    torch.manual_seed(0)
    assert found(initlint.audit(MoELM(dense=dense), tokens(1000, batch=4))) == set()
    # without a norm in front of the experts and at 64 wide, dense routing spread gradients 1e3x
    torch.manual_seed(0)
    moe = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), TopTwoMoE(64, 512, experts=4, dense=dense), nn.Linear(64, 10))
    assert found(initlint.audit(moe, torch.randn(64, 64))) == set()


def test_a_diffusion_unets_timestep_projections_are_not_compared_with_its_convolutions():
    pytest.importorskip("diffusers")
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    # google/ddpm-cifar10-32's layout at a quarter of its channels
    model = UNet2DModel(sample_size=32, in_channels=3, out_channels=3, layers_per_block=1,
                        block_out_channels=(32, 64, 64, 64),
                        down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
                        up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"))
    inputs = {"sample": torch.randn(2, 3, 32, 32), "timestep": torch.tensor([10, 500])}
    assert found(initlint.audit(model, inputs)) == set()


def test_the_gradient_rule_still_flags_a_naive_pyramid_behind_a_pool():
    torch.manual_seed(0)
    from pyramid import pyramid

    model = nn.Sequential(nn.Conv2d(3, 1000, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), *pyramid(10, "tanh", "naive"))
    assert "IL006" in codes(initlint.audit(model, torch.randn(8, 3, 4, 4)))


# ----------------------------------------------------------------------------- a dead network
@pytest.mark.parametrize("seed,layer,units", [(7, "199", 5), (54, "187", 11)])
def test_a_he_pyramid_that_dies_is_reported_where_it_dies(seed, layer, units):
    from pyramid import pyramid

    torch.manual_seed(seed)
    report = initlint.audit(pyramid(100, "relu", "he"))
    [dead] = [f for f in report.findings if f.code == "IL003"]
    assert dead.module == layer and dead.value == 1.0
    assert f"all {units} units output zero" in dead.message
    assert found(report) == {("IL003", layer)}


def test_a_dead_layer_that_a_skip_bypasses_is_judged_by_the_threshold():
    class Bypassed(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 8)
            nn.init.constant_(self.fc.bias, -100.0)  # all 8 units dead, but the skip carries the signal
            self.out = nn.Linear(8, 64)

        def forward(self, x):
            return x + self.out(F.relu(self.fc(x)))

    # fewer than 16 units: the dead-fraction threshold is above 100%; the output is not constant
    assert found(initlint.audit(Bypassed(), torch.randn(16, 64))) == set()


# ----------------------------------------------------------------------------- size does not change the verdict
@pytest.mark.parametrize("units", [1000, 150_000])
def test_dead_units_and_saturation_judged_alike_at_1000_and_150000_units(units):
    torch.manual_seed(0)
    healthy = nn.Sequential(nn.Linear(64, units), nn.ReLU(), nn.Linear(units, 1))
    assert found(initlint.audit(healthy, torch.randn(16, 64))) == set()
    dying = nn.Sequential(nn.Linear(64, units), nn.ReLU(), nn.Linear(units, 1))
    with torch.no_grad():
        dying[0].bias[: int(units * 0.7)] = -100.0  # 70% of the units dead
    assert ("IL003", "1") in found(initlint.audit(dying, torch.randn(16, 64)))
    saturated = nn.Sequential(nn.Linear(64, units), nn.Tanh(), nn.Linear(units, 1))
    nn.init.normal_(saturated[0].weight, std=1.0)
    assert ("IL007", "1") in found(initlint.audit(saturated, torch.randn(16, 64)))


class PreNormBlocks(nn.Module):
    """Pre-norm MLP blocks whose branch is small inside (fc1 at std 0.002, 0.011 of 1/sqrt(32)), a final norm;
    ``branch_first`` writes the residual sum as ``branch + x``, as SegFormer's blocks do."""

    def __init__(self, branch_first, width=32):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(2))
        self.fc1 = nn.ModuleList(nn.Linear(width, 4 * width) for _ in range(2))
        self.fc2 = nn.ModuleList(nn.Linear(4 * width, width) for _ in range(2))
        for layer in list(self.fc1) + list(self.fc2):
            nn.init.normal_(layer.weight, std=0.002 if layer in self.fc1 else 0.02)
            nn.init.zeros_(layer.bias)
        self.final = nn.LayerNorm(width)
        self.branch_first = branch_first

    def forward(self, x):
        for norm, fc1, fc2 in zip(self.norms, self.fc1, self.fc2):
            branch = fc2(F.gelu(fc1(norm(x))))
            x = branch + x if self.branch_first else x + branch
        return self.final(x)


@pytest.mark.parametrize("branch_first", [False, True])
def test_a_small_pre_norm_branch_before_a_norm_is_not_a_vanishing_signal_in_either_operand_order(branch_first):
    # the norm's input is the residual sum; IL005 went back through the sum's first operand, so
    # `branch + x` judged the branch's inner scale (SegFormer-B0: 0.0032x at stages.0.blocks.0.mlp.fc1)
    x = torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    assert found(initlint.audit(PreNormBlocks(branch_first), x)) == set()


def test_segformer_b0_at_its_default_init_has_no_vanishing_signal():
    tf = transformers()
    torch.manual_seed(0)
    model = tf.SegformerModel(tf.SegformerConfig())
    assert found(initlint.audit(model, torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)))) == set()


class LogDecayScan(nn.Module):
    """A state-space scan in Mamba2's chunked form: per-head log-decays ``-A * dt`` (A = 1..heads), their
    cumulative sum over positions, and its exponential as the decay applied to the values."""

    def __init__(self, width=64, heads=128, exponential=True):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.dt = nn.Linear(width, heads)
        self.values = nn.Linear(width, heads)
        self.out = nn.Linear(heads, width)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, heads + 1, dtype=torch.float32)))
        self.exponential = exponential

    def forward(self, x):
        h = self.norm(x)
        log_decay = torch.cumsum(-torch.exp(self.A_log) * F.softplus(self.dt(h)), dim=1)
        decay = torch.exp(log_decay) if self.exponential else log_decay
        return self.out(torch.einsum("bth,bth->bth", decay, self.values(h)))


def test_a_cumulative_log_decay_read_through_exp_is_not_a_signal_explosion():
    # Mamba2 (hidden 4096, 128 heads) got IL005 "signal explodes: 1 -> 4.7e3 at torch.cumsum" there
    x = torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    assert found(initlint.audit(LogDecayScan(), x)) == set()
    # the same cumulative sum used as a signal is flagged
    torch.manual_seed(0)
    assert "IL005" in codes(initlint.audit(LogDecayScan(exponential=False), x))


# ----------------------------------------------------------- normalised scans (linear attention, SSD)
class ScaledIntoNorm(nn.Module):
    """Three bias-free tanh layers at a twentieth of LeCun's scale, then an L2 normalisation written as
    functional ops (as the gated delta rule normalises its queries and keys), then a head; ``biased``:
    the same layers with PyTorch's default biases, which a shrunk signal no longer dominates; ``eps``:
    a LayerNorm with that epsilon instead (1e-5 outweighs the shrunk signal's mean square, 1.6e-8)."""

    def __init__(self, width=256, biased=False, eps=None):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=biased) for _ in range(3))
        for layer in self.layers:
            nn.init.normal_(layer.weight, std=0.05 / math.sqrt(width))
        self.norm = nn.LayerNorm(width, eps=eps) if eps is not None else None
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        if self.norm is not None:
            return self.head(self.norm(x))
        x = x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)
        return self.head(x)


def test_a_bias_free_stack_into_a_normalisation_is_a_rescale_the_norm_undoes():
    # it was IL001 on the three layers ("shrinks 4.1e+15x before Tensor.sum", the norm's own statistic, whose
    # x * x doubled the drift) and on the head (the shrink carried through the norm to the output)
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    report = initlint.audit(ScaledIntoNorm(), x, select=["IL001", "IL005"])
    assert {(f.code, f.module) for f in report.findings} == set()
    torch.manual_seed(0)
    report = initlint.audit(ScaledIntoNorm(eps=1e-12), x, select=["IL001", "IL005"])
    assert {(f.code, f.module) for f in report.findings} == set()
    torch.manual_seed(0)
    report = initlint.audit(ScaledIntoNorm(biased=True), x, select=["IL001", "IL005"])
    assert {(f.code, f.module) for f in report.findings} == {("IL001", "layers.0"), ("IL001", "layers.1"),
                                                             ("IL001", "layers.2")}


def test_a_normalisation_starved_by_its_epsilon_does_not_undo_a_shrink():
    # LayerNorm(eps=1e-5) of a signal whose mean square is 1.6e-8 outputs about x / sqrt(1e-5): the shrink
    # goes on through it to the model output (with the head's PyTorch-default scale, 0.57x)
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    report = initlint.audit(ScaledIntoNorm(eps=1e-5), x, select=["IL001"])
    assert {(f.code, f.module) for f in report.findings} == {
        ("IL001", "layers.0"), ("IL001", "layers.1"), ("IL001", "layers.2"), ("IL001", "head")}
    assert "before the model output" in report.findings[0].message


class SigmoidGate(nn.Module):
    """A value path gated by ``sigmoid(W_b x)`` with ``W_b`` far below its scale (the gated delta rule's
    ``beta``): a small input leaves the sigmoid at 1/2. ``centred``: a tanh gate, whose output shrinks with it."""

    def __init__(self, width=256, centred=False):
        super().__init__()
        self.value = nn.Linear(width, width, bias=False)
        self.gate = nn.Linear(width, width, bias=False)
        nn.init.normal_(self.gate.weight, std=0.003 / math.sqrt(width))
        self.act = torch.tanh if centred else torch.sigmoid
        self.out = nn.Linear(width, width)

    def forward(self, x):
        return self.out(self.value(x) * self.act(self.gate(x)))


def test_a_small_input_to_a_sigmoid_gate_does_not_shrink_what_it_gates():
    # it was IL001 on gate, value and out ("shrinks 1e+06x before the model output")
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    assert initlint.audit(SigmoidGate(), x, select=["IL001"]).findings == []
    torch.manual_seed(0)
    report = initlint.audit(SigmoidGate(centred=True), x, select=["IL001"])
    # the gate's shrink compounds with the value path's PyTorch-default layers (1/sqrt(3) each)
    assert {(f.code, f.module) for f in report.findings} == {("IL001", "gate"), ("IL001", "value"), ("IL001", "out")}


def lara_mini(tf, biased_conv=False):
    """Lara-mini (Qwen3-Next's gated delta rule and full attention) at the widths of
    ``benchmarks/hf_init_training.py --model lara_mini``, at Hugging Face's init (the depthwise conv at
    std 0.02); ``biased_conv``: its conv given a bias of 0.1, which a signal at 1e-2 no longer dominates."""
    torch.manual_seed(0)
    model = tf.LaraMiniForCausalLM(tf.LaraMiniConfig(
        vocab_size=64, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, layer_types=["linear_attention", "full_attention"] * 2, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=256, shared_expert_intermediate_size=256,
        sliding_window=64, max_position_embeddings=256))
    if biased_conv:
        for layer in model.model.layers:
            if hasattr(layer, "linear_attn"):
                conv = layer.linear_attn.conv1d
                conv.bias = nn.Parameter(torch.full((conv.out_channels,), 0.1))
    return model


@pytest.mark.parametrize("length", [16, 256])
def test_the_gated_delta_rule_at_hugging_faces_init_is_clean(length):
    # it was IL001 on in_proj_qkv, in_proj_b and the conv ("shrinks 1.6e+05x before linalg_solve_triangular")
    # and IL005 ("signal vanishes" inside linear_attn); that init learnt the copy task of
    # benchmarks/hf_init_training.py (steps 352 and 365), PyTorch's default conv (clean) did not in 400 steps.
    # Its queries and keys are L2-normalised, its output a gated RMSNorm's (both written as functional ops).
    tf = transformers()
    report = initlint.audit(lara_mini(tf), tokens(64, 2, length), select=["IL001", "IL005"])
    assert {(f.code, f.module) for f in report.findings if f.severity != "info"} == set()


def test_the_gated_delta_rule_with_a_bias_that_swamps_its_shrunk_values_is_still_flagged():
    tf = transformers()
    report = initlint.audit(lara_mini(tf, biased_conv=True), tokens(64, 2, 64), select=["IL001"])
    assert {(f.code, f.module) for f in report.findings} >= {
        ("IL001", "model.layers.0.linear_attn"), ("IL001", "model.layers.2.linear_attn")}


@pytest.mark.slow
@pytest.mark.parametrize("kind,cls", [("nemotron_h", "NemotronHModel"), ("falcon_h1", "FalconH1Model")])
def test_the_state_space_scans_of_hybrids_at_real_width_are_no_vanishing_signal(kind, cls):
    # their default configs (hidden 4096, vocabularies 131072 and 128000), depth cut to 2: IL005 "signal
    # vanishes" at an einsum of the chunked scan (4.5e-5x and 0.00075x): its B, C and x come from a bias-free
    # in_proj and conv at std 0.02, and the scan's output reaches a gated RMSNorm through products only
    tf = transformers()
    config = tf.CONFIG_MAPPING[kind]()
    config.num_hidden_layers = 2
    torch.manual_seed(0)
    model = getattr(tf, cls)(config)
    report = initlint.audit(model, tokens(config.vocab_size), select=["IL001", "IL005"])
    assert {(f.code, f.module) for f in report.findings if f.severity != "info"} == set()


def test_a_cosine_attentions_window_mask_and_position_bias_are_no_signal_growth():
    # Swin2SR (Swin-v2's cosine attention: F.normalize(q) @ F.normalize(k)^T times a logit scale, plus a
    # position bias computed from a coordinate table, plus the shifted window's mask of -100) at its default
    # config, depth cut to 2 per stage: the scores plus the mask (rms 67) were judged against the normalised
    # queries (0.25) once F.normalize counted as a normalisation; an addition of tensors that carry no signal
    # shifts it, and the signal is judged at its own input
    tf = transformers()
    config = tf.Swin2SRConfig(depths=[2, 2])
    torch.manual_seed(0)
    model = tf.Swin2SRModel(config)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    report = initlint.audit(model, {"pixel_values": x}, select=["IL005"])
    assert report.findings == []


def aimv2_one_layer():
    """AIMv2 at its default widths (vision 1024, text 768), one layer per tower, on 56 x 56 images, at Hugging
    Face's init (both projections at std 1, into the L2 normalisation of the embeddings); and its inputs."""
    tf = transformers()
    torch.manual_seed(0)
    model = tf.Aimv2Model(tf.Aimv2Config(vision_config=dict(num_hidden_layers=1, image_size=56),
                                         text_config=dict(num_hidden_layers=1, vocab_size=1000)))
    return model, {"input_ids": tokens(1000, 2, 16),
                   "pixel_values": torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(1))}


def test_projections_into_a_clip_style_l2_normalisation_are_a_rescale():
    # AIMv2's default config (vision 1024 wide, text 768), one layer per tower: Hugging Face's generic init
    # draws both projections at std 1 (its `initializer_factor`), and the embeddings are divided by
    # `pow(sum(x ** 2), 0.5)` before the logits. It was IL001 on both projections ("32x", "27.7x") and the
    # vision head ("with no normalisation before the model output"); what feeds that normalisation through
    # bias-free (or zero-bias) layers is a rescale it undoes
    assert initlint.audit(*aimv2_one_layer(), select=["IL001"]).findings == []


class ProjectedTower(nn.Module):
    """A tower whose head and projection feed an L2 normalisation (CLIP-style embeddings), the projection at
    std 1 as Hugging Face's generic init draws AIMv2's; ``normalise=False``: the same layers into the output."""

    def __init__(self, normalise=True, width=256):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.normal_(self.proj.weight, std=1.0)
        self.normalise = normalise

    def forward(self, x):
        y = self.proj(self.head(self.body(x)))
        return y / torch.pow(torch.sum(torch.pow(y, 2), dim=-1, keepdim=True), 0.5) if self.normalise else y


def test_layers_whose_scale_a_normalisation_makes_free_are_not_compared_by_their_gradients():
    # it was IL006 "spans 2.71e+03x across 3 layers" (proj's gradient is the inverse of its own scale). AIMv2 at
    # that init reached the matching task of benchmarks/hf_init_training.py at steps 20-27, the projections at
    # 1/sqrt(fan_in) (clean) at 36-49 (4 seeds)
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    assert initlint.audit(ProjectedTower(), x, select=["IL006"]).findings == []
    torch.manual_seed(0)
    report = initlint.audit(ProjectedTower(normalise=False), x, select=["IL006"])
    assert {(f.code, f.module) for f in report.findings} == {("IL006", "proj")}


def test_aimv2s_projections_into_its_normalised_embeddings_are_not_compared_by_their_gradients():
    # it was IL006 on visual_projection ("spans 1.32e+03x across 2 layers", against the vision head)
    assert initlint.audit(*aimv2_one_layer(), select=["IL006"]).findings == []


def test_electra_smalls_projection_of_its_embeddings_at_std_0_02_is_still_flagged():
    # true by training (benchmarks/hf_init_training.py --model electra): at Hugging Face's init ELECTRA-small did
    # not learn a shift task in 1000 steps (3 seeds, no warm-up); with embeddings_project at 1/sqrt(fan_in)
    # (clean) it did at steps 306-841. The projection is no scale-free layer: it feeds the residual stream
    tf = transformers()
    for fixed in (False, True):
        torch.manual_seed(0)
        model = tf.ElectraForMaskedLM(tf.ElectraConfig(vocab_size=64, num_hidden_layers=4, max_position_embeddings=128))
        if fixed:
            nn.init.normal_(model.electra.embeddings_project.weight, std=128 ** -0.5)
        report = initlint.audit(model, tokens(64, 2, 64), select=["IL006"])
        expected = set() if fixed else {("IL006", "electra.encoder.layer.0.attention.output.dense")}
        assert {(f.code, f.module) for f in report.findings} == expected


def test_gradients_exploding_through_a_deep_batchnorm_stack_are_still_flagged():
    # every Linear here feeds a BatchNorm (its scale is free, and the spread leaves it out), but a plain stack of
    # 100 Linear-BatchNorm-ReLU blocks explodes its gradients by ~1e8 at init, which no layer's own scale explains
    torch.manual_seed(0)
    layers = [nn.Linear(64, 128, bias=False), nn.BatchNorm1d(128), nn.ReLU()]
    for _ in range(100):
        layers += [nn.Linear(128, 128, bias=False), nn.BatchNorm1d(128), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(128, 10))
    report = initlint.audit(model, torch.randn(32, 64, generator=torch.Generator().manual_seed(0)), select=["IL006"])
    assert {(f.code, f.module) for f in report.findings} == {("IL006", "3")}
    assert report.findings[0].message.startswith("gradients explode") and report.findings[0].value > 1e7


class ParallelPaths(nn.Module):
    """Two branches summed before the residual stream, ``x + (main(h) + side_out(side_in(h)))``, the side one
    through an input layer at 1/100 of its default scale and an output layer at ``side_out`` times its own."""

    def __init__(self, side_out: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(256)
        self.main, self.side_in, self.side_out = nn.Linear(256, 256), nn.Linear(256, 256), nn.Linear(256, 256)
        self.head = nn.Linear(256, 10)
        with torch.no_grad():
            self.side_in.weight.mul_(0.01)
            self.side_out.weight.mul_(side_out)

    def forward(self, x):
        h = self.norm(x)
        return self.head(x + (self.main(h) + self.side_out(self.side_in(h))))


def test_a_quiet_branch_beside_a_parallel_one_is_not_compared_by_its_gradient():
    # the side branch adds 1/100 of what the main one adds: its output layer's weight gradient, 449x below the main
    # one's in variance, is small because its input is; scaled up to 0.3 of the main branch it is compared again
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    assert initlint.audit(ParallelPaths(1.0), x, select=["IL006"]).findings == []
    torch.manual_seed(0)
    report = initlint.audit(ParallelPaths(30.0), x, select=["IL006"])
    assert {(f.code, f.module) for f in report.findings} == {("IL006", "side_out")}


def test_falcon_h1s_mamba_mixer_beside_its_attention_at_hf_init():
    # Hugging Face's generic init draws the mixer's depthwise conv at std 0.02 (mamba_ssm: PyTorch's default,
    # 0.29), and the mixer adds 0.0023x what the attention beside it adds; IL006 compared its out_proj with the
    # attention's o_proj ("spans 4.3e+04x"). Trained (benchmarks/hf_init_training.py --model falcon_h1, 2 seeds)
    # it learnt the copy task at steps 58 and 52, the conv at PyTorch's default at 56 and 49
    tf = transformers()
    torch.manual_seed(0)
    config = tf.FalconH1Config(vocab_size=64, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=64, intermediate_size=896, mamba_d_ssm=64,
                               mamba_n_heads=8, mamba_d_head=8, mamba_d_state=64, mamba_chunk_size=64,
                               max_position_embeddings=256)
    report = initlint.audit(tf.FalconH1ForCausalLM(config), tokens(64, 2, 64), select=["IL006"])
    assert report.findings == [] and report.probe.backward_ran


class GatedMixer(nn.Module):
    """PatchTSMixer's mixer at its default width: ``x + gate(mlp(norm(x)))`` with
    ``gate(h) = h * softmax(W h)``, every Linear at Hugging Face's std 0.02 (0.02-0.08x of its fan-in
    scale), so the softmax gets an input 1e4x below unit scale. ``residual=False``: the same gated MLP on
    the model's only path; ``tokens``: the softmax weighs the tokens, ``softmax(W h @ h^T) @ h``, as an
    attention does, instead of gating the features; ``separable``: it weighs them with one score a token,
    ``h * (h * softmax(s)).sum(tokens)``, as MobileViTV2's separable attention does."""

    def __init__(self, width=8, blocks=3, residual=True, tokens=False, separable=False):
        super().__init__()
        self.residual, self.tokens, self.separable = residual, tokens, separable
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(blocks))
        self.fc1 = nn.ModuleList(nn.Linear(width, 2 * width) for _ in range(blocks))
        self.fc2 = nn.ModuleList(nn.Linear(2 * width, width) for _ in range(blocks))
        self.gates = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))
        for layer in [*self.fc1, *self.fc2, *self.gates]:
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)
        self.head = nn.Linear(width, 16)

    def forward(self, x):
        for norm, fc1, fc2, gate in zip(self.norms, self.fc1, self.fc2, self.gates):
            h = fc2(F.gelu(fc1(norm(x))))
            if self.tokens:
                h = torch.softmax(gate(h) @ h.transpose(-1, -2), dim=-1) @ h
            elif self.separable:
                h = h * (h * torch.softmax(gate(h)[..., :1], dim=-2)).sum(-2, keepdim=True)
            else:
                h = h * torch.softmax(gate(h), dim=-1)
            x = x + h if self.residual else h
        return self.head(x)


def test_a_softmax_that_gates_elementwise_is_left_uniform_by_a_small_input():
    # PatchTSMixer at its own init learnt a forecasting task in 43-46 steps, with IL001's fix in 104-149
    # (benchmarks/hf_init_training.py --model patchtsmixer); IL001 and IL005 flagged every mixer before
    x = torch.randn(16, 32, 8, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    assert initlint.audit(GatedMixer(), x, select=["IL001", "IL005"]).findings == []
    # on the model's only path, what the gate multiplies still carries its shrink on, through norms its
    # epsilon starves, to the model output
    torch.manual_seed(0)
    report = initlint.audit(GatedMixer(residual=False), x, select=["IL001"])
    assert {(f.code, f.module) for f in report.findings} == {
        ("IL001", f"{kind}.{i}") for kind in ("fc1", "fc2") for i in range(3)} | {("IL001", "head")}
    # a softmax that weighs tokens, from the same weights, is still judged (MobileViTV2 kept its IL005)
    for kind in ("tokens", "separable"):
        torch.manual_seed(0)
        report = initlint.audit(GatedMixer(**{kind: True}), x, select=["IL001"])
        assert {(f.code, f.module) for f in report.findings} == {
            ("IL001", f"{layer}.{i}") for layer in ("fc1", "fc2", "gates") for i in range(3)}, kind


class Forecaster(nn.Module):
    """A forecast ``loc + scale * head(stem(x))`` of the next 16 steps of a one-channel series
    (``batch x time x 1``, as PatchTSMixer's ``past_values``) normalised by its own mean and std, the
    stem and the head at std 0.01 (0.06x and 0.08x of their fan-in scale: the forecast starts at the
    context's mean). ``loc_first``: the sum written the other way round; ``centred``: no ``loc``."""

    def __init__(self, loc_first=False, centred=False):
        super().__init__()
        self.stem, self.head = nn.Linear(32, 64), nn.Linear(64, 16)
        for layer in (self.stem, self.head):
            nn.init.normal_(layer.weight, std=0.01)
            nn.init.zeros_(layer.bias)
        self.loc_first, self.centred = loc_first, centred

    def forward(self, x):
        loc = x.mean(dim=1, keepdim=True)
        scale = x.std(dim=1, keepdim=True)
        y = self.head(self.stem(((x - loc) / scale).transpose(1, 2))).transpose(1, 2) * scale
        if self.centred:
            return y
        return loc + y if self.loc_first else y + loc


def test_a_forecast_added_to_its_contexts_mean_is_judged_whichever_operand_comes_first():
    # PatchTSMixer's `y_hat * scale + loc` had its quiet forecast judged (IL005 "1.02 -> 0.00573"),
    # because the walk to a point of 16 units went back through the sum's first operand
    x = 3 + torch.randn(8, 32, 1, generator=torch.Generator().manual_seed(0))
    for loc_first in (False, True):
        torch.manual_seed(0)
        assert initlint.audit(Forecaster(loc_first=loc_first), x, select=["IL005"]).findings == []
    torch.manual_seed(0)
    report = initlint.audit(Forecaster(centred=True), x, select=["IL005"])
    assert {(f.code, f.module) for f in report.findings} == {("IL005", "stem")}


@pytest.mark.parametrize("config", [{}, dict(context_length=512, patch_length=8, patch_stride=8, d_model=48, num_layers=8,
                                             prediction_length=96, num_input_channels=7, mode="mix_channel")])
def test_patchtsmixer_at_its_own_init_is_clean(config):
    # its default config (width 8, context 32, 16 steps ahead) and a 512-step, 7-channel mixing one; at the
    # default it was IL001 on all 18 mixer Linears and IL005 "1.02 at the input -> 0.00573 at the head"
    tf = transformers()
    torch.manual_seed(0)
    model = tf.PatchTSMixerForPrediction(tf.PatchTSMixerConfig(**config))
    report = initlint.audit(model, batch_size=8)
    assert report.error is None
    assert [(f.code, f.module) for f in report.findings if f.severity != "info"] == []


class ScaledOutput(nn.Module):
    """A healthy 8-layer tanh MLP whose output the forward multiplies by a constant ``scale`` after its last
    layer: every layer's backward signal is ``scale`` times the output's."""

    def __init__(self, scale):
        super().__init__()
        self.net = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(128, 128), nn.Tanh())], nn.Linear(128, 16))
        for layer in self.net[::2]:
            nn.init.normal_(layer.weight, std=1 / math.sqrt(128))
        self.scale = scale

    def forward(self, x):
        return self.net(x) * self.scale


def test_gradients_lost_after_the_last_layer_are_information():
    # VideoPrism's contrastive output at a batch of one is exactly 1: every layer's gradient was round-off
    # (6e-14..4.8e-11 of the output's) and IL006 warned "gradients vanish" with a re-initialisation as its fix
    x = torch.randn(32, 128, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    report = initlint.audit(ScaledOutput(1e-12), x, select=["IL006"])
    assert [(f.code, f.severity) for f in report.findings] == [("IL006", "info")]
    assert "after the last weight layer" in report.findings[0].message
    torch.manual_seed(0)
    assert initlint.audit(ScaledOutput(1.0), x, select=["IL006"]).findings == []
    # vanishing through depth (30 linear layers at a tenth of their scale) still warns
    torch.manual_seed(0)
    deep = nn.Sequential(*[nn.Linear(100, 100) for _ in range(30)])
    for layer in deep:
        nn.init.normal_(layer.weight, std=0.01)
    report = initlint.audit(deep, torch.randn(32, 100, generator=torch.Generator().manual_seed(0)), select=["IL006"])
    assert [(f.code, f.severity) for f in report.findings] == [("IL006", "warning")]


class Codebook(nn.Module):
    """An encoder whose output is the index of each frame's nearest codebook vector, found as the argmax of
    ``-(|x|^2 - 2 x e + |e|^2)``, a squared distance (XCodec's and EnCodec's quantizer). ``values``: it returns
    the distances themselves, a signal."""

    def __init__(self, values=False):
        super().__init__()
        self.encoder = nn.Linear(64, 256)
        self.register_buffer("codebook", torch.randn(256, 1024))
        self.values = values

    def forward(self, x):
        h = self.encoder(x) * 3
        dist = -(h.pow(2).sum(-1, keepdim=True) - 2 * h @ self.codebook + self.codebook.pow(2).sum(0, keepdim=True))
        return dist if self.values else dist.max(dim=-1).indices


def test_an_audio_codecs_codes_are_not_a_signal_explosion():
    # XCodec at its real config: IL005 "1 -> 4.7e+04 at Tensor.neg", walking back from its integer codes
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    assert initlint.audit(Codebook(), x, select=["IL005"]).findings == []
    torch.manual_seed(0)
    assert [f.code for f in initlint.audit(Codebook(values=True), x, select=["IL005"]).findings] == ["IL005"]


class QueryWithPositions(nn.Module):
    """RT-DETR's decoder layer, reduced: self-attention whose queries and keys carry the query positions
    (``pos``) and whose values do not, a post-norm, and the next query ``norm(h) + pos``. ``pos`` is a small
    MLP's output, as RT-DETR's ``query_pos_head`` at std 0.01."""

    def __init__(self, dim=64):
        super().__init__()
        self.pos_head = nn.Sequential(nn.Linear(4, dim), nn.ReLU(), nn.Linear(dim, dim))
        for layer in (self.pos_head[0], self.pos_head[2]):
            nn.init.normal_(layer.weight, std=0.01)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, h, boxes):
        pos = self.pos_head(boxes)
        a = F.scaled_dot_product_attention(self.q(h + pos), self.k(h + pos), self.v(h))
        h = self.norm(h + self.o(a))
        return self.out(h + pos)


def test_query_positions_added_after_a_block_are_not_its_residual_stream():
    # RT-DETR, D-FINE and DEIMv2 got IL012 "the branch ending at decoder.layers.0.self_attn.o_proj adds a
    # signal of scale 1 to the residual stream of scale 0.0011, 912x": the sum of the block's normalised
    # output and the query positions was read as the positions' residual branch, because the positions
    # had entered the block's queries and keys
    from initlint.rules.base import residual_adds

    gen = torch.Generator().manual_seed(0)
    h, boxes = torch.randn(2, 16, 64, generator=gen), torch.rand(2, 16, 4, generator=gen)
    torch.manual_seed(0)
    model = QueryWithPositions()
    report = initlint.audit(model, (h, boxes), select=["IL012"])
    assert report.findings == []
    # the block's own residual is still found (the input plus the attention's output projection), and the
    # next query is no residual of the positions
    adds = [(r.stream.kind, r.branch.module) for r in residual_adds(report.graph)]
    assert adds == [("input", "o")]


def test_rt_detr_at_its_own_init_is_clean():
    # its deformable attention's zero-initialised `attention_weights` (a uniform softmax over the sampling
    # points, as Deformable DETR initialises them) got IL008, and the query positions IL012 (above)
    tf = transformers()
    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.RTDetrModel(tf.RTDetrConfig(decoder_layers=2, encoder_layers=1, num_queries=30))
    report = initlint.audit(model, batch_size=2)
    assert report.error is None
    assert [(f.code, f.severity) for f in report.findings] == [("IL016", "info")]  # the denoising table, unused here


class PositionQuery(nn.Module):
    """RT-DETR's and D-FINE's query positions: a small MLP of the boxes (std 0.01), added to the content of
    a query; ``clamp``: D-FINE's ``.clamp(min=-10, max=10)`` on them; ``out``: the positions are the output."""

    def __init__(self, clamp=True, out=False):
        super().__init__()
        self.pos_head = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 64))
        for layer in (self.pos_head[0], self.pos_head[2]):
            nn.init.normal_(layer.weight, std=0.01)
        self.q = nn.Linear(64, 64)
        self.clamp, self.out = clamp, out

    def forward(self, h, boxes):
        pos = self.pos_head(boxes)
        if self.clamp:
            pos = pos.clamp(min=-10, max=10)
        return pos if self.out else self.q(h + pos)


def test_a_clamp_that_a_small_signal_does_not_reach_passes_it_on():
    # D-FINE got IL001 on its query_pos_head "with no normalisation before Tensor.clamp"; RT-DETR, the same
    # MLP at the same init without the clamp, was clean: its positions end in a sum with the query's content
    gen = torch.Generator().manual_seed(0)
    h, boxes = torch.randn(2, 16, 64, generator=gen), torch.rand(2, 16, 4, generator=gen)
    for clamp in (False, True):
        torch.manual_seed(0)
        assert initlint.audit(PositionQuery(clamp=clamp), (h, boxes), select=["IL001"]).findings == []
    # the same positions as the model's output are still a shrink to judge
    torch.manual_seed(0)
    report = initlint.audit(PositionQuery(out=True), (h, boxes), select=["IL001"])
    assert {(f.code, f.module) for f in report.findings} == {("IL001", "pos_head.0"), ("IL001", "pos_head.2")}
