"""Audit time against a plain forward+backward on published models at full width and vocabulary.

    python benchmarks/bench_real_size.py [--repeats 5] [--threads 1] [--models gpt2_124m,bert_base,llama_32k]

The models (``_common.REAL_SIZE``): GPT-2 124M with its LM head (``GPT2Config()``), BERT-base
for masked LM (``BertConfig()``) and a Llama-style LM (8 layers x 1024, vocabulary 32000),
built from their configs, each on a batch of 8 x 64 tokens. One process measures, after
one warm-up round and with the two taking turns in every repeat, the median wall time of

* ``fwd+bwd``: a training-mode forward and ``torch.autograd.grad`` of a random cotangent at
  the logits with respect to every parameter (``_common.forward_backward``);
* ``audit``: ``initlint.audit(model, batch)`` with every rule.

Goal: audit at most 1.15x fwd+bwd (median over the three).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's initlint

import _common as C  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default=",".join(C.REAL_SIZE))
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args()
    C.set_threads(opts.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    import initlint

    print(f"machine: {C.machine()}")
    print(f"initlint from: {os.path.dirname(initlint.__file__)}")
    print(f"code: {C.revision()}")
    rows, ratios = [], []
    for name in [n for n in opts.models.split(",") if n]:
        model, inputs = C.build(name)
        report = initlint.audit(model, C.example(inputs))
        fns = {kind: C.workload(kind, model, inputs) for kind in ("fwd_bwd", "audit")}
        t = C.interleaved_medians(fns, opts.repeats)
        ratio = t["audit"] / t["fwd_bwd"]
        ratios.append(ratio)
        warnings = sum(1 for f in report.findings if f.severity != "info")
        rows.append([name, C.MODELS[name][2], report.capture, warnings, C.ms(t["fwd_bwd"]), C.ms(t["audit"]),
                     f"{ratio:.2f}"])
        print(f"  {name}: " + ", ".join(f"{k} {C.ms(v)} ms" for k, v in t.items()), flush=True)
        del model, inputs, fns, report
    rows.append(["**median**", "", "", "", "", "", f"**{statistics.median(ratios):.2f}**"])
    print()
    print(f"Median of {opts.repeats} runs after a warm-up, milliseconds.")
    print()
    print(C.table(["model", "what", "capture", "warnings", "fwd+bwd", "audit", "audit / fwd+bwd"], rows))
    print()
    met = statistics.median(ratios) <= 1.15
    print(f"goal audit <= 1.15x fwd+bwd (median): {'met' if met else 'MISSED'}")
    print(f"machine at the end: {C.machine()}")


if __name__ == "__main__":
    main()
