"""Seed 004's experiment grid: the contracting pyramid at 10 and 100 layers, tanh and ReLU,
with naive U(-1, 1), LeCun, Glorot and He init (uniform variants, zero biases).

Each layer keeps 96% of the previous width (1000 -> 5 after 100 layers), and a final
Linear(width, 1) gives a scalar output. Run this file to print initlint's verdict per cell:
    python examples/pyramid.py
"""
import math
import sys
from typing import Dict, List, Tuple

import torch
import torch.nn as nn

INITS = ("naive", "lecun", "glorot", "he")

# The seed's own conclusions, cell by cell.
SEED_VERDICT: Dict[Tuple[int, str, str], str] = {}
for _depth in (10, 100):
    for _act in ("tanh", "relu"):
        SEED_VERDICT[(_depth, _act, "naive")] = "unstable"
    SEED_VERDICT[(_depth, "relu", "he")] = "stable"
    SEED_VERDICT[(_depth, "tanh", "he")] = "not run in the seed"
    SEED_VERDICT[(_depth, "tanh", "lecun")] = SEED_VERDICT[(_depth, "tanh", "glorot")] = "stable"
SEED_VERDICT[(100, "relu", "lecun")] = SEED_VERDICT[(100, "relu", "glorot")] = "vanishing"
SEED_VERDICT[(10, "relu", "lecun")] = SEED_VERDICT[(10, "relu", "glorot")] = "not run in the seed"
SEED_VERDICT[(10, "relu", "he")] = "not run in the seed"


def pyramid(n_layers: int, activation: str, init: str, hidden_start: int = 1000, ratio: float = 0.96) -> nn.Sequential:
    """The contracting pyramid with the named activation and uniform init."""
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    layers: List[nn.Module] = []
    width = hidden_start
    for _ in range(n_layers):
        nxt = int(width * ratio)
        layers += [nn.Linear(width, nxt), act()]
        width = nxt
    layers.append(nn.Linear(width, 1))
    return uniform_init(nn.Sequential(*layers), init)


def uniform_init(model: nn.Sequential, init: str) -> nn.Sequential:
    """The seed's uniform inits, in place: ``naive`` U(-1, 1), ``lecun`` sqrt(3 / fan_in), ``glorot``
    sqrt(6 / (fan_in + fan_out)), ``he`` sqrt(6 / fan_in); zero biases."""
    for m in model:
        if isinstance(m, nn.Linear):
            fan_out, fan_in = m.weight.shape
            limit = {"naive": 1.0, "lecun": math.sqrt(3 / fan_in), "glorot": math.sqrt(6 / (fan_in + fan_out)),
                     "he": math.sqrt(6 / fan_in)}[init]
            with torch.no_grad():
                nn.init.uniform_(m.weight, -limit, limit)
                nn.init.zeros_(m.bias)
    return model


def grid() -> List[Tuple[int, str, str, List[str]]]:
    """(depth, activation, init, sorted finding codes) for every cell."""
    import initlint

    rows = []
    for depth in (10, 100):
        for activation in ("tanh", "relu"):
            for init in INITS:
                torch.manual_seed(0)
                report = initlint.audit(pyramid(depth, activation, init))
                rows.append((depth, activation, init, sorted({f.code for f in report.findings if f.severity != "info"})))
    return rows


if __name__ == "__main__":
    from tabulate import tabulate

    table = [[d, a, i, ", ".join(codes) or "clean", SEED_VERDICT[(d, a, i)]] for d, a, i, codes in grid()]
    print(tabulate(table, headers=["layers", "activation", "init", "initlint", "seed 004"], tablefmt="github"))
    sys.exit(0)
