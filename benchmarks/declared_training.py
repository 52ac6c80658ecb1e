"""What a declared init that never ran costs in training: nanoGPT with and without ``self.apply(self._init_weights)``.

    python benchmarks/declared_training.py [--steps 150] [--seeds 0 1 2]

The model is ``tests/declared_models.NanoGPT`` (4 layers x 128, vocabulary 512, 64 positions, the
``c_proj`` rescale applied either way), trained with AdamW (lr 1e-3, batch 16 x 64 tokens) on a
synthetic language: token sequences from a fixed random first-order Markov chain over the 512
tokens (each token has 8 likely successors), whose entropy bounds the reachable loss. It prints the
mean loss of the last 10 steps for the intact model and for the one whose declared init never ran
(IL014 flags the second and passes the first).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from declared_models import NanoGPT  # noqa: E402

VOCAB, LENGTH, BATCH = 512, 64, 16


def chain(seed: int) -> torch.Tensor:
    """Transition probabilities: each token goes to 8 successors with random weights."""
    gen = torch.Generator().manual_seed(1000 + seed)
    probs = torch.zeros(VOCAB, VOCAB)
    for token in range(VOCAB):
        successors = torch.randperm(VOCAB, generator=gen)[:8]
        probs[token, successors] = torch.rand(8, generator=gen) + 0.1
    return probs / probs.sum(1, keepdim=True)


def batch(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    tokens = [torch.randint(0, VOCAB, (BATCH,), generator=gen)]
    for _ in range(LENGTH):
        tokens.append(torch.multinomial(probs[tokens[-1]], 1, generator=gen).squeeze(1))
    return torch.stack(tokens, 1)


def train(apply_init: bool, seed: int, steps: int) -> float:
    torch.manual_seed(seed)
    model = NanoGPT(vocab=VOCAB, block_size=LENGTH, apply_init=apply_init)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probs, gen = chain(seed), torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        seq = batch(probs, gen)
        logits = model(seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return sum(losses[-10:]) / 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    for seed in args.seeds:
        intact, missing = train(True, seed, args.steps), train(False, seed, args.steps)
        print(f"seed {seed}: final loss {intact:.3f} with the declared init, {missing:.3f} without (ln V = 6.238)",
              flush=True)


if __name__ == "__main__":
    main()
