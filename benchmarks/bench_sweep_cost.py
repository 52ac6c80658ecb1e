"""What a sweep costs: ``initlint.sweep`` of a small GPT over 4 widths x 3 Adam steps, and the picture.

    python benchmarks/bench_sweep_cost.py [--widths 64,128,256,512] [--steps 3] [--threads 1] [--plot docs/sweep.png]

The GPT is nanoGPT's shape at its fixed init (every weight N(0, 0.02)): 2 pre-LN blocks, 4 heads
(the head width grows with ``d_model``), attention through ``scaled_dot_product_attention``, a
65-token vocabulary, the probe batch 16 x 32 tokens. Printed: wall time and CPU time (user +
system, which other jobs on a shared machine disturb much less) of the whole sweep, per build, the
parameter count of the largest build, and the findings. With ``--plot`` the coordinate curves are
saved (the picture in docs/).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import initlint  # noqa: E402


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d_model)
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        self.ln_2 = nn.LayerNorm(d_model)
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.mlp_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, d_model: int = 64, n_layer: int = 2, n_head: int = 4, vocab: int = 65, block: int = 32) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(block, d_model)
        self.h = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def small_gpt(d_model: int = 64, n_layer: int = 2) -> GPT:
    """nanoGPT's fixed 0.02 init at every width."""
    return GPT(d_model, n_layer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="64,128,256,512")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    widths = [int(w) for w in args.widths.split(",")]
    times = []
    last = [time.perf_counter()]

    def progress(done: int, total: int, label: str) -> None:
        now = time.perf_counter()
        times.append((label, now - last[0]))
        last[0] = now

    cpu, wall = time.process_time(), time.perf_counter()
    report = initlint.sweep(small_gpt, width={"d_model": widths}, steps=args.steps, progress=progress)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    axis = report.data.axis("width")
    print(f"sweep of small_gpt: {len(widths)} widths x {args.steps} steps, {args.threads} thread(s): "
          f"wall {wall:.1f} s, cpu {cpu:.1f} s")
    print("per build (wall): " + ", ".join(f"{label} {seconds:.1f} s" for label, seconds in times))
    print(f"largest build: {max(axis.params.values()):,} parameters")
    for f in report.findings:
        print(f"  {f.code} {f.module}: {f.message}")
    if args.plot:
        report.plot(args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
