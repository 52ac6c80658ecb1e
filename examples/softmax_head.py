"""A classifier with an explicit softmax and an oversized head init. Expected: IL004 on head."""
import torch
import torch.nn as nn


class SoftmaxClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 256), nn.LayerNorm(256), nn.ReLU())
        self.head = nn.Linear(256, 10)
        nn.init.normal_(self.head.weight, std=1.0)  # logits with std ~11
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.head(self.body(x)))
