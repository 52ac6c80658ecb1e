"""Calibration of IL017 precision-headroom: does an fp16 finding come before fp16 training trouble?

    nice -n 10 python benchmarks/bench_precision.py [--seeds 0,1,2] [--steps 100] [--out benchmarks/results/precision.md]

A small classifier (64 -> 256 -> ReLU -> 32 -> LayerNorm -> ReLU -> 10; the 32-wide layer is narrow
enough that the earlier layers must learn: with them frozen the loss ends near 1.5 instead of 0.1)
learns the labels of a fixed random teacher MLP (512 samples, batches of 64, Adam lr 1e-3, and 1e-2
for a second ``act`` series, whose weights and activations grow faster). The
model computes its own loss (``loss_weight * cross_entropy``, returned with the logits, as Hugging
Face models do when given labels), so the audit's backward pass differentiates the loss training
uses. Each init trains for ``--steps`` steps three ways from the same init and data order: in
float32, under fp16 ``torch.autocast`` without a loss scaler, and with ``torch.amp.GradScaler()``.
Three families of inits:

* ``act=F``: the inputs (training data and probe batch alike) are multiplied by ``a`` so that the
  largest activation on the probe batch is the fraction ``F`` of float16's 65504: unnormalised
  features, raw pixel values; the layers before the norm carry the scale, the norm takes it out
  (as T5's FFN output is tamed by the next norm), and float32 training is unaffected;
* ``head=S``: the output layer's weight times ``S`` (the gradients of every earlier layer shrink
  by ``S`` until Adam grows the head);
* ``loss=W``: the loss weight ``W`` (a term of a weighted multi-task loss, a mean over very many
  outputs): every gradient shrinks by ``W`` for good.

A second table checks the bfloat16 residual check: a pre-norm residual MLP (4 blocks of width 64)
stored in bfloat16 (pure bf16 training, no float32 master weights) with its branch ends scaled by
``S``, against the same model in float32; IL017 is asked with ``precision="bf16"``.

Trouble for an fp16 run: a non-finite loss at any step, the scaler skipping more than half the
steps, or less than half the float32 run's progress (the cross-entropy of the first step minus the
mean of the last 10). The audit of each init (``initlint.audit(model, (x, labels), precision="fp16",
grad_scaler=...)``) gives IL017's verdict at the default options, and the raw measurements (the
largest fp16 activation over 65504, the largest share of a weight's gradient lost to underflow)
from which the table of candidate thresholds is computed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import initlint  # noqa: E402
from initlint.capture import BACKENDS  # noqa: E402
from initlint.probe.guard import guarded  # noqa: E402
from initlint.probe.precision import run_precision_probe  # noqa: E402
from initlint.probe.run import run_probe  # noqa: E402

FP16 = 65504.0
FAMILIES = (("act", (1 / 64, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 0.6, 0.7, 0.8, 0.9, 2.0), 1e-3),
            ("act", (1 / 16, 1 / 8, 1 / 4, 1 / 2, 0.7), 1e-2),
            ("head", (1.0, 1e-2, 1e-4, 1e-6), 1e-3),
            ("loss", (1.0, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6), 1e-3))
HEADROOMS = (1.0, 1.25, 1.5, 2.0, 4.0, 8.0)
FLUSHES = (0.01, 0.1, 0.25, 0.5, 0.9)


class Classifier(nn.Module):
    """The MLP, returning ``{"loss": loss_weight * cross_entropy, "logits": ...}`` when given labels."""

    def __init__(self, loss_weight: float = 1.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 32), nn.LayerNorm(32), nn.ReLU(),
                                 nn.Linear(32, 10))
        self.loss_weight = loss_weight

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> Dict[str, torch.Tensor]:
        logits = self.net(x)
        return {"loss": self.loss_weight * F.cross_entropy(logits.float(), labels), "logits": logits}


def task(seed: int):
    """Inputs, the teacher's labels, and a probe batch with its labels."""
    gen = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(576, 64, generator=gen)
    hidden, out = torch.randn(64, 32, generator=gen), torch.randn(32, 10, generator=gen)
    y = (torch.relu(x @ hidden) @ out).argmax(-1)
    return x[:512], y[:512], (x[512:], y[512:])


def peak_activation(model: Classifier, x: torch.Tensor) -> float:
    with torch.no_grad():
        h1 = model.net[0](x)
        h2 = model.net[2](model.net[1](h1))
        return max(float(h1.abs().max()), float(h2.abs().max()))


def init_for(kind: str, value: float, seed: int, probe: torch.Tensor) -> Tuple[Classifier, float]:
    """The model and the factor its inputs are multiplied by."""
    torch.manual_seed(seed)
    model = Classifier(value if kind == "loss" else 1.0)
    scale = 1.0
    with torch.no_grad():
        if kind == "act":
            scale = value * FP16 / peak_activation(model, probe)
        elif kind == "head":
            model.net[5].weight.mul_(value)
    return model, scale


def train(model: nn.Module, data, mode: str, steps: int, seed: int, scale: float, lr: float) -> Dict[str, float]:
    x, y, _ = data
    x = x * scale
    weight = model.loss_weight
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu") if mode == "fp16+scaler" else None
    gen = torch.Generator().manual_seed(seed)
    losses: List[float] = []
    skipped = 0
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (64,), generator=gen)
        with torch.autocast("cpu", dtype=torch.float16, enabled=mode != "fp32"):
            loss = model(x[idx], y[idx])["loss"]
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()) / weight)
        if scaler is not None:
            before = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            skipped += scaler.get_scale() < before
        else:
            loss.backward()
            opt.step()
    final = sum(losses[-10:]) / 10
    return {"first": losses[0], "final": final, "finite": all(math.isfinite(v) for v in losses),
            "skipped": skipped / steps}


def trouble(run: Dict[str, float], reference: Dict[str, float]) -> bool:
    progress = reference["first"] - reference["final"]
    return (not run["finite"] or run["skipped"] > 0.5 or not math.isfinite(run["final"])
            or run["first"] - run["final"] < 0.5 * progress)


def measure(model: nn.Module, probe, grad_scaler: bool) -> Tuple[float, float, bool]:
    """(largest fp16 activation / 65504, largest share of a weight's gradient lost, overflow) of the precision probe."""
    args = tuple(probe)
    with guarded(model, 0, (args, {})):
        cap = BACKENDS["fx"](model)
        run_probe(cap, args, {}, logits=True, backward=False)
    with guarded(model, 0, (args, {})):
        stats = run_precision_probe(cap, args, {}, "fp16", grad_scaler=grad_scaler, logits=True)
    half = [r for r in stats.ops.values() if r.dtype == "float16"]
    overflow = any(not r.finite for r in half)
    peak = max((r.absmax for r in half if r.finite), default=0.0) / FP16
    share = max((w.share for w in stats.weights.values()), default=0.0)
    return peak, share, overflow


def rows(seeds: List[int], steps: int) -> List[Dict]:
    out = []
    for kind, values, lr in FAMILIES:
        for value in values:
            for seed in seeds:
                data = task(seed)
                probe = data[2]
                model, scale = init_for(kind, value, seed, probe[0])
                reference = train(model, data, "fp32", steps, seed, scale, lr)
                probe = (probe[0] * scale, probe[1])
                for mode in ("fp16", "fp16+scaler"):
                    scaler = mode == "fp16+scaler"
                    model, _ = init_for(kind, value, seed, data[2][0])
                    report = initlint.audit(model, tuple(probe), precision="fp16", grad_scaler=scaler,
                                            select=["IL017"])
                    found = [f for f in report.findings if f.code == "IL017"]
                    peak, share, overflow = measure(model, probe, scaler)
                    run = train(model, data, mode, steps, seed, scale, lr)
                    out.append(dict(case=f"{kind}={value:.3g}" + (f", lr {lr:g}" if lr != 1e-3 else ""), seed=seed, mode=mode, flagged=bool(found),
                                    what=",".join(sorted({f.severity for f in found})), peak=peak, share=share,
                                    overflow=overflow, trouble=trouble(run, reference), fp32=reference["final"],
                                    final=run["final"], skipped=run["skipped"]))
                    print(out[-1], flush=True)
    return out


def outcome(flags: List[bool], troubles: List[bool]) -> str:
    hit = sum(f and t for f, t in zip(flags, troubles))
    flagged = sum(flags)
    clean = len(flags) - flagged
    missed = sum((not f) and t for f, t in zip(flags, troubles))
    precision = f"{hit}/{flagged} ({100 * hit / flagged:.0f}%)" if flagged else "-"
    recall = f"; recall {hit}/{hit + missed}" if hit + missed else ""
    return (f"flagged {flagged}: trouble after {precision}; clean {clean}: trouble after {missed}/{clean}{recall}"
            if clean else f"flagged {flagged}: trouble after {precision}{recall}")


def table(out: List[Dict]) -> str:
    lines = ["| init | mode | seeds | IL017 (default) | fp16 peak / 65504 | max flushed share | trouble | "
             "final loss fp16 (fp32) | steps skipped |", "|---|---|---|---|---|---|---|---|---|"]
    cases = list(dict.fromkeys((r["case"], r["mode"]) for r in out))
    for case, mode in cases:
        rs = [r for r in out if r["case"] == case and r["mode"] == mode]
        verdict = ", ".join(sorted({r["what"] or "clean" for r in rs}))
        peak = "overflow" if all(r["overflow"] for r in rs) else f"{max(r['peak'] for r in rs):.3g}"
        lines.append(f"| {case} | {mode} | {len(rs)} | {verdict} | {peak} | {max(r['share'] for r in rs):.3g} | "
                     f"{sum(r['trouble'] for r in rs)}/{len(rs)} | "
                     f"{sum(r['final'] for r in rs) / len(rs):.3g} ({sum(r['fp32'] for r in rs) / len(rs):.3g}) | "
                     f"{max(r['skipped'] for r in rs):.2f} |")
    troubles = [r["trouble"] for r in out]
    lines += ["", f"Default options: {outcome([r['flagged'] for r in out], troubles)}.", "",
              "Candidate thresholds (a run is flagged when it overflows, when its largest fp16 activation is above "
              "65504 / headroom, or, without a scaler, when a weight loses more than `flush` of its gradient; with a "
              "scaler the flushed share is judged at scale 65536):", "",
              "| headroom | flush | outcome |", "|---|---|---|"]
    for headroom in HEADROOMS:
        for flush in FLUSHES:
            flags = [r["overflow"] or r["peak"] >= 1 / headroom or r["share"] > flush for r in out]
            lines.append(f"| {headroom:g} | {flush:g} | {outcome(flags, troubles)} |")
    return "\n".join(lines)


class Residual(nn.Module):
    """Pre-norm residual MLP: ``x + fc2(relu(fc1(LN(x))))`` four times, branch ends times ``branch``."""

    def __init__(self, branch: float) -> None:
        super().__init__()
        self.inp = nn.Linear(64, 64)
        self.fc1 = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
        self.fc2 = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
        self.out = nn.Linear(64, 10)
        with torch.no_grad():
            for fc in self.fc2:
                fc.weight.mul_(branch)
                fc.bias.mul_(branch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for fc1, fc2 in zip(self.fc1, self.fc2):
            x = x + fc2(torch.relu(fc1(F.layer_norm(x, x.shape[-1:]))))
        return self.out(F.layer_norm(x, x.shape[-1:]))


def bf16_residual_rows(seeds: List[int], steps: int) -> List[Dict]:
    out = []
    for branch in (1.0, 1e-2, 1e-3, 1e-4, 1e-6):
        for seed in seeds:
            x, y, probe = task(seed)
            finals = {}
            for dtype in (torch.float32, torch.bfloat16):
                torch.manual_seed(seed)
                model = Residual(branch).to(dtype)
                if dtype == torch.bfloat16:
                    report = initlint.audit(model, probe[0].to(dtype), precision="bf16", select=["IL017"])
                    flagged = any(f.code == "IL017" for f in report.findings)
                opt = torch.optim.Adam(model.parameters(), lr=1e-3)
                gen = torch.Generator().manual_seed(seed)
                losses = []
                for _ in range(steps):
                    idx = torch.randint(0, x.shape[0], (64,), generator=gen)
                    loss = F.cross_entropy(model(x[idx].to(dtype)).float(), y[idx])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    losses.append(float(loss.detach()))
                finals[dtype] = (losses[0], sum(losses[-10:]) / 10)
            (first32, end32), (first16, end16) = finals[torch.float32], finals[torch.bfloat16]
            out.append(dict(branch=branch, seed=seed, flagged=flagged, fp32=end32, bf16=end16,
                            trouble=not math.isfinite(end16) or first16 - end16 < 0.5 * (first32 - end32)))
            print(out[-1], flush=True)
    return out


def bf16_table(out: List[Dict]) -> str:
    lines = ["| branch ends x | seeds | IL017 (bf16) | trouble | final loss pure bf16 (fp32) |", "|---|---|---|---|---|"]
    for branch in dict.fromkeys(r["branch"] for r in out):
        rs = [r for r in out if r["branch"] == branch]
        lines.append(f"| {branch:g} | {len(rs)} | {sum(r['flagged'] for r in rs)}/{len(rs)} flagged | "
                     f"{sum(r['trouble'] for r in rs)}/{len(rs)} | {sum(r['bf16'] for r in rs) / len(rs):.3g} "
                     f"({sum(r['fp32'] for r in rs) / len(rs):.3g}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "precision.md"))
    opts = parser.parse_args()
    torch.set_num_threads(1)
    start = time.time()
    seeds = [int(s) for s in opts.seeds.split(",")]
    out = rows(seeds, opts.steps)
    residual = bf16_residual_rows(seeds, opts.steps)
    text = (f"# IL017 precision-headroom against fp16 training\n\n`python benchmarks/bench_precision.py "
            f"--seeds {opts.seeds} --steps {opts.steps}` ({time.time() - start:.0f} s, torch {torch.__version__}, "
            f"one thread)\n\n" + table(out) + "\n\n## bfloat16 residual branches (pure bf16 training)\n\n"
            + bf16_table(residual) + "\n")
    os.makedirs(os.path.dirname(opts.out), exist_ok=True)
    with open(opts.out, "w") as fh:
        fh.write(text)
    with open(os.path.splitext(opts.out)[0] + ".json", "w") as fh:
        json.dump({"fp16": out, "bf16_residual": residual}, fh, indent=1)
    print(text)


if __name__ == "__main__":
    main()
