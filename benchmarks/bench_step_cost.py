"""What the first step costs: the audit with the optimizer's step against the audit without it.

    python benchmarks/bench_step_cost.py [--models gpt2,t5,...] [--repeats 3] [--optimizer "AdamW(lr=3e-4)"]

For each model of the real-size zoo (``tests/zoo_real.py``: published architectures at their real
widths and vocabularies, on the zoo's probe batch), one process measures, after one warm-up round
and with the two taking turns in every repeat (interleaved, one thread), the median wall time of

* ``audit``: ``initlint.audit(model, batch)`` with every rule;
* ``audit + step``: the same with ``optimizer=`` (AdamW over every parameter by default), which
  adds the training loss's gradients of every parameter, one real step of the optimizer on a private
  copy of the parameters and of its state, and IL015/IL016.

It prints the ratio per model and its median and maximum. Goal: at most 1.5x (issue "the first step").
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's initlint
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # the real-size zoo

GOAL = 1.5


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(name: str, repeats: int, spec: str) -> Dict[str, float]:
    """Median seconds of the audit without and with the optimizer's first step, interleaved."""
    import torch

    import zoo_real as Z
    from initlint.inputs.optimizer import parse_optimizer

    model, inputs = Z.build(name)
    optimizer = parse_optimizer(spec)
    plain = lambda: Z.audit(model, inputs)
    stepped = lambda: Z.audit(model, inputs, optimizer=optimizer)
    plain(), stepped()  # warm-up: first-call costs (imports, allocator) are not the step's
    times: Dict[str, List[float]] = {"audit": [], "audit + step": []}
    for _ in range(repeats):
        times["audit"].append(_timed(plain))
        times["audit + step"].append(_timed(stepped))
    del model, inputs
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: List[str] = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated names of tests/zoo_real.py (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--optimizer", default="AdamW(lr=3e-4, weight_decay=0.1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import zoo_real as Z

    names = [n for n in args.models.split(",") if n] or list(Z.ZOO)
    ratios = []
    print(f"{'model':<20} {'audit s':>9} {'+ step s':>9} {'ratio':>7}", flush=True)
    for name in names:
        t = measure(name, args.repeats, args.optimizer)
        ratio = t["audit + step"] / t["audit"]
        ratios.append(ratio)
        print(f"{name:<20} {t['audit']:>9.2f} {t['audit + step']:>9.2f} {ratio:>7.2f}", flush=True)
    print(f"median {statistics.median(ratios):.2f}, max {max(ratios):.2f} over {len(ratios)} model(s) "
          f"(goal: at most {GOAL}x); {args.optimizer}, {args.repeats} repeats, {args.threads} thread(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
