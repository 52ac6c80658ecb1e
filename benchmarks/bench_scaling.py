"""How audit time grows with depth and width, against the model's own forward+backward.

    python benchmarks/bench_scaling.py [--repeats 5] [--threads 1] [--depths 10,50,200] [--widths 128,512]

For ReLU MLPs (``depth`` x (Linear(width, width) + ReLU), batch 16) it measures the median
time of a plain forward+backward and of ``initlint.audit`` (see bench_overhead.py for both),
then the marginal cost of a layer: the slope of time against depth between consecutive
depths. Growth is linear in depth when the slope between the two deepest models is no more
than 1.5x the slope between the two shallowest (a fixed start-up cost only lowers the time
per layer of deep models, so the slope, not time / depth, is what to compare). It is linear
in the model's own cost when the audit's slope is a constant multiple of the model's slope
at every width; a per-layer cost that does not shrink with width shows as a multiple that
falls as the layers get wider.
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
    slope_rows = []
    for width in widths:
        totals = [(d, per_layer[(width, d)][0] * d, per_layer[(width, d)][1] * d) for d in depths]
        slopes = [((b[1] - a[1]) / (b[0] - a[0]), (b[2] - a[2]) / (b[0] - a[0])) for a, b in zip(totals, totals[1:])]
        linear = slopes[-1][1] <= 1.5 * slopes[0][1]
        fixed = totals[0][2] - slopes[0][1] * totals[0][0]
        for (lo, hi), (model_slope, audit_slope) in zip(zip(depths, depths[1:]), slopes):
            slope_rows.append([width, f"{lo}-{hi}", f"{model_slope * 1e3:.3f}", f"{audit_slope * 1e3:.3f}",
                               f"{audit_slope / model_slope:.2f}"])
        print(f"width {width}: marginal audit cost per layer {slopes[0][1] * 1e3:.2f} ms (depth {depths[0]}-{depths[1]}) "
              f"-> {slopes[-1][1] * 1e3:.2f} ms (depth {depths[-2]}-{depths[-1]}): "
              f"{'linear' if linear else 'NOT linear'} in depth; fixed cost about {fixed * 1e3:.0f} ms; "
              f"a layer costs the audit {slopes[-1][1] / slopes[-1][0]:.1f}x its own fwd+bwd")
    print()
    print(C.table(["width", "depths", "fwd+bwd ms / extra layer", "audit ms / extra layer", "ratio"], slope_rows))
    print(f"machine at the end: {C.machine()}")


if __name__ == "__main__":
    main()
