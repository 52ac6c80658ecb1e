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


def build(model: str, init: str, seed: int) -> nn.Module:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(seed)
    if model == "lara_mini":
        net = tf.LaraMiniForCausalLM(tf.LaraMiniConfig(
            vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, layer_types=["linear_attention", "full_attention"] * 2, linear_key_head_dim=64,
            linear_value_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=256, shared_expert_intermediate_size=256,
            sliding_window=64, max_position_embeddings=256))
        if init == "published":
            torch.manual_seed(seed + 1000)
            for m in net.modules():
                if isinstance(m, nn.Conv1d):  # fla's ShortConvolution: nn.Conv1d's own init
                    m.reset_parameters()
        return net
    if model == "segformer":
        net = tf.SegformerForSemanticSegmentation(tf.SegformerConfig(depths=[1, 1, 1, 1], num_labels=CLASSES))
    else:
        net = tf.FocalNetForImageClassification(tf.FocalNetConfig(depths=[1, 1, 1, 1], num_labels=CLASSES))
    if init == "published":
        torch.manual_seed(seed + 1000)
        backbone = net.segformer if model == "segformer" else net.focalnet  # the heads keep HF's init
        for m in backbone.modules():
            if isinstance(m, nn.Conv2d):
                if model == "segformer":  # mmseg: normal(0, sqrt(2 / fan_out)), bias 0
                    fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                    nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                else:  # FocalNet's code: PyTorch's default
                    m.reset_parameters()
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


def loss_of(model: str, net: nn.Module, teacher: Teacher, x: torch.Tensor) -> torch.Tensor:
    if model == "lara_mini":  # predict the second half of each copy from what came before
        logits = net(input_ids=x).logits[:, 32:-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 33:].reshape(-1))
    scores = teacher(x)
    if model == "segformer":
        logits = net(pixel_values=x).logits  # (B, C, H/4, W/4)
        labels = F.adaptive_avg_pool2d(scores, logits.shape[-2:]).argmax(1)
        return F.cross_entropy(logits, labels)
    labels = scores.mean((2, 3)).argmax(1)
    return F.cross_entropy(net(pixel_values=x).logits, labels)


def run(model: str, init: str, seed: int, steps: int, target: float, lr: float = 1e-3):
    import initlint

    net = build(model, init, seed)
    probe = copy_batch(torch.Generator().manual_seed(seed), 2) if model == "lara_mini" else \
        torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(seed))
    report = initlint.audit(net, probe)
    warnings = sorted({f.code for f in report.findings if f.severity != "info" and f.code != "IL014"})
    teacher = Teacher(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    losses, first = [], None
    net.train()
    for step in range(steps):
        x = copy_batch(gen) if model == "lara_mini" else torch.randn(8, 3, 64, 64, generator=gen)
        loss = loss_of(model, net, teacher, x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if first is None and step >= 9 and sum(losses[-10:]) / 10 < target * math.log(VOCAB if model == "lara_mini"
                                                                                      else CLASSES):
            first = step
    return warnings, losses, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["segformer", "focalnet", "lara_mini"], default="segformer")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--target", type=float, default=0.5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'init':10s} {'seed':>4s} {'warnings':18s} " + " ".join(f"{'loss@' + str(s):>9s}" for s in (0, 50, 100))
          + f" {'last10':>7s} {'first<' + str(args.target) + ('ln64' if args.model == 'lara_mini' else 'ln8'):>11s} {'s':>5s}")
    for seed in [int(s) for s in args.seeds.split(",")]:
        for init in ("hf", "published"):
            t0 = time.perf_counter()
            warnings, losses, first = run(args.model, init, seed, args.steps, args.target, args.lr)
            at = [losses[s] if s < len(losses) else float("nan") for s in (0, 50, 100)]
            print(f"{init:10s} {seed:4d} {','.join(warnings) or 'clean':18s} " + " ".join(f"{v:9.3f}" for v in at)
                  + f" {sum(losses[-10:]) / 10:7.3f} {str(first):>11s} {time.perf_counter() - t0:5.0f}", flush=True)


if __name__ == "__main__":
    main()
