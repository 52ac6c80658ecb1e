"""Seed 000: a 3-layer ReLU MLP whose weights are drawn from randn (std 1).

Expected: IL001 on fc1, fc2 and fc3 (init far too large), IL005 (the signal explodes), and
with --logits IL004 on fc3 (the softmax of the output is one-hot).
    initlint check examples/naive_mlp.py --logits
"""
import torch
import torch.nn as nn


class NaiveMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(200, 1000, bias=False)
        self.fc2 = nn.Linear(1000, 1000, bias=False)
        self.fc3 = nn.Linear(1000, 100, bias=False)
        for layer in (self.fc1, self.fc2, self.fc3):
            nn.init.normal_(layer.weight)  # std 1 regardless of fan-in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)
