"""What the first step and the precision probe cost: the audit with the optimizer's step against the audit
without it, and the audit with ``precision=`` against the model's forward+backward.

    python benchmarks/bench_step_cost.py [--models gpt2,t5,...] [--repeats 3] [--optimizer "AdamW(lr=3e-4)"]
                                         [--precision bf16] [--clock wall|process]
                                         [--device cpu|cuda] [--batch training] [--tokens BxT] [--images N]
                                         [--recipes]

For each model of the real-size zoo (``tests/zoo_real.py``: published architectures at their real
widths and vocabularies, on the zoo's probe batch), one process measures, after one warm-up round
and with the two taking turns in every repeat (interleaved, one thread), the median wall time of

* ``audit``: ``initlint.audit(model, batch)`` with every rule;
* ``audit + step``: the same with ``optimizer=`` (AdamW over every parameter by default), which
  adds the training loss's gradients of every parameter, one real step of the optimizer on a private
  copy of the parameters and of its state, and IL015/IL016. With ``--recipes``, each model's published
  optimizer at its peak rate (``RECIPES`` of ``tests/zoo_real.py``) and its gradient clipping where it
  publishes one (``CLIPPING``, as ``clip_grad_norm=``): what the training callbacks audit.

* with ``--precision bf16``, also ``fwd+bwd`` (``_common.forward_backward``) and ``audit + precision``:
  the audit with ``precision="bf16"``, which adds one more forward and backward under ``torch.autocast``;
  the precision probe's cost is ``(audit + precision) - audit``, given against ``fwd+bwd``.

``--device cuda`` moves each model and its batch there first; ``--batch training`` gives them the training
batches of ``bench_real_size.py --batch training`` (GPT-2 8 x 1024 tokens, the 32-layer Llama 4 x 512,
BERT 16 x 512, Qwen3 4 x 512, 32 images of 224 x 224; ``--tokens`` and ``--images`` as there) and,
without ``--models``, measures that script's training set.

It prints the ratios per model and their median and maximum. Goals: the first step at most 1.3x the plain
audit; the precision probe at most 1.5x fwd+bwd.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's initlint
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # the real-size zoo

GOAL = 1.3
PRECISION_GOAL = 1.5


def _timed(fn: Callable[[], Any]) -> float:
    import _common as C

    return C.timed(fn)


def measure(name: str, repeats: int, spec: str, precision: str = "", device: str = "cpu", batch: str = "",
            tokens: Any = None, images: Any = None, recipes: bool = False) -> Dict[str, float]:
    """Median seconds of the audit without and with the optimizer's first step (and with the precision
    probe, and of fwd+bwd), interleaved."""
    import torch

    import _common as C
    import bench_real_size as R
    import zoo_real as Z
    from initlint.inputs.load import move_inputs
    from initlint.inputs.optimizer import parse_optimizer

    model, pair = dict(R.zoo_models([name], batch or Z.BATCH, None, tokens, images))[name]()
    if device != "cpu":
        model = model.to(device)
        pair = (move_inputs(pair[0], torch.device(device)), move_inputs(pair[1], torch.device(device)))
    inputs = C.example(pair)
    optimizer = Z.RECIPES[name][1] if recipes else parse_optimizer(spec)
    clip = Z.CLIPPING.get(name) if recipes else None
    fns = {"audit": lambda: Z.audit(model, inputs),
           "audit + step": lambda: Z.audit(model, inputs, optimizer=optimizer, clip_grad_norm=clip)}
    if precision:
        fns["fwd+bwd"] = lambda: C.forward_backward(model, pair)
        fns["audit + precision"] = lambda: Z.audit(model, inputs, precision=precision)
    for fn in fns.values():  # warm-up: first-call costs (imports, allocator) are not the step's
        fn()
    times: Dict[str, List[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            times[key].append(_timed(fn))
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
    parser.add_argument("--precision", default="", help="also measure the precision probe (bf16 or fp16)")
    parser.add_argument("--clock", choices=("wall", "process"), default="wall",
                        help="wall time, or this process's CPU time (steady on a shared machine)")
    parser.add_argument("--device", default="cpu", help="where the models and batches are (default cpu)")
    parser.add_argument("--batch", default="", choices=("", "training"), help="training: the training batches")
    parser.add_argument("--tokens", default=None, help="with --batch training: BxT sequences x tokens")
    parser.add_argument("--images", type=int, default=None, help="with --batch training: images per batch")
    parser.add_argument("--recipes", action="store_true",
                        help="each model's published optimizer and clipping (tests/zoo_real.py), not --optimizer")
    args = parser.parse_args(argv)
    tokens = tuple(int(v) for v in args.tokens.lower().split("x")) if args.tokens else None
    torch.set_num_threads(args.threads)
    sys.path.insert(0, HERE)
    import _common as C

    C.set_clock(args.clock)
    import zoo_real as Z

    import bench_real_size as R

    names = [n for n in args.models.split(",") if n] or list(R.TRAINING_SET if args.batch else Z.ZOO)
    ratios, probe_ratios = [], []
    print(f"machine: {C.machine()}")
    print(f"code: {C.revision()}; device: {args.device}; batch: {args.batch or 'zoo'}")
    print(f"{'model':<20} {'audit s':>9} {'+ step s':>9} {'ratio':>7}"
          + (f" {'fwd+bwd s':>10} {'+ precision s':>14} {'probe / fwd+bwd':>16}" if args.precision else ""), flush=True)
    for name in names:
        t = measure(name, args.repeats, args.optimizer, args.precision, args.device, args.batch, tokens, args.images,
                    args.recipes)
        ratio = t["audit + step"] / t["audit"]
        ratios.append(ratio)
        line = f"{name:<20} {t['audit']:>9.3f} {t['audit + step']:>9.3f} {ratio:>7.2f}"
        if args.precision:
            probe = (t["audit + precision"] - t["audit"]) / t["fwd+bwd"]
            probe_ratios.append(probe)
            line += f" {t['fwd+bwd']:>10.3f} {t['audit + precision']:>14.3f} {probe:>16.2f}"
        print(line, flush=True)
    print(f"first step: median {statistics.median(ratios):.2f}, max {max(ratios):.2f} over {len(ratios)} model(s) "
          f"(goal: at most {GOAL}x); {'the published recipes' if args.recipes else args.optimizer}, {args.repeats} repeats, {args.threads} thread(s)")
    if probe_ratios:
        print(f"precision probe ({args.precision}) / fwd+bwd: median {statistics.median(probe_ratios):.2f}, "
              f"max {max(probe_ratios):.2f} (goal: at most {PRECISION_GOAL}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
