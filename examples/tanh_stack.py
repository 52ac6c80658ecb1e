"""Seed 003: ten tanh layers of width 500 with weights 0.01 * randn: the activations shrink
layer after layer towards zero. Expected: IL001 on the hidden layers, IL005.
The same network with LeCun init (TanhStackLeCun) is clean."""
import torch
import torch.nn as nn


def _tanh_stack(std_of) -> nn.Sequential:
    layers = []
    for i in range(10):
        layer = nn.Linear(500, 500 if i < 9 else 1)
        nn.init.normal_(layer.weight, std=std_of(500))
        nn.init.zeros_(layer.bias)
        layers += [layer, nn.Tanh()]
    return nn.Sequential(*layers)


class TanhStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _tanh_stack(lambda fan_in: 0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TanhStackLeCun(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _tanh_stack(lambda fan_in: fan_in ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
