"""IL011's verdict on one set of weights at several probe lengths.

    python benchmarks/attention_lengths.py [--stds 2.2,2.5,2.8,3.1] [--lengths 16,64,512,2048]

One attention layer (8 heads of 32, SDPA, causal and not) whose q and k have unit rms and whose scale
makes the scores' std the one asked for, audited on one sequence of each length (``initlint.audit(...,
select=["IL011"])``). Per std and mask, the table gives each length's mean row entropy (x ln(admissible
keys)) and whether IL011 flagged it: a verdict that changes along a row changes with the probe's length.
Write-up: docs/benchmarks.md ("IL011 at any length").
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's initlint

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class ScoresOfStd(nn.Module):
    """One attention whose scores have about the std asked for at any length: q and k of unit rms (weights
    at 1/sqrt(fan_in) on a unit input), the scale ``std / sqrt(head_dim)``; SDPA, or written out."""

    def __init__(self, std: float, causal: bool, sdpa: bool = True, dim: int = 256, heads: int = 8,
                 dim_head: int = 32):
        super().__init__()
        self.heads, self.causal, self.sdpa, self.scale = heads, causal, sdpa, std / dim_head ** 0.5
        self.qk = nn.Linear(dim, 2 * heads * dim_head, bias=False)
        nn.init.normal_(self.qk.weight, std=dim ** -0.5)

    def forward(self, x):
        q, k = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in self.qk(x).chunk(2, dim=-1))
        if self.sdpa:
            return F.scaled_dot_product_attention(q, k, k, is_causal=self.causal, scale=self.scale)
        sim = q @ k.transpose(-1, -2) * self.scale
        if self.causal:
            sim = sim.masked_fill(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1), float("-inf"))
        return sim.softmax(dim=-1) @ k


def main() -> None:
    import initlint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stds", default="2.2,2.5,2.8,3.1")
    parser.add_argument("--lengths", default="16,64,512,2048")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    print("| scores' std | mask | " + " | ".join(f"{n} tokens" for n in lengths) + " |")
    print("|---|---|" + "---|" * len(lengths))
    for std in (float(s) for s in args.stds.split(",")):
        for causal in (False, True):
            torch.manual_seed(0)
            model, cells = ScoresOfStd(std, causal), []
            for n in lengths:
                x = torch.randn(1, n, 256, generator=torch.Generator().manual_seed(1))
                report = initlint.audit(model, x, select=["IL011"])
                op = next(o for o in report.graph if o.kind == "attention")
                entropy = report.probe.ops[op.id]["entropy"]
                flagged = [f for f in report.findings if f.code == "IL011"]
                cells.append(f"{entropy:.3f} " + (f"**IL011** (limit {flagged[0].threshold:.3f})" if flagged
                                                  else "clean"))
            print(f"| {std} | {'causal' if causal else 'none'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
