"""Does Hugging Face's fixed std 0.02 at Llama-3-70B's width harm training? A proxy at a width this machine trains.

    python benchmarks/wide_init_proxy.py [--steps 300] [--seeds 0,1] [--lr 1e-3] [--inits 70b,8b,hf,...]
                                         [--layers 2] [--batch 16]

At hidden 8192, every weight drawn N(0, 0.02) (``LlamaForCausalLM._init_weights``) gives the attention
scores a std near 3.3 after the 1/sqrt(128) scale (q and k each have rms 0.02 * sqrt(8192) = 1.8), and the
first attention branch adds a signal of rms 2.5 to an embedding of rms 0.02: the 70B-shaped streamed audit
reports IL011 on every ``q_proj`` and IL012 on the first ``o_proj``. Whether that is harm is a claim about
training, which a 70B model cannot be trained here to settle. So a Llama of the same head dimension (128)
at hidden 256 (2 heads, 2 key-value heads, intermediate 896 = 3.5 x hidden as in the 70B, ``--layers`` layers, RoPE,
RMSNorm, SwiGLU) is given the statistics the 70B gets: every linear weight drawn N(0, s) with
``s = 0.02 * sqrt(8192 / 256) = 0.113`` (so ``s**2 * hidden`` and ``s**2 * intermediate``, which set the
score std, the branches' and the MLP's output scale, are the 70B's), the embedding N(0, 0.02). The inits
compared (``--inits``):

* ``70b``: the 70B's statistics, as above;
* ``8b``: Llama-3-8B's (hidden 4096): ``s = 0.02 * sqrt(4096 / 256) = 0.08`` (scores of std about 1.6);
* ``hf``: what ``_init_weights`` gives this width itself: ``s = 0.02``;
* ``70b-qk``: the 70B's, with ``q_proj`` and ``k_proj`` at the std IL011's fix names (scores of std 1);
* ``70b-emb``: the 70B's, with the embedding at std 1 (the first branch then adds about 2.5x the stream);
* ``score=X``: the 70B's, with ``q_proj`` and ``k_proj`` drawn so that the scores have std ``X``
  (``s_qk**2 * hidden = X``): where does saturation start to cost training?
* ``emb=S``: this width's own init (``hf``) with the embedding drawn at std ``S``: the first branch large
  against the embedding (IL012) without the 70B's saturated attention.

The task is the copy task of ``residual_training.py``: 32 random tokens of 64, then the same 32
again; the loss is the cross-entropy on the repeated half (ln 64 = 4.16 for a guess, 0 once the
model copies, which needs an induction head). Each init trains with AdamW (``--lr``, betas (0.9, 0.95),
weight decay 0.1, 20 warm-up steps, ``--batch`` sequences, the same data order for every init) for each seed, and is
audited at init on a training batch (``initlint.audit(model, batch)``). Per init the script prints the
findings of the audit (codes, with IL011's lowest entropy and IL012's ratio), the mean copy loss over
the last 50 steps and the first step at which the running mean (20 steps) drops below 1.0.

Write-up: docs/benchmarks.md ("A 70B-width init at a trainable width").
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's initlint

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from residual_training import first_below  # noqa: E402  (the running mean over 20 steps)

HIDDEN, HEAD_DIM, VOCAB, HALF = 256, 128, 64, 32
LAYERS = 2  # an induction head needs two; set by --layers
WIDE = {"70b": 8192, "8b": 4096}


def build(init: str, seed: int) -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=int(3.5 * HIDDEN), num_hidden_layers=LAYERS,
                                      num_attention_heads=HIDDEN // HEAD_DIM, num_key_value_heads=HIDDEN // HEAD_DIM,
                                      head_dim=HEAD_DIM, vocab_size=VOCAB, max_position_embeddings=2 * HALF,
                                      tie_word_embeddings=False, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config)
    base = "70b" if init.startswith("score=") else init.split("-")[0]
    std = 0.02 * math.sqrt(WIDE[base] / HIDDEN) if base in WIDE else 0.02
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear):
                s = std
                if init == "70b-qk" and name.endswith(("q_proj", "k_proj")):
                    s = HIDDEN ** -0.5  # q.k over head dim 128, scaled by 1/sqrt(128): std 1
                elif init.startswith("score=") and name.endswith(("q_proj", "k_proj")):
                    s = math.sqrt(float(init[len("score="):]) / HIDDEN)
                module.weight.normal_(0.0, s)
            elif isinstance(module, nn.Embedding):
                emb = float(init[len("emb="):]) if init.startswith("emb=") else 1.0 if init == "70b-emb" else 0.02
                module.weight.normal_(0.0, emb)
    return model


def batch(gen: torch.Generator, size: int = 32) -> torch.Tensor:
    half = torch.randint(0, VOCAB, (size, HALF), generator=gen)
    return torch.cat([half, half], dim=1)


def train(model: nn.Module, steps: int, seed: int, lr: float, size: int) -> List[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 20))
    gen = torch.Generator().manual_seed(1000 + seed)
    losses = []
    model.train()
    for _ in range(steps):
        seq = batch(gen, size)
        logits = model(input_ids=seq).logits
        copy = logits[:, HALF - 1:-1]
        loss = F.cross_entropy(copy.reshape(-1, VOCAB), seq[:, HALF:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def audit(model: nn.Module) -> str:
    import initlint

    seq = batch(torch.Generator().manual_seed(7))
    report = initlint.audit(model, {"input_ids": seq})
    parts: Dict[str, List[float]] = {}
    for f in report.findings:
        parts.setdefault(f.code, []).append(f.value if f.value is not None else float("nan"))
    if not parts:
        return "clean"
    worst = {"IL011": min, "IL012": max}
    return ", ".join(f"{code} x{len(v)} ({worst.get(code, max)(v):.3g})" for code, v in sorted(parts.items()))


def main() -> None:
    global LAYERS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--inits", default="70b,8b,hf,70b-qk,70b-emb")
    parser.add_argument("--threads", type=int, default=2)
    opts = parser.parse_args()
    LAYERS = opts.layers
    torch.set_num_threads(opts.threads)
    seeds = [int(s) for s in opts.seeds.split(",") if s]
    print(f"proxy: Llama, hidden {HIDDEN}, head dim {HEAD_DIM}, {LAYERS} layers, vocabulary {VOCAB}; copy task of "
          f"{HALF} tokens, batch {opts.batch}; AdamW lr {opts.lr}, {opts.steps} steps, seeds {seeds}; "
          f"torch {torch.__version__}")
    print(f"| init | audit at init (seed {seeds[0]}) | loss, last 50 steps, per seed | first step < 1.0, per seed |")
    print("|---|---|---|---|")
    for init in opts.inits.split(","):
        verdict = audit(build(init, seeds[0]))
        finals, firsts = [], []
        for seed in seeds:
            losses = train(build(init, seed), opts.steps, seed, opts.lr, opts.batch)
            finals.append(f"{statistics.mean(losses[-50:]):.3f}")
            firsts.append(first_below(losses))
        print(f"| {init} | {verdict} | {' / '.join(finals)} | {' / '.join(firsts)} |", flush=True)


if __name__ == "__main__":
    main()
