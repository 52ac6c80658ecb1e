"""Autoformer at Hugging Face's init against the init of its published code, trained briefly on a forecast.

    python benchmarks/autoformer_training.py --seeds 0,1,2

``AutoformerForPrediction`` (its default widths: d_model 64, two encoder layers and one decoder layer) forecasts
the next 16 steps of two sines (periods 6 and 11, random amplitudes and phases, noise of std 0.1) from the 32
before them, by its own loss (the negative log-likelihood of its Student-t output). Hugging Face's init draws
every Linear and Conv1d from N(0, ``init_std`` 0.02); the published code (thuml/Autoformer) leaves them at
PyTorch's default, ``reset_parameters``, which the twin restores (initlint then reports IL014 on it: the weights
are not the ones its ``_init_weights`` declares, as intended). AdamW at lr 1e-3, batch 32, 400 steps. Reported:
the warnings at init (the probe: 2 series), the training loss around steps 0, 100 and 200, over the last 10
steps, and the loss on 256 held-out series after training.
"""
from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn as nn

HORIZON, CONTEXT = 16, 32


def build(init: str, seed: int) -> nn.Module:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(seed)
    model = tf.AutoformerForPrediction(tf.AutoformerConfig(prediction_length=HORIZON, context_length=CONTEXT,
                                                           lags_sequence=[1], label_length=8))
    if init == "published":
        torch.manual_seed(seed + 1000)
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv1d)):
                module.reset_parameters()
    return model


def series(gen: torch.Generator, size: int) -> torch.Tensor:
    t = torch.arange(CONTEXT + 1 + HORIZON, dtype=torch.float32)
    period = torch.tensor([6.0, 11.0]).view(1, 2, 1)
    amplitude = torch.rand(size, 2, 1, generator=gen) * 1.7
    phase = 2 * math.pi * torch.rand(size, 2, 1, generator=gen)
    return (amplitude * torch.sin(2 * math.pi * t / period + phase)).sum(1) + 0.1 * torch.randn(size, t.numel(), generator=gen)


def inputs(x: torch.Tensor) -> dict:
    """The context (one lag more than ``CONTEXT``), no time features, all observed, and the future to predict."""
    n, past = x.shape[0], CONTEXT + 1
    return dict(past_values=x[:, :past], past_time_features=torch.zeros(n, past, 0), past_observed_mask=torch.ones(n, past),
                future_values=x[:, past:], future_time_features=torch.zeros(n, HORIZON, 0))


def run(init: str, seed: int, steps: int):
    import initlint

    model = build(init, seed)
    report = initlint.audit(model, inputs(series(torch.Generator().manual_seed(seed), 2)))
    warnings = sorted({f.code for f in report.findings if f.severity != "info"})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen, losses = torch.Generator().manual_seed(seed), []
    model.train()
    for _ in range(steps):
        loss = model(**inputs(series(gen, 32))).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    with torch.no_grad():
        held_out = float(model(**inputs(series(torch.Generator().manual_seed(999), 256))).loss)
    return warnings, losses, held_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'init':10s} {'seed':>4s} {'warnings':14s} {'loss@0':>7s} {'@100':>7s} {'@200':>7s} {'last10':>7s} {'held-out':>8s} {'s':>4s}")
    for seed in [int(s) for s in args.seeds.split(",")]:
        for init in ("hf", "published"):
            t0 = time.perf_counter()
            warnings, losses, held_out = run(init, seed, args.steps)
            near = [sum(losses[max(0, s - 5):s + 5]) / len(losses[max(0, s - 5):s + 5]) for s in (100, 200)]
            print(f"{init:10s} {seed:4d} {','.join(warnings) or 'clean':14s} {losses[0]:7.3f} {near[0]:7.3f} {near[1]:7.3f} "
                  f"{sum(losses[-10:]) / 10:7.3f} {held_out:8.3f} {time.perf_counter() - t0:4.0f}", flush=True)


if __name__ == "__main__":
    main()
