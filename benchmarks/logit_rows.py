"""How far the logits' statistics move when fewer rows are measured (:func:`initlint.probe.rows.logit_rows`).

    python benchmarks/logit_rows.py [--batch 16] [--models gpt2,t5,...]

For each language model of the real-size zoo, at a probe batch of ``--batch`` sequences of 16 tokens,
audits once measuring every row of the logits (up to 512) and once with the default row budget,
and prints IL004's figures (mean max-probability, entropy / ln(C), one-hot rows, expected
cross-entropy / ln(C)) for both, with the findings of each.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import _common as C  # noqa: E402

LANGUAGE_MODELS = "gpt2,llama32,qwen3,gemma3,mixtral,opt,pythia,mamba,bert,t5,bart,x_decoder"


def _recording(put_softmax, stats: dict):
    """``put_softmax`` that also copies the logits' figures into ``stats``."""
    from initlint.probe import rows as sampled

    def recording(c, scope, key, *args, **kwargs):
        before, consts = len(c.values), len(c.consts)
        put_softmax(c, scope, key, *args, **kwargs)
        if scope == "logits":
            y, dim = args[0], args[1]
            stats["rows"] = min(y.numel() // y.shape[dim], sampled.SOFTMAX_ROWS)
            stats.update((name, float(value)) for (_, _, name), value in zip(c.keys[before:], c.values[before:]))
            stats.update((name, value) for _, _, name, value in c.consts[consts:])
    return recording


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--models", default=LANGUAGE_MODELS)
    opts = parser.parse_args()
    C.set_threads(1)
    import torch
    import zoo_real

    import initlint
    from initlint.inputs.load import infer_inputs, normalise_inputs
    from initlint.probe import rows as sampled
    from initlint.probe import run

    names = [n for n in opts.models.split(",") if n]
    unknown = [n for n in names if n not in zoo_real.ZOO]
    if unknown or opts.batch < 1:
        parser.error(f"no model {', '.join(unknown)} in the zoo; it has {', '.join(zoo_real.ZOO)}" if unknown
                     else "--batch takes a positive number of examples")
    zoo_real.BATCH = opts.batch
    budget, original = sampled.LOGIT_VALUES, run.put_softmax
    rows = []
    for name in names:
        torch.manual_seed(0)
        model, inputs = zoo_real.ZOO[name].build()
        pair = infer_inputs(model, opts.batch, 0) if inputs is None else normalise_inputs(inputs)
        figures = []
        for label, values in (("all rows", 1 << 62), ("budget", budget)):
            stats: dict = {}
            sampled.LOGIT_VALUES = values
            run.put_softmax = _recording(original, stats)
            try:
                report = initlint.audit(model, C.example(pair), logits=True)
            finally:
                sampled.LOGIT_VALUES, run.put_softmax = budget, original
            figures.append((label, stats, sorted({f.code for f in report.findings if f.severity != "info"})))
        for label, stats, codes in figures:
            classes = stats.get("classes", float("nan"))
            measured = stats.get("rows", "-")
            rows.append([name, label, measured, f"{stats.get('maxprob', float('nan')):.4f}",
                         f"{stats.get('entropy', float('nan')):.4f}", f"{stats.get('onehot_rows', float('nan')):.3f}",
                         f"{stats.get('xent', float('nan')) / math.log(classes):.4f}" if classes == classes else "-",
                         " ".join(codes) or "-"])
        print(f"  {name} done", flush=True)
    print(C.table(["model", "rows", "measured", "maxprob", "entropy / ln C", "one-hot rows", "xent / ln C",
                   "warnings"], rows))


if __name__ == "__main__":
    main()
