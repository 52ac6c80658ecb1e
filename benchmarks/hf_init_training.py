"""Train a transformers vision model briefly at its Hugging Face default init and at the init of the
architecture's published code, to see whether a finding on the former precedes trouble in training.

    python benchmarks/hf_init_training.py --model segformer --seeds 0,1 --steps 150

``segformer``: SegFormer-B0's widths (MiT-B0: 32-256 channels), one block per stage, a per-pixel task.
The published code (mmseg's MixVisionTransformer) draws Conv2d from ``N(0, sqrt(2 / fan_out))``:
the Mix-FFN's depthwise 3 x 3 conv at std 0.47 where HF draws 0.02 (initlint: IL005 on
``mlp.fc1``). ``focalnet``: FocalNet-T's widths (96-768), one block per stage, image classification.
FocalNet's code leaves the convs at PyTorch's default (std 0.19 for the 3 x 3 depthwise focal
convs) where HF draws 0.02 (initlint: IL001 on the modulation). ``lara_mini``: Lara-mini's hybrid of
gated-delta-rule linear attention (Qwen3-Next's) and full attention at width 256, 4 layers (linear,
full, linear, full), 4 experts, on the copy task of ``residual_training.py`` (32 random tokens of 64,
then the same 32: the loss on the second half, ``--target`` x ln 64). The published code (flash-linear-
attention's ``ShortConvolution``) leaves the depthwise conv of kernel 4 at PyTorch's default (std 0.29)
where HF's generic init draws 0.02 (initlint: IL001 on it, IL005 "signal vanishes" inside the linear
attention).
``falcon_h1``: Falcon-H1's parallel hybrid (attention and a Mamba-2 mixer side by side in every layer, then an
MLP) at width 256, 4 layers, on the copy task. Its default config has no norm inside the mixer
(``mamba_rms_norm`` false); HF's generic init draws the mixer's depthwise conv (kernel 4) at std 0.02 where
mamba_ssm's ``Mamba2`` leaves it at PyTorch's default (std 0.29), so the mixer's output is small and its
``out_proj``'s weight gradient is 4e4x (in variance) below the attention output's (initlint: IL006); the twin
resets the conv (clean).
``patchtsmixer``: PatchTSMixer at its default config (d_model 8, context 32 in patches of 8, 3 mixer layers with
gated MLPs), forecasting the next 16 steps of two sines (:func:`series_batch`). Its own init (HF's, the
published one) draws every Linear at std 0.02 (initlint before its mend: IL001 on the mixers' MLPs and gates, the
shrink ending at the gate's softmax; IL005 from the patcher to the head); the twin is IL001's fix (the mixers'
Linears at ``1 / sqrt(fan_in)``), ``patchtsmixer_io`` IL005's (the patcher and the head). ``patchtsmixer_48``: the
same at width 48, 4 mixer layers. ``--task periods`` forecasts a sine of a random period instead
(:func:`chirp_batch`), which no linear map of the context continues; ``--mixer-scales 1,0.1,1e-10`` trains the
mixers' Linears at those multiples of ``1 / sqrt(fan_in)`` instead of the two inits.
``convbert``: ConvBERT-base's widths (hidden 768, 12 heads, span kernel 9), 2 layers, on a shift task (64 random
tokens of 64; each position names the token before it). HF draws the span-based dynamic convolution's depthwise
Conv1d (kernel 9, one channel per group) at std 0.02 (initlint: IL005 "signal vanishes" into the kernel's
softmax, 0.007x); the clean twin leaves it at Conv1d's own default (std 0.19).
``electra``: ELECTRA-small (its default config: embeddings 128 wide projected to hidden 256), 4 layers, on the
shift task. HF draws ``embeddings_project`` at std 0.02 (initlint: IL006, its weight gradient 382x spread
against the first attention output's); the twin draws it at ``1 / sqrt(fan_in)`` (clean).
``aimv2``: AIMv2's default widths (vision 1024, text 768, projections to 768), one layer per tower, 56 x 56
images, on a matching task (:class:`Concepts`; CLIP's symmetric loss over batches of 16). HF's generic init
draws both projections at std 1 (its ``initializer_factor``), 32x and 28x their ``1 / sqrt(fan_in)``, and they
feed the L2 normalisation of the embeddings (initlint: IL006, the vision projection's weight gradient 1.3e3x
below the vision head's); the twin draws them at ``1 / sqrt(fan_in)``, as CLIP does.

``gemma4``: Gemma 4's text model at width 256, 4 layers (sliding and full attention alternating), its head width
256, on the copy task. Gemma 4 normalises each head's queries and keys (RMSNorm, weight 1) and scales the scores
by 1, not ``head_dim ** -0.5``: scores of std ``sqrt(256) = 16`` at init (initlint: IL011, mean entropy 0.07-0.09
of uniform's). The twin sets the query and key norm weights to ``256 ** -0.25``, scores of std 1.

``muse_glimmer``: Muse Glimmer's text model at width 256, 4 layers (three sliding, one full), head width 64, with a
Linear head, on the copy task. It normalises each head's queries and keys without a scale and multiplies the queries
by ``qk_scale_factor = 3.87`` on top of ``head_dim ** -0.5``: scores of std 3.87 at init, at any width (initlint:
IL011, mean entropy 0.31-0.37 of uniform's). The twin sets the factor to 1, scores of std 1.

``pp_lcnet_v4``: PP-LCNetV4 (PP-OCRv6's recognition backbone) at its default config, 13 blocks, its last stage
mean-pooled into a Linear, on the image classification task. Each block adds ``channel_conv2(gelu(channel_conv1(
s)))``, both convs behind a BatchNorm (rms 1), to the stream ``s = token_conv(x)``, a depthwise 3 x 3 conv: HF
draws it at std 0.02 (the stream 0.058, initlint: IL012, the branch 17x the stream), and so does, nearly,
PaddlePaddle's own Conv2D default, ``N(0, sqrt(2 / (9 * channels)))`` with the layer's channels rather than a
group's (0.024-0.048: IL012 too); ``published`` is that default. ``pp_lcnet_v4_fan_in``: He's normal over the true
fan-in of 9 instead (std 0.47: no IL012).

The task is synthetic and learnable: a fixed random teacher (two random convolutions with a ReLU)
labels each pixel (segformer) or each image (focalnet) with one of 8 classes; AdamW at lr 1e-3, batch
8, 64 x 64 images. Reported per run: the initlint findings at init (warnings), the loss at a few
steps and the first step whose 10-step mean loss is below ``--target`` x ln(8).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CLASSES = 8
VOCAB = 64  # the copy task's
AIM_VOCAB = 1000
CONCEPTS = 64
"""The matching task's pairs: each concept has an image prototype and a token sequence."""


def _to_fan_in(*layers: nn.Linear) -> None:
    """Redraw each layer's weight from N(0, 1 / fan_in)."""
    for layer in layers:
        nn.init.normal_(layer.weight, 0.0, layer.in_features ** -0.5)


def _reset(net: nn.Module, suffix: str = "", kind: type = nn.Module) -> None:
    """Each ``kind`` module whose name ends with ``suffix`` back at PyTorch's own init."""
    for name, m in net.named_modules():
        if isinstance(m, kind) and name.endswith(suffix) and hasattr(m, "reset_parameters"):
            m.reset_parameters()


def _mmseg_convs(net: nn.Module) -> None:
    """mmseg's init of SegFormer's backbone convolutions: normal(0, sqrt(2 / fan_out)), bias 0."""
    for m in net.segformer.modules():
        if isinstance(m, nn.Conv2d):
            fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def _paddle_convs(net: nn.Module, per_group: bool = False) -> None:
    """PaddlePaddle's own default for a Conv2D weight: normal(0, sqrt(2 / (k * k * in_channels))), the
    input channels of the whole layer, not of a group (so a depthwise 3 x 3 conv over 96 channels gets std
    0.048); ``per_group``: He's normal over the true fan-in ``k * k * in_channels / groups`` (0.47 for that
    depthwise conv). A bias 0."""
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            fan_in = m.in_channels // (m.groups if per_group else 1) * m.kernel_size[0] * m.kernel_size[1]
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_in))
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def _qk_norm_scale(net: nn.Module, scale: float) -> None:
    """Every attention's query and key norm weights at ``scale``: ``head_dim ** -0.25`` each puts the scores of
    an attention whose scale is 1 (Gemma 4's) at std 1, what ``head_dim ** -0.5`` would."""
    for name, m in net.named_modules():
        if name.endswith(("q_norm", "k_norm")) and getattr(m, "weight", None) is not None:
            nn.init.constant_(m.weight, scale)


class GlimmerLM(nn.Module):
    """Muse Glimmer's text model with a Linear head over the vocabulary: HF has no causal-LM class for it."""

    def __init__(self, tf) -> None:
        super().__init__()
        self.model = tf.MuseGlimmerTextModel(tf.MuseGlimmerTextConfig(
            vocab_size=VOCAB, hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, sliding_window=64, max_position_embeddings=256))
        self.head = nn.Linear(256, VOCAB, bias=False)
        nn.init.normal_(self.head.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.head(self.model(input_ids=input_ids).last_hidden_state))


def _qk_scale_factor(net: nn.Module, factor: float) -> None:
    """Muse Glimmer multiplies its unit-normalised queries by ``qk_scale_factor`` (3.87) on top of
    ``head_dim ** -0.5``: scores of std 3.87 at init; ``factor`` 1 puts them at std 1."""
    for m in net.modules():
        if hasattr(m, "qk_scale_factor"):
            m.qk_scale_factor = factor


class LCNetClassifier(nn.Module):
    """PP-LCNetV4 (PP-OCRv6's recognition backbone) at its default config, its last stage mean-pooled into a
    Linear over the classes: HF has no classification head for it."""

    def __init__(self, tf) -> None:
        super().__init__()
        self.backbone = tf.PPLCNetV4Backbone(tf.PPLCNetV4Config())
        self.head = nn.Linear(self.backbone.config.block_configs[-1][-1][2], CLASSES)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(pixel_values).feature_maps[-1].mean((2, 3)))


MODELS = {
    # name: (the model at Hugging Face's init, what the published code or the clean twin draws instead)
    "segformer": (lambda tf: tf.SegformerForSemanticSegmentation(tf.SegformerConfig(depths=[1, 1, 1, 1],
                                                                                    num_labels=CLASSES)),
                  _mmseg_convs),  # the head keeps HF's init
    "focalnet": (lambda tf: tf.FocalNetForImageClassification(tf.FocalNetConfig(depths=[1, 1, 1, 1],
                                                                                 num_labels=CLASSES)),
                 lambda net: _reset(net.focalnet, kind=nn.Conv2d)),  # FocalNet's code: PyTorch's default
    "lara_mini": (lambda tf: tf.LaraMiniForCausalLM(tf.LaraMiniConfig(
        vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, layer_types=["linear_attention", "full_attention"] * 2, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=256, shared_expert_intermediate_size=256,
        sliding_window=64, max_position_embeddings=256)),
        lambda net: _reset(net, kind=nn.Conv1d)),  # fla's ShortConvolution: nn.Conv1d's own init
    "falcon_h1": (lambda tf: tf.FalconH1ForCausalLM(tf.FalconH1Config(
        vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, intermediate_size=896, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_d_state=64, mamba_chunk_size=64,
        max_position_embeddings=256)),
        lambda net: _reset(net, kind=nn.Conv1d)),  # mamba_ssm's Mamba2: nn.Conv1d's own init
    "patchtsmixer": (lambda tf: tf.PatchTSMixerForPrediction(tf.PatchTSMixerConfig()),  # its default config
                     lambda net: _to_fan_in(*[m for n, m in net.named_modules()  # IL001's fix: the mixers' layers
                                              if isinstance(m, nn.Linear) and "mixers." in n])),
    "patchtsmixer_48": (lambda tf: tf.PatchTSMixerForPrediction(tf.PatchTSMixerConfig(  # a width the mixers matter at
        d_model=48, num_layers=4, expansion_factor=2)),
        lambda net: _to_fan_in(*[m for n, m in net.named_modules() if isinstance(m, nn.Linear) and "mixers." in n])),
    "patchtsmixer_io": (lambda tf: tf.PatchTSMixerForPrediction(tf.PatchTSMixerConfig()),
                        lambda net: _to_fan_in(*[m for n, m in net.named_modules()  # IL005's: patcher and head
                                                 if isinstance(m, nn.Linear) and ("patcher" in n or "head" in n)])),
    "gemma4": (lambda tf: tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(
        vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=256, intermediate_size=1024,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=256, global_head_dim=256,
        layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=64, hidden_size_per_layer_input=64,
        max_position_embeddings=256)),
        lambda net: _qk_norm_scale(net, 256 ** -0.25)),
    "muse_glimmer": (lambda tf: GlimmerLM(tf), lambda net: _qk_scale_factor(net, 1.0)),
    "pp_lcnet_v4": (lambda tf: LCNetClassifier(tf), _paddle_convs),
    "pp_lcnet_v4_fan_in": (lambda tf: LCNetClassifier(tf), lambda net: _paddle_convs(net, per_group=True)),
    "convbert": (lambda tf: tf.ConvBertForMaskedLM(tf.ConvBertConfig(vocab_size=VOCAB, num_hidden_layers=2,
                                                                     max_position_embeddings=128)),
                 lambda net: _reset(net, "key_conv_attn_layer.depthwise")),  # the clean twin: Conv1d's own init
    "electra": (lambda tf: tf.ElectraForMaskedLM(tf.ElectraConfig(vocab_size=VOCAB, num_hidden_layers=4,
                                                                  max_position_embeddings=128)),
                lambda net: _to_fan_in(net.electra.embeddings_project)),  # the clean twin
    "aimv2": (lambda tf: tf.Aimv2Model(tf.Aimv2Config(vision_config=dict(num_hidden_layers=1, image_size=56),
                                                      text_config=dict(num_hidden_layers=1, vocab_size=AIM_VOCAB))),
              lambda net: _to_fan_in(net.visual_projection, net.text_projection)),  # CLIP's
}


COPY = ("lara_mini", "falcon_h1", "gemma4", "muse_glimmer")
"""The models trained on the copy task."""


def build(model: str, init: str, seed: int) -> nn.Module:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(seed)
    make, published = MODELS[model]
    net = make(tf)
    if init == "published":
        torch.manual_seed(seed + 1000)
        published(net)
    elif init.startswith("x"):  # --mixer-scales: the mixers' Linears at that multiple of 1 / sqrt(fan_in)
        torch.manual_seed(seed + 1000)
        for name, m in net.named_modules():
            if isinstance(m, nn.Linear) and "mixers." in name:
                nn.init.normal_(m.weight, 0.0, float(init[1:]) * m.in_features ** -0.5)
    return net


class Teacher(nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(10_000 + seed)
        self.a = torch.randn(32, 3, 5, 5, generator=g) / math.sqrt(75)
        self.b = torch.randn(CLASSES, 32, 5, 5, generator=g) / math.sqrt(32 * 25)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.relu(F.conv2d(x, self.a, padding=2)), self.b, padding=2)


def copy_batch(gen: torch.Generator, size: int = 16) -> torch.Tensor:
    half = torch.randint(0, VOCAB, (size, 32), generator=gen)
    return torch.cat([half, half], dim=1)


class Concepts:
    """The matching task: :data:`CONCEPTS` concepts, each a 56 x 56 image prototype and 16 tokens; a batch
    pairs noisy images (noise std 1) with their concepts' tokens, a quarter of them replaced at random."""

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(20_000 + seed)
        self.images = torch.randn(CONCEPTS, 3, 56, 56, generator=g)
        self.texts = torch.randint(0, AIM_VOCAB, (CONCEPTS, 16), generator=g)

    def batch(self, gen: torch.Generator, size: int = 16):
        which = torch.randperm(CONCEPTS, generator=gen)[:size]
        images = self.images[which] + torch.randn(size, 3, 56, 56, generator=gen)
        texts = self.texts[which].clone()
        swap = torch.rand(texts.shape, generator=gen) < 0.25
        texts[swap] = torch.randint(0, AIM_VOCAB, (int(swap.sum()),), generator=gen)
        return {"input_ids": texts, "pixel_values": images}


def series_batch(gen: torch.Generator, size: int = 16) -> torch.Tensor:
    """The forecasting task: 48 steps of a sum of two sines of periods 6 and 11 steps, each of random amplitude
    and phase, plus noise of std 0.1 (a linear recurrence continues it); the first 32 are the context, the last 16
    the future to predict (mean squared error 1 for a guess of 0)."""
    t = torch.arange(48, dtype=torch.float32)
    period = torch.tensor([6.0, 11.0]).view(1, 2, 1)
    amplitude = torch.rand(size, 2, 1, generator=gen) * 2 ** 0.5 * 1.2247
    phase = 2 * math.pi * torch.rand(size, 2, 1, generator=gen)
    x = (amplitude * torch.sin(2 * math.pi * t / period + phase)).sum(1) + 0.1 * torch.randn(size, 48, generator=gen)
    return x.unsqueeze(-1)


def chirp_batch(gen: torch.Generator, size: int = 16) -> torch.Tensor:
    """``--task periods``: 48 steps of one sine whose period is drawn from 4 to 16 steps (random amplitude and
    phase, noise of std 0.05). No one linear map of the context continues every period: a forecaster has to
    read the period off the context, which the patcher and the head alone cannot."""
    t = torch.arange(48, dtype=torch.float32)
    period = 4 + 12 * torch.rand(size, 1, generator=gen)
    amplitude = 0.5 + 1.5 * torch.rand(size, 1, generator=gen)
    phase = 2 * math.pi * torch.rand(size, 1, generator=gen)
    x = amplitude * torch.sin(2 * math.pi * t / period + phase) + 0.05 * torch.randn(size, 48, generator=gen)
    return (x / 1.27).unsqueeze(-1)


def shift_batch(gen: torch.Generator, size: int = 16) -> torch.Tensor:
    return torch.randint(0, VOCAB, (size, 64), generator=gen)


def loss_of(model: str, net: nn.Module, teacher: Teacher, x: torch.Tensor) -> torch.Tensor:
    if model == "aimv2":  # CLIP's symmetric loss: each image names its own text among the batch's, and back
        logits = net(**x).logits_per_image
        labels = torch.arange(logits.shape[0])
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
    if model in ("convbert", "electra"):  # each position names the token before it (a bidirectional model sees both)
        logits = net(input_ids=x).logits[:, 1:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, :-1].reshape(-1))
    if model.startswith("patchtsmixer"):  # forecast the last 16 steps from the first 32 (mean squared error)
        return F.mse_loss(net(past_values=x[:, :32]).prediction_outputs, x[:, 32:])
    if model in COPY:  # predict the second half of each copy from what came before
        logits = net(input_ids=x).logits[:, 32:-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 33:].reshape(-1))
    scores = teacher(x)
    if model == "segformer":
        logits = net(pixel_values=x).logits  # (B, C, H/4, W/4)
        labels = F.adaptive_avg_pool2d(scores, logits.shape[-2:]).argmax(1)
        return F.cross_entropy(logits, labels)
    labels = scores.mean((2, 3)).argmax(1)
    if model.startswith("pp_lcnet_v4"):
        return F.cross_entropy(net(pixel_values=x), labels)
    return F.cross_entropy(net(pixel_values=x).logits, labels)


def mixer_share(net: nn.Module, x: torch.Tensor) -> float:
    """Falcon-H1: what the Mamba-2 mixers add to the residual stream over what the attentions add (rms, summed
    over the layers), on ``x``: how much of the token mixing the state-space half carries."""
    sums = {"mamba": 0.0, "self_attn": 0.0}
    hooks = []
    for layer in net.model.layers:
        for part in sums:
            def hook(_m, _i, out, part=part):
                out = out[0] if isinstance(out, tuple) else out
                sums[part] += float(out.detach().pow(2).mean().sqrt())
            hooks.append(getattr(layer, part).register_forward_hook(hook))
    try:
        with torch.no_grad():
            net(input_ids=x)
    finally:
        for h in hooks:
            h.remove()
    return sums["mamba"] / sums["self_attn"]


def run(model: str, init: str, seed: int, steps: int, target: float, lr: float = 1e-3, task: str = "sines"):
    import initlint

    net = build(model, init, seed)
    tokens = model in COPY + ("convbert", "electra")
    series = model.startswith("patchtsmixer")
    concepts = Concepts(seed) if model == "aimv2" else None
    series_batch_ = chirp_batch if task == "periods" else series_batch
    probe = series_batch_(torch.Generator().manual_seed(seed), 2)[:, :32] if series \
        else (copy_batch if model in COPY else shift_batch)(torch.Generator().manual_seed(seed), 2) if tokens \
        else concepts.batch(torch.Generator().manual_seed(seed), 2) if concepts is not None \
        else torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(seed))
    report = initlint.audit(net, probe)
    warnings = sorted({f.code for f in report.findings if f.severity != "info" and f.code != "IL014"})
    teacher = Teacher(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    losses, first = [], None
    chance = 1.0 if series else math.log(VOCAB if tokens else 16 if concepts is not None else CLASSES)
    share = [mixer_share(net, probe)] if model == "falcon_h1" else []
    net.train()
    for step in range(steps):
        x = series_batch_(gen, 32) if series else copy_batch(gen) if model in COPY else shift_batch(gen) if tokens else \
            concepts.batch(gen) if concepts is not None else torch.randn(8, 3, 64, 64, generator=gen)
        loss = loss_of(model, net, teacher, x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if first is None and step >= 9 and sum(losses[-10:]) / 10 < target * chance:
            first = step
    if share:
        share.append(mixer_share(net, probe))
        warnings = (warnings or ["clean"]) + [f"mamba/attn {share[0]:.3g} -> {share[1]:.3g}"]
    return warnings, losses, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="segformer")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--target", type=float, default=0.5)
    ap.add_argument("--task", choices=("sines", "periods"), default="sines",
                    help="patchtsmixer only: the series to forecast (series_batch, chirp_batch)")
    ap.add_argument("--mixer-scales", default="",
                    help="patchtsmixer only: instead of the two inits, the mixers' Linears at each of these "
                         "multiples of 1 / sqrt(fan_in) (comma-separated; Hugging Face's std 0.02 is 0.03-0.08 of it)")
    args = ap.parse_args()
    inits = [f"x{k}" for k in args.mixer_scales.split(",")] if args.mixer_scales else ["hf", "published"]
    torch.set_num_threads(1)
    print(f"{'init':10s} {'seed':>4s} {'warnings':18s} " + " ".join(f"{'loss@' + str(s):>9s}" for s in (0, 50, 100))
          + f" {'last10':>7s} {'first<' + str(args.target) + ('ln64' if args.model in COPY + ('convbert', 'electra') else 'ln16' if args.model == 'aimv2' else 'ln8'):>11s} {'s':>5s}")
    for seed in [int(s) for s in args.seeds.split(",")]:
        for init in inits:
            t0 = time.perf_counter()
            warnings, losses, first = run(args.model, init, seed, args.steps, args.target, args.lr, args.task)
            at = [losses[s] if s < len(losses) else float("nan") for s in (0, 50, 100)]
            print(f"{init:10s} {seed:4d} {','.join(warnings) or 'clean':18s} " + " ".join(f"{v:9.3f}" for v in at)
                  + f" {sum(losses[-10:]) / 10:7.3f} {str(first):>11s} {time.perf_counter() - t0:5.0f}", flush=True)


if __name__ == "__main__":
    main()
