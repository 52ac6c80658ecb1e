"""The audit's dispatched ops against a forward+backward's, counted on any device (a CPU proxy of its fixed cost on a GPU).

    python benchmarks/bench_ops.py [--models gpt2,llama32,bert,qwen3,vit,resnet50,swin] [--sites 20]

On a GPU the audit's cost beyond the model's own fwd+bwd is per-op work on the host: the capture's
hooks, and the statistics' small reductions, each an op that goes through PyTorch's dispatcher and
mostly launches a kernel of a few microseconds. This script counts the ATen ops that reach the
dispatcher (a ``TorchDispatchMode``) in one ``initlint.audit(model, batch)`` and in one
``_common.forward_backward`` of the same model, after a warm-up of each. The count does not depend on
the device or the batch size (the zoo's own 2-example batch is used), so it is measured here and
compared with the GPU's time.

Ops that launch a kernel are counted apart (:func:`launches`): views, ``detach`` and allocations cost
about a microsecond of host time each, a launching op several.

``--sites N`` lists the N places in initlint that dispatch the most kernel-launching ops (file:line and op).
Models: ``tests/zoo_real.py``'s builders (real widths and vocabularies).
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections import Counter
from typing import Any, Dict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)  # this checkout's initlint
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the zoo

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import _common as C  # noqa: E402

MODELS = ("gpt2", "llama32", "bert", "qwen3", "vit", "resnet50", "swin")
PACKAGE = os.path.join(ROOT, "initlint") + os.sep


_NO_KERNEL = {"detach", "alias", "lift_fresh", "empty", "empty_like", "empty_strided", "_lazy_clone", "set_"}
"""Ops that launch no kernel besides the views (``func.is_view``): metadata and allocation only."""


def launches(func: Any) -> bool:
    """Whether an op launches a kernel on a GPU: not a view, and not a metadata or allocation-only op. On a GPU
    a launching op costs its dispatch and a launch (some 5-10 us of host time); a view or a detach about 1 us."""
    return not func.is_view and func.overloadpacket.__name__ not in _NO_KERNEL


class _Count(TorchDispatchMode):
    """Ops that reach the dispatcher, and those of them that launch a kernel (:func:`launches`); with
    ``sites``, also the innermost initlint line of each."""

    def __init__(self, sites: bool = False) -> None:
        super().__init__()
        self.ops = 0
        self.kernels = 0
        self.sites: Counter = Counter()
        self._sites = sites

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        self.kernels += launches(func)
        if self._sites and launches(func):
            frames = [f for f in traceback.extract_stack(limit=80) if f.filename.startswith(PACKAGE)]
            where = f"{os.path.relpath(frames[-1].filename, ROOT)}:{frames[-1].lineno}" if frames else "the model"
            self.sites[(where, str(func.overloadpacket))] += 1
        return func(*args, **(kwargs or {}))


def count(name: str, sites: bool) -> Dict[str, Any]:
    import zoo_real

    import initlint
    from initlint.inputs.load import infer_inputs, normalise_inputs

    torch.manual_seed(0)
    model, inputs = zoo_real.ZOO[name].build()
    pair = infer_inputs(model, zoo_real.BATCH, 0) if inputs is None else normalise_inputs(inputs)
    C.forward_backward(model, pair)
    initlint.audit(model, C.example(pair))  # warm-up: first calls take other paths (caches, lazy imports)
    with _Count() as model_ops:
        C.forward_backward(model, pair)
    with _Count(sites) as audit_ops:
        initlint.audit(model, C.example(pair))
    return {"fwd_bwd": model_ops.ops, "audit": audit_ops.ops, "fwd_bwd_kernels": model_ops.kernels,
            "audit_kernels": audit_ops.kernels, "sites": audit_ops.sites}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--sites", type=int, default=0, help="list this many of initlint's busiest lines (kernel-launching ops)")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}; code: {C.revision()}")
    rows = []
    for name in opts.models.split(","):
        result = count(name, opts.sites > 0)
        rows.append((name, result))
        print(f"  {name}: fwd+bwd {result['fwd_bwd']} ops, audit {result['audit']} ops", flush=True)
    print("\n| model | fwd+bwd ops | audit ops | audit - fwd+bwd | of which launch a kernel: fwd+bwd | audit | "
          "audit - fwd+bwd |\n|---|---|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['fwd_bwd']} | {r['audit']} | {r['audit'] - r['fwd_bwd']} | {r['fwd_bwd_kernels']} | "
              f"{r['audit_kernels']} | {r['audit_kernels'] - r['fwd_bwd_kernels']} |")
    if opts.sites:
        total: Counter = Counter()
        for _, r in rows:
            total.update(r["sites"])
        print(f"\ninitlint's busiest lines over these models (kernel-launching ops, line, op):")
        for (where, op), n in total.most_common(opts.sites):
            print(f"  {n:6d}  {where}  {op}")


if __name__ == "__main__":
    main()
