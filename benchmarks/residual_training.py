"""How much training suffers when residual branches are scaled up at init (calibration of IL012).

    python benchmarks/residual_training.py [--scales 1,3,10,20,50] [--steps 250] [--seeds 0,1]
                                           [--norm pre,post] [--block N] [--half 32] [--batch 32]
                                           [--warmup N]

A small GPT (width 128, 4 blocks, 4 heads, causal ``F.scaled_dot_product_attention``,
GPT-2's init: every weight ``N(0, 0.02)``, output projections ``N(0, 0.02 / sqrt(2 * blocks))``)
learns a synthetic copy task: 32 random tokens out of 64, then the same 32 again; the loss is
the cross-entropy on the repeated half (``ln 64 = 4.16`` for a guess, 0 once the model copies,
which needs an induction head; ``--repeats 8`` repeats the 32 tokens 8 times, 255 tokens of input, the
loss on the last 7 copies). Before training, both output projections (attention and MLP)
of every block, or of block ``--block`` only, are multiplied by ``scale`` (``--branch mlp``: only the
MLP's, so that every MLP branch dwarfs the attention branches, as in hybrids whose first mixer adds little). For each scale, norm
placement (pre-LN: ``x + f(LN(x))``; post-LN: ``LN(x + f(x))``) and seed, the script trains
with AdamW (lr 1e-3, batch 32, fixed data order) and reports:

* ``loss``: the mean copy loss over the last 50 steps;
* ``steps<1``: the first step at which the running mean copy loss (over 20 steps) drops
  below 1.0 (``-`` when it never does);
* ``IL012``: initlint's verdict on the model at init, with the branch-to-stream ratios it
  measured (the first branch, and the largest of the others).

Training "measurably suffers" when the copy task is learnt later than by the unscaled model
(85-110 steps) or not at all, or its loss is clearly higher at the end.

Write-up of the results: docs/benchmarks.md ("Residual branches against training").
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import _common as C  # noqa: E402

VOCAB, HALF, WIDTH, BLOCKS, HEADS = 64, 32, 128, 4, 4


class Block(nn.Module):
    def __init__(self, width: int, heads: int, post_ln: bool) -> None:
        super().__init__()
        self.heads, self.post_ln = heads, post_ln
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.attn_proj = nn.Linear(width, width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def attn(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn_proj(y.transpose(1, 2).reshape(b, t, d))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_proj(F.gelu(self.c_fc(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.post_ln:
            x = self.ln_1(x + self.attn(x))
            return self.ln_2(x + self.mlp(x))
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class SmallGPT(nn.Module):
    def __init__(self, post_ln: bool = False, width: int = WIDTH, blocks: int = BLOCKS, heads: int = HEADS) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, width)
        self.wpe = nn.Embedding(max(2 * HALF, HALF * REPEATS, 64), width)
        self.h = nn.ModuleList(Block(width, heads, post_ln) for _ in range(blocks))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, VOCAB, bias=False)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * blocks) if name.endswith("_proj.weight") else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def scaled(model: SmallGPT, scale: float, only: Optional[int] = None, branch: str = "both") -> SmallGPT:
    """Output projections of every block (or of block ``only``) multiplied by ``scale``: both, or only the
    attention's (``branch="attn"``) or the MLP's (``"mlp"``)."""
    with torch.no_grad():
        for block in model.h if only is None else [model.h[only]]:
            if branch in ("both", "attn"):
                block.attn_proj.weight.mul_(scale)
            if branch in ("both", "mlp"):
                block.mlp_proj.weight.mul_(scale)
    return model


BATCH = 32


REPEATS = 2


def batch(gen: torch.Generator, size: Optional[int] = None) -> torch.Tensor:
    size = size or BATCH
    half = torch.randint(0, VOCAB, (size, HALF), generator=gen)
    return torch.cat([half] * REPEATS, dim=1)


def train(model: nn.Module, steps: int, seed: int, warmup: int = 0) -> list:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    # --warmup N: the lr rises linearly from lr / N to lr over the first N steps (BERT's and ALBERT's recipes)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warmup)) if warmup else None
    gen = torch.Generator().manual_seed(1000 + seed)
    losses = []
    for _ in range(steps):
        seq = batch(gen)
        logits = model(seq[:, :-1])
        # positions HALF-1 .. 2*HALF-2 predict the repeated half
        copy = logits[:, HALF - 1:]
        loss = F.cross_entropy(copy.reshape(-1, VOCAB), seq[:, HALF:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses


def first_below(losses: list, level: float = 1.0, window: int = 20) -> str:
    for i in range(window, len(losses) + 1):
        if sum(losses[i - window:i]) / window < level:
            return str(i)
    return "-"


def il012(model: nn.Module) -> str:
    """IL012's verdict at init, with the branch-to-stream ratios it judged (first branch; the others)."""
    import initlint
    from initlint.rules import Audit, all_rules
    from initlint.rules.base import measured, residual_adds
    from initlint.rules.il012_residual_growth import _scales

    if "IL012" not in all_rules():
        return "n/a"
    report = initlint.audit(model, batch(torch.Generator().manual_seed(0), 4)[:, :-1], select=["IL012"])
    audit = Audit(model=model, graph=report.graph, probe=report.probe)
    ratios = []
    for res in residual_adds(report.graph):
        stream, branch = measured(audit, res.stream), measured(audit, res.branch)
        s, b = _scales(audit.op_stats(stream), audit.op_stats(branch))  # as IL012 judges them
        ratios.append(b / s)
    found = [f for f in report.findings if f.code == "IL012"]
    judged = f"ratios {ratios[0]:.3g} (first branch), {max(ratios[1:]):.3g} (largest other)"
    return f"{len(report.codes())} finding(s); {judged}" if found else f"silent; {judged}"


def main() -> None:
    global HALF, BATCH, REPEATS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", default="1,3,10,20,50")
    parser.add_argument("--steps", type=int, default=250, help="0: only the IL012 verdict at init")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--norm", default="pre,post")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=0, help="linear lr warm-up over this many steps")
    parser.add_argument("--block", type=int, default=None, help="scale only this block's projections")
    parser.add_argument("--branch", choices=("both", "attn", "mlp"), default="both",
                        help="which output projections to scale (mlp: every MLP branch larger than the attention's, "
                             "as in a hybrid whose mixer adds little at init)")
    parser.add_argument("--half", type=int, default=HALF, help="tokens to copy (a sequence has twice as many)")
    parser.add_argument("--batch", type=int, default=BATCH, help="sequences per step")
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help="the random tokens repeated this many times (8: 256 tokens, loss on the last 7 copies)")
    opts = parser.parse_args()
    HALF, BATCH, REPEATS = opts.half, opts.batch, opts.repeats
    C.set_threads(opts.threads)
    scales = [float(s) for s in opts.scales.split(",")]
    seeds = [int(s) for s in opts.seeds.split(",")]
    print(f"machine: {C.machine()}")
    print(f"code: {C.revision()}")
    print(f"warm-up: {opts.warmup} steps")
    print(f"sequence: {REPEATS * HALF - 1} tokens ({HALF} random tokens, {REPEATS} times), batch {BATCH}")
    rows = []
    for norm in opts.norm.split(","):
        for scale in scales:
            finals, reached = [], []
            start = time.time()
            for seed in seeds:
                torch.manual_seed(seed)
                model = scaled(SmallGPT(post_ln=norm == "post"), scale, opts.block, opts.branch)
                if seed == seeds[0]:
                    found = il012(model)
                if not opts.steps:
                    break
                losses = train(model, opts.steps, seed, opts.warmup)
                finals.append(statistics.mean(losses[-50:]))
                reached.append(first_below(losses))
            if not finals:
                print(f"  {norm}-LN x{scale:g}: IL012 {found}", flush=True)
                continue
            spread = f" +- {statistics.stdev(finals):.2f}" if len(finals) > 1 else ""
            rows.append([f"{norm}-LN", f"x{scale:g}" + ("" if opts.block is None else f" (block {opts.block})")
                         + ("" if opts.branch == "both" else f" ({opts.branch} only)"), f"{statistics.mean(finals):.3f}{spread}", ", ".join(reached),
                         found])
            print(f"  {norm}-LN x{scale:g}: loss {statistics.mean(finals):.3f}{spread}, steps<1 {reached}, "
                  f"IL012 {found} ({time.time() - start:.0f} s)", flush=True)
    print()
    print(f"Copy-task loss (ln 64 = 4.16 for a guess) after {opts.steps} steps, mean over seeds {opts.seeds}.")
    print()
    print(C.table(["norm", "output projections", f"loss@{opts.steps} (last 50)", "steps<1 per seed", "IL012 at init"],
                  rows))


if __name__ == "__main__":
    main()
