"""What an audit costs on real-size transformers, next to the model's own forward+backward.

    python benchmarks/bench_transformers.py [--repeats 5] [--threads 1] [--batch 4] [--tokens 128]
                                            [--llama-layers 16] [--models gpt2_124m,llama_1024]

Models, built from their configs (no download):

* ``gpt2_124m``: ``GPT2LMHeadModel`` at GPT-2 small's size (12 layers, 768 wide, 12 heads,
  vocabulary 50257: 124M parameters);
* ``llama_1024``: ``LlamaForCausalLM`` at hidden 1024 (16 heads, 8 KV heads, SwiGLU 2816,
  vocabulary 32000), ``--llama-layers`` layers.

For each, one process measures the median wall time of ``--repeats`` runs after one warm-up
round, the workloads taking turns within each round (see ``_common.interleaved_medians``):

* ``fwd+bwd``: a training-mode forward of the batch and ``torch.autograd.grad`` of a random
  cotangent of the logits with respect to every parameter;
* ``audit``: ``initlint.audit(model, batch)`` with every rule (forward probe with the attention,
  residual and token statistics, backward probe, parameter statistics, rules).

The logits are the output both backpropagate from (the audit finds them in the output's
``logits`` field). Goal: audit <= 1.2x fwd+bwd on each model.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import _common as C  # noqa: E402


def gpt2_124m(layers: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257))


def llama_1024(layers: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
                                        num_key_value_heads=8, intermediate_size=2816, vocab_size=32000))


BUILDERS = {"gpt2_124m": gpt2_124m, "llama_1024": llama_1024}


def forward_backward(model: nn.Module, inputs: dict) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    out = model(**inputs).logits
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
    torch.autograd.grad([out], params, [cotangent], allow_unused=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--llama-layers", type=int, default=16)
    parser.add_argument("--models", default=",".join(BUILDERS))
    opts = parser.parse_args()
    C.set_threads(opts.threads)

    import initlint
    from transformers.utils import logging

    logging.set_verbosity_error()
    print(f"machine: {C.machine()}")
    print(f"code: {C.revision()}")
    rows, verdicts = [], []
    for name in [n for n in opts.models.split(",") if n]:
        torch.manual_seed(0)
        model = BUILDERS[name](opts.llama_layers)
        params = sum(p.numel() for p in model.parameters())
        gen = torch.Generator().manual_seed(0)
        inputs = {"input_ids": torch.randint(0, model.config.vocab_size, (opts.batch, opts.tokens), generator=gen)}
        report = initlint.audit(model, inputs)
        fns = {"fwd_bwd": lambda: forward_backward(model, inputs), "audit": lambda: initlint.audit(model, inputs)}
        t = C.interleaved_medians(fns, opts.repeats)
        ratio = t["audit"] / t["fwd_bwd"]
        verdicts.append((name, ratio))
        rows.append([name, f"{params / 1e6:.0f}M", report.capture, f"{opts.batch} x {opts.tokens}", C.ms(t["fwd_bwd"]),
                     C.ms(t["audit"]), f"{ratio:.2f}", len(report.findings)])
        print(f"  {name}: fwd+bwd {C.ms(t['fwd_bwd'])} ms, audit {C.ms(t['audit'])} ms, {ratio:.2f}x", flush=True)
        del model, fns
    print()
    print(f"Median of {opts.repeats} runs after a warm-up, milliseconds.")
    print()
    print(C.table(["model", "parameters", "capture", "batch", "fwd+bwd", "audit", "audit / fwd+bwd", "findings"], rows))
    print()
    for name, ratio in verdicts:
        print(f"goal audit <= 1.2x fwd+bwd on {name}: {'met' if ratio <= 1.2 else 'MISSED'} ({ratio:.2f}x)")
    print(f"machine at the end: {C.machine()}")


if __name__ == "__main__":
    main()
