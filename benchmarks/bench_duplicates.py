"""What the exact duplicate-unit check (IL008) costs on a vocabulary-sized output layer.

    python benchmarks/bench_duplicates.py [--rows 150000] [--width 1024] [--repeats 5] [--threads 1]

An output layer ``Linear(width, rows)`` at ``N(0, 0.02)``, as a language model's head over a
150k-token vocabulary. Measured interleaved in one process (median after a warm-up):

* ``exact check``: the probe's duplicate-unit statistic as the audit computes it (two keys
  per unit from one matrix product, one sort of their bits, the neighbour comparison) and the
  host-side confirmation, which finds no candidate and so costs nothing;
* ``all parameter statistics``: everything the probe computes on the head's parameters (norm,
  extremes, bias mean and the exact check);
* ``exact check, 100 copies``: the same head with 100 units copied from others: the
  candidates are compared in full with their bias (one host sync);
* ``one projection``: the earlier statistic (one float32 projection per unit, sorted, equal
  neighbours counted), which at this size reports chance collisions as copies;
* ``head fwd+bwd``: the head's own forward and backward for a batch of 8 x 64 positions,
  for scale.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import _common as C  # noqa: E402
from initlint.probe.duplicates import Units, _duplicate_rows, confirm_duplicates  # noqa: E402
from initlint.probe.run import ProbeResult, _Collector, _param_stats  # noqa: E402


def weight_stats(weight: torch.Tensor, bias: torch.Tensor) -> None:
    """Everything the probe computes on the head's parameters (norm, extremes, bias mean, duplicates)."""
    c = _Collector()
    _param_stats(c, [("head.weight", weight), ("head.bias", bias)], {"head.weight": Units("out_in", bias)})
    result = ProbeResult()
    c.finish(result)
    confirm_duplicates(c, result)


def exact(weight: torch.Tensor, bias: torch.Tensor) -> float:
    """The duplicate-unit statistic alone: keys, sort, candidates, confirmation."""
    c = _Collector()
    c.units = {"head.weight": Units("out_in", bias)}
    c.longest_row = 2 * (weight.shape[1] + 1)
    _duplicate_rows(c, "params", "head.weight", weight)
    result = ProbeResult()
    c.finish(result)
    confirm_duplicates(c, result)
    return result.params["head.weight"]["dup_rows"]


def one_projection(weight: torch.Tensor) -> float:
    direction = torch.rand(weight.shape[1], generator=torch.Generator().manual_seed(0)) + 0.5
    proj = (weight @ direction).sort().values
    return float((proj[1:] == proj[:-1]).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=150000)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args()
    C.set_threads(opts.threads)
    torch.manual_seed(0)
    head = nn.Linear(opts.width, opts.rows)
    nn.init.normal_(head.weight, std=0.02)
    nn.init.zeros_(head.bias)
    weight, bias = head.weight.detach(), head.bias.detach()
    copied = weight.clone()
    picks = torch.randperm(opts.rows, generator=torch.Generator().manual_seed(1))[:200]
    copied[picks[:100]] = copied[picks[100:]]
    hidden = torch.randn(8, 64, opts.width)

    def fwd_bwd() -> None:
        out = head(hidden)
        torch.autograd.grad([out], [head.weight, head.bias], [torch.ones_like(out)])

    print(f"machine: {C.machine()}")
    print(f"code: {C.revision()}")
    print(f"head: Linear({opts.width}, {opts.rows}), N(0, 0.02) weights, zero bias")
    print(f"copies found: exact {exact(weight, bias):g}, exact with 100 copies {exact(copied, bias):g}, "
          f"one projection {one_projection(weight):g} (every row of the head is distinct)")
    t = C.interleaved_medians({"exact check": lambda: exact(weight, bias),
                               "all parameter statistics": lambda: weight_stats(weight, bias),
                               "exact check, 100 copies": lambda: exact(copied, bias),
                               "one projection": lambda: one_projection(weight),
                               "head fwd+bwd": fwd_bwd}, opts.repeats)
    print()
    print(f"Median of {opts.repeats} runs after a warm-up, milliseconds.")
    print()
    print(C.table(["measurement", "ms", "/ head fwd+bwd"],
                  [[k, C.ms(v), f"{v / t['head fwd+bwd']:.3f}"] for k, v in t.items()]))
    print(f"machine at the end: {C.machine()}")


if __name__ == "__main__":
    main()
