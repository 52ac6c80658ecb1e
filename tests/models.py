"""Small models built from code for the rule and capture tests."""
from __future__ import annotations

from typing import Callable, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp(depth: int, width: int = 128, act: Callable[[], nn.Module] = nn.ReLU, init: Optional[str] = None,
        out: int = 10) -> nn.Sequential:
    """``depth`` hidden Linear+act layers and a Linear head; ``init`` in (None, 'he', 'lecun', 'randn')."""
    layers: List[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), act()]
    layers.append(nn.Linear(width, out))
    model = nn.Sequential(*layers)
    for m in model:
        if isinstance(m, nn.Linear) and init is not None:
            with torch.no_grad():
                if init == "he":
                    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                elif init == "lecun":
                    nn.init.kaiming_normal_(m.weight, nonlinearity="linear")
                elif init == "randn":
                    nn.init.normal_(m.weight)
                m.bias.zero_()
    return model


def he_head(model: nn.Sequential) -> nn.Sequential:
    """Give the last Linear the identity-gain (LeCun) scale."""
    with torch.no_grad():
        nn.init.kaiming_normal_(model[-1].weight, nonlinearity="linear")
    return model


class FunctionalNet(nn.Module):
    """Activations written as F.relu, torch.tanh and tensor methods."""

    def __init__(self, std: Optional[float] = None) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)
        self.c = nn.Linear(64, 64)
        self.head = nn.Linear(64, 4)
        for layer in (self.a, self.b, self.c, self.head):
            if std is not None:
                nn.init.normal_(layer.weight, std=std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.a(x))
        x = self.b(x).relu()
        x = torch.relu(self.c(x))
        return self.head(x)


class FunctionalBN(nn.Module):
    """A Linear with bias feeding F.batch_norm."""

    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 16, bias=bias)
        self.register_buffer("mean", torch.zeros(16))
        self.register_buffer("var", torch.ones(16))
        self.out = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.batch_norm(self.fc(x), self.mean, self.var, training=True)
        return self.out(F.relu(h))


class Untraceable(nn.Module):
    """fx cannot trace the data-dependent branch; conv+bias feeds BatchNorm; ReLU is in-place."""

    def __init__(self, dead_bias: float = 0.0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 64)
        self.out = nn.Linear(64, 10)
        nn.init.constant_(self.fc.bias, dead_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.conv(x))
        if h.mean() > 1e6:  # data-dependent control flow
            h = h * 0.5
        h = torch.relu(h).mean(dim=(2, 3))
        z = self.fc(h)
        z.relu_()
        return self.out(z)


class Residual(nn.Module):
    """Pre-norm residual blocks whose last layer is zero-initialised (deliberate)."""

    def __init__(self, blocks: int = 4, width: int = 64) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(blocks))
        self.up = nn.ModuleList(nn.Linear(width, 4 * width) for _ in range(blocks))
        self.down = nn.ModuleList(nn.Linear(4 * width, width) for _ in range(blocks))
        for layer in self.down:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, up, down in zip(self.norms, self.up, self.down):
            x = x + down(F.gelu(up(norm(x))))
        return self.head(x)


def relu_pyramid_width(init: str, depth: int, width: int = 256) -> nn.Sequential:
    """A square deep ReLU MLP (for compounding tests)."""
    return he_head(mlp(depth, width, init=init)) if init == "he" else mlp(depth, width, init=init)
