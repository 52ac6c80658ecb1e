"""Does one over-scaled layer inside a pre-norm GPT-2 branch harm training? (IL012's help, IL001, IL011)

    python benchmarks/gpt2_corrupt_layer.py [--layers none,h.1.mlp.c_fc,h.0.mlp.c_fc,h.0.attn.c_attn]
                                            [--steps 100] [--seeds 0,1,2]

Hugging Face ``GPT2LMHeadModel`` at GPT-2 small's width (``n_embd`` 768, 12 heads, 2 blocks,
built from a ``GPT2Config``, offline, GPT-2's own init) with one weight redrawn from
``N(0, 1)`` before training: 27.7x the ``1/sqrt(768)`` of a sound init, 50x GPT-2's 0.02.
The vocabulary is the task's 64 tokens (the 50257 rows of GPT-2's would only make each step
slower; the corrupted layers do not depend on it). Task: a copy task built in code, 12 random
tokens out of 64, then the same 12 again; the loss is the cross-entropy on the repeated half
(``ln 64 = 4.16`` for a guess). AdamW (lr 3e-4, batch 8, fixed data order per seed), one thread.

``LAYER*K`` multiplies the layer's weight by K instead (``h.0.mlp.c_proj*50``: the output
projection scaled up, as in IL012's calibration, benchmarks/residual_training.py).

For each corrupted layer (``none``: the intact model) and seed it reports ``steps<1``, the
first step at which the running mean copy loss (over 10 steps) drops below 1 (``-``: never),
the mean loss over all steps (how fast it learns) and over the last 25, and once per layer initlint's findings at init on the same model (all
rules, a 2 x 23 token probe) and the branch-to-stream ratio IL012 measures at the corrupted
block. Training "suffers" when the copy is learnt clearly later than by the intact model, or
its loss stays clearly above.

Write-up: docs/benchmarks.md ("One corrupted layer in GPT-2").
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import _common as C  # noqa: E402

VOCAB, HALF, BATCH = 64, 12, 8


def build(layer: Optional[str], seed: int) -> torch.nn.Module:
    import transformers as tf

    tf.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(seed)
    config = tf.GPT2Config(n_embd=768, n_head=12, n_layer=2, vocab_size=VOCAB, n_positions=2 * HALF,
                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = tf.GPT2LMHeadModel(config)
    if layer:
        name, _, factor = layer.partition("*")
        with torch.no_grad():
            weight = model.transformer.get_submodule(name).weight
            weight.mul_(float(factor)) if factor else weight.normal_(0.0, 1.0)
    return model


def batch(gen: torch.Generator, size: int = BATCH) -> torch.Tensor:
    half = torch.randint(0, VOCAB, (size, HALF), generator=gen)
    return torch.cat([half, half], dim=1)


def train(model: torch.nn.Module, steps: int, seed: int) -> List[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1000 + seed)
    losses = []
    for _ in range(steps):
        seq = batch(gen)
        logits = model(input_ids=seq[:, :-1]).logits
        copy = logits[:, HALF - 1:]  # positions HALF-1 .. 2*HALF-2 predict the repeated half
        loss = F.cross_entropy(copy.reshape(-1, VOCAB), seq[:, HALF:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def first_below(losses: List[float], level: float = 1.0, window: int = 10) -> str:
    """The first step at which the running mean loss (over ``window`` steps) is below ``level``."""
    for i in range(window, len(losses) + 1):
        if sum(losses[i - window:i]) / window < level:
            return str(i)
    return "-"


def verdict(model: torch.nn.Module, layer: Optional[str]) -> str:
    """initlint's findings at init, and IL012's branch-to-stream ratio at the corrupted block."""
    import initlint
    from initlint.rules import Audit
    from initlint.rules.base import measured, residual_adds

    report = initlint.audit(model, {"input_ids": batch(torch.Generator().manual_seed(0), 2)[:, :-1]})
    found = ", ".join(f"{code} {module}" for code, module in report.codes()) or "none"
    if not layer:
        return found
    audit = Audit(model=model, graph=report.graph, probe=report.probe)
    block = "transformer." + layer.split("*")[0].rsplit(".", 1)[0]
    for res in residual_adds(report.graph):
        if res.layers[-1].module.startswith(block):
            stream, branch = measured(audit, res.stream), measured(audit, res.branch)
            ratio = audit.op_stats(branch)["rms"] / audit.op_stats(stream)["rms"]
            return f"{found}; branch/stream {ratio:.3g}"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="none,h.1.mlp.c_fc,h.0.mlp.c_fc,h.0.attn.c_attn")
    parser.add_argument("--steps", type=int, default=100, help="0: only initlint's verdict at init")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args()
    C.set_threads(opts.threads)
    seeds = [int(s) for s in opts.seeds.split(",")]
    print(f"machine: {C.machine()}")
    print(f"code: {C.revision()}")
    rows = []
    for name in opts.layers.split(","):
        layer = None if name == "none" else name
        finals, reached, means = [], [], []
        start = time.time()
        found = verdict(build(layer, seeds[0]), layer)
        if not opts.steps:
            print(f"  {name}: initlint: {found}", flush=True)
            continue
        for seed in seeds:
            losses = train(build(layer, seed), opts.steps, seed)
            finals.append(statistics.mean(losses[-25:]))
            reached.append(first_below(losses))
            means.append(statistics.mean(losses))
        final = f"{statistics.mean(finals):.3f} ({', '.join(f'{x:.3f}' for x in finals)})"
        mean = f"{statistics.mean(means):.2f} ({', '.join(f'{x:.2f}' for x in means)})"
        rows.append([name, ", ".join(reached), mean, final, found])
        print(f"  {name}: steps<1 {reached}, mean loss {mean}, final {final}; initlint: {found} "
              f"({time.time() - start:.0f} s)", flush=True)
    if not rows:
        return
    print()
    print(f"Copy-task loss (ln 64 = 4.16 for a guess) over {opts.steps} steps, seeds {opts.seeds}.")
    print()
    print(C.table(["corrupted layer", "steps<1 per seed", f"mean loss, steps 1-{opts.steps}",
                   "loss, last 25 steps", "initlint at init"], rows))


if __name__ == "__main__":
    main()
