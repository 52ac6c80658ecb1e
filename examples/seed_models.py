"""The bad inits of the trainability benchmark (``benchmarks/bench_trainability.py``).

Each is a model whose init initlint flags; ``initlint fix`` repairs it:
    initlint fix examples/seed_models.py:DeadConvNet

- ``DeadConvNet``: a conv net whose second conv has a bias of -4 (IL003, dead units).
- ``DefaultReluMLP``: 20 Linear+ReLU layers at PyTorch's default init (IL001, IL005, IL006).
- ``HotSoftmaxHead``: a softmax classifier whose head weights are scaled x30 (IL004).
- ``PostNormResidualMLP``: post-norm residual MLP blocks whose branches, every layer within 4x a
  sound init, dwarf the normalised stream (IL012).
- ``narrow_pyramid(depth, activation, init)``: seed 004's contracting pyramid, narrower
  (from 320 units instead of 1000, down to 5 after 100 layers) so that training it takes
  seconds; the inits are those of ``pyramid.py``.

The other seed models are ``NaiveMLP`` (``naive_mlp.py``) and ``RandnStack``
(``linear_stack.py``).
"""
import math
from typing import List, Optional

import torch
import torch.nn as nn

from pyramid import uniform_init  # the seed's uniform inits, shared with pyramid.py


class DeadConvNet(nn.Module):
    """Two 3x3 convs, 8x8 average pooling and a linear head at PyTorch's default init, except that
    the second conv's bias is -4: its ReLU units are dead for every input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(8)
        self.head = nn.Linear(32 * 8 * 8, 10)
        nn.init.constant_(self.conv2.bias, -4.0)  # default-init weights: pre-activations ~N(-4, 0.6^2), all negative

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.head(torch.flatten(self.pool(x), 1))


class DefaultReluMLP(nn.Module):
    """20 Linear(256, 256)+ReLU layers and a Linear(256, 10) head, left at PyTorch's default init
    (std 1/sqrt(3 fan_in): the signal's second moment shrinks 6x per layer)."""

    def __init__(self, depth: int = 20, width: int = 256) -> None:
        super().__init__()
        layers: List[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


class HotSoftmaxHead(nn.Module):
    """A softmax classifier at default init, except that its head weights are multiplied by 30."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.head = nn.Linear(256, 10)
        with torch.no_grad():
            self.head.weight.mul_(30.0)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.head(self.body(x)))


def narrow_pyramid(depth: int, activation: str, init: str, start: int = 320, ratio: float = 0.96) -> nn.Sequential:
    """Seed 004's pyramid with widths ``round(start * ratio**k)`` (320 -> 5 over 100 layers),
    a final ``Linear(width, 1)``, uniform inits (naive, lecun, glorot, he) and zero biases."""
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    widths = [max(1, round(start * ratio ** k)) for k in range(depth + 1)]
    layers: List[nn.Module] = []
    for fan_in, fan_out in zip(widths, widths[1:]):
        layers += [nn.Linear(fan_in, fan_out), act()]
    layers.append(nn.Linear(widths[-1], 1))
    return uniform_init(nn.Sequential(*layers), init)


class PostNormBlock(nn.Module):
    """``LN(x + fc2(relu(fc1(x))))``: fc1 at He's init, fc2 at 2.5 / sqrt(fan_in), within the 4x of a
    sound init that IL012 tolerates per layer, yet the branch (rms ~2.4) dwarfs the normalised stream."""

    def __init__(self, width: int, fc2: Optional[nn.Linear] = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = fc2 or nn.Linear(4 * width, width)
        self.norm = nn.LayerNorm(width)
        nn.init.kaiming_normal_(self.fc1.weight, nonlinearity="relu")
        if fc2 is None:
            nn.init.normal_(self.fc2.weight, std=2.5 / math.sqrt(4 * width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(torch.relu(self.fc1(x))))


class PostNormResidualMLP(nn.Module):
    """An input layer, ``depth`` :class:`PostNormBlock` s and a linear head on 16 features; with
    ``share_last`` the last block reuses the one before's ``fc2``."""

    def __init__(self, depth: int = 4, width: int = 128, share_last: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(16, width)
        blocks = [PostNormBlock(width) for _ in range(depth - 1)]
        blocks.append(PostNormBlock(width, fc2=blocks[-1].fc2 if share_last else None))
        self.blocks = nn.Sequential(*blocks)
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x)))
