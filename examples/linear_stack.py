"""Seed 002: 50 stacked Linear(100, 100) layers with four inits, and the ReLU variants.

Expected (as the notebook describes):
- RandnStack (weights and biases ~ randn): the signal overflows -> IL009, IL001.
- TinyStack (weights 0.01 * randn, zero bias): the signal vanishes to zero -> IL005, IL001.
- ScaledStack (randn / sqrt(100), zero bias): stable, clean.
- ScaledReluStack (randn / sqrt(100) with ReLUs): vanishes -> IL001 (and IL005).
- KaimingReluStack (randn * sqrt(2 / 100) with ReLUs): stable, clean.
"""
import math

import torch
import torch.nn as nn

DEPTH, WIDTH = 50, 100


def _stack(weight_std: float, bias: str, relu: bool) -> nn.Sequential:
    layers = []
    for _ in range(DEPTH):
        layer = nn.Linear(WIDTH, WIDTH)
        nn.init.normal_(layer.weight, std=weight_std)
        if bias == "randn":
            nn.init.normal_(layer.bias)
        else:
            nn.init.zeros_(layer.bias)
        layers.append(layer)
        if relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class _Stack(nn.Module):
    """Shared forward of the variants below (a private base: initlint audits the variants)."""

    def __init__(self, weight_std: float, bias: str = "zeros", relu: bool = False) -> None:
        super().__init__()
        self.layers = _stack(weight_std, bias, relu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class RandnStack(_Stack):
    def __init__(self) -> None:
        super().__init__(1.0, "randn")


class TinyStack(_Stack):
    def __init__(self) -> None:
        super().__init__(1e-2)


class ScaledStack(_Stack):
    def __init__(self) -> None:
        super().__init__(1 / math.sqrt(WIDTH))


class ScaledReluStack(_Stack):
    def __init__(self) -> None:
        super().__init__(1 / math.sqrt(WIDTH), relu=True)


class KaimingReluStack(_Stack):
    def __init__(self) -> None:
        super().__init__(math.sqrt(2 / WIDTH), relu=True)
