"""A hidden layer whose large negative bias kills its ReLU units. Expected: IL003 on act."""
import torch
import torch.nn as nn


class DeadReluNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(128, 10)
        nn.init.kaiming_normal_(self.fc1.weight, nonlinearity="relu")
        nn.init.constant_(self.fc1.bias, -4.0)  # pre-activations ~N(-4, 1.4^2): nearly all negative

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))
