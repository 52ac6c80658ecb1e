"""How audit time grows with depth and width, against the model's own forward+backward.

    python benchmarks/bench_scaling.py [--repeats 5] [--threads 1] [--depths 10,50,200] [--widths 128,512]

For ReLU MLPs (``depth`` x (Linear(width, width) + ReLU), batch 16) it measures the median
time of a plain forward+backward and of ``initlint.audit`` (see bench_overhead.py for both),
then reports the cost per layer. Growth is linear in depth when the audit's time per layer
stays constant from the shallowest to the deepest model; it is linear in the model's own
cost when audit / (fwd+bwd) stays constant, too. A constant per-layer cost that does not
shrink with width shows as a ratio that falls as the layers get wider.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import _common as C  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--depths", default="10,50,200")
    parser.add_argument("--widths", default="128,512")
    opts = parser.parse_args()
    C.set_threads(opts.threads)
    depths = [int(d) for d in opts.depths.split(",")]
    widths = [int(w) for w in opts.widths.split(",")]

    print(f"machine: {C.machine()}")
    print(f"code: {C.revision()}")
    rows, per_layer = [], {}
    for width in widths:
        for depth in depths:
            torch.manual_seed(0)
            model = C.relu_mlp(depth, width)
            inputs = ((torch.randn(16, width, generator=torch.Generator().manual_seed(0)),), {})
            fns = {kind: C.workload(kind, model, inputs) for kind in ("fwd_bwd", "audit")}
            t = C.interleaved_medians(fns, opts.repeats)
            per_layer[(width, depth)] = (t["fwd_bwd"] / depth, t["audit"] / depth)
            rows.append([width, depth, C.ms(t["fwd_bwd"]), C.ms(t["audit"]), f"{t['fwd_bwd'] / depth * 1e3:.3f}",
                         f"{t['audit'] / depth * 1e3:.3f}", f"{(t['audit'] - t['fwd_bwd']) / depth * 1e3:.3f}",
                         f"{t['audit'] / t['fwd_bwd']:.2f}"])
            print(f"  width {width} depth {depth}: fwd+bwd {C.ms(t['fwd_bwd'])} ms, audit {C.ms(t['audit'])} ms",
                  flush=True)
    print()
    print(f"Median of {opts.repeats} runs after a warm-up; times in ms, per-layer columns in ms per layer.")
    print()
    print(C.table(["width", "depth", "fwd+bwd", "audit", "fwd+bwd / layer", "audit / layer",
                   "overhead / layer", "audit / fwd+bwd"], rows))
    print()
    for width in widths:
        first, last = per_layer[(width, depths[0])], per_layer[(width, depths[-1])]
        growth_audit = last[1] / first[1]
        growth_model = last[0] / first[0]
        linear = 0.67 <= growth_audit <= 1.5
        print(f"width {width}: audit time per layer at depth {depths[-1]} is {growth_audit:.2f}x that at depth "
              f"{depths[0]} (model: {growth_model:.2f}x) -> {'linear' if linear else 'NOT linear'} in depth")
    print(f"machine at the end: {C.machine()}")


if __name__ == "__main__":
    main()
