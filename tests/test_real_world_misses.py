"""Regressions found on code nobody here wrote: frozen BatchNorm backbones (IL002), an LSTM over packed
sequences (IL005), example inputs on the meta device, and convolutions with most filters exactly zero."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import initlint
from initlint.errors import UsageError


def test_meta_example_inputs_are_probed_with_values_of_their_shapes():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    inputs = torch.randn(16, 32, device="meta")
    report = initlint.audit(model, inputs)
    assert report.error is None and report.probe.forward_ran
    assert any("example inputs are on the meta device" in n for n in report.notes)
    assert inputs.device.type == "meta" and model[0].weight.device.type == "meta"


def test_meta_token_ids_are_refused_in_one_sentence():
    with torch.device("meta"):
        model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8))
    with pytest.raises(UsageError, match="on the meta device, which holds no values"):
        initlint.audit(model, torch.zeros(2, 4, dtype=torch.long, device="meta"))


class FrozenBNBackbone(nn.Module):
    """An mmdetection-style backbone: ``norm_eval=True`` keeps its BatchNorm in eval mode while training."""

    def __init__(self, norm_eval: bool) -> None:
        super().__init__()
        self.norm_eval = norm_eval
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def train(self, mode: bool = True) -> "FrozenBNBackbone":
        super().train(mode)
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.eval()
        return self

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean((2, 3)))


def test_bias_before_a_frozen_batchnorm_is_not_cancelled():
    x = torch.randn(4, 3, 16, 16)
    frozen = FrozenBNBackbone(norm_eval=True).eval()
    assert ("IL002", "conv1") not in initlint.audit(frozen, x).codes()
    assert frozen.training is False and frozen.bn1.training is False  # the user's modes are left alone
    assert ("IL002", "conv1") in initlint.audit(FrozenBNBackbone(norm_eval=False), x).codes()


class PackedTagger(nn.Module):
    """An LSTM over a ``pack_padded_sequence``: the LSTM makes its zero initial state inside its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.lstm = nn.LSTM(32, 64, batch_first=True)
        self.out = nn.Linear(64, 5)

    def forward(self, ids, lengths):
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        packed = pack_padded_sequence(self.emb(ids), lengths, batch_first=True, enforce_sorted=False)
        y, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True)
        return self.out(y)


def test_lstm_zero_initial_state_is_not_a_vanishing_signal():
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (4, 12), generator=torch.Generator().manual_seed(0))
    report = initlint.audit(PackedTagger(), (ids, torch.tensor([12, 9, 7, 3])))
    zeros = [op for op in report.graph if op.target == "torch.zeros"]
    assert zeros and report.probe.ops[zeros[0].id].rms == 0  # the state the old judgement ended at
    assert [c for c, _ in report.codes() if c == "IL005"] == []


def zero_filter_net(bias: bool, zero: bool = True) -> nn.Module:
    """torch-audit's demo_cv: a conv with 13 of its 16 filters exactly zero, then BatchNorm and ReLU."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=bias), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    if zero:
        with torch.no_grad():
            model[0].weight[3:].zero_()
    return model


@pytest.mark.parametrize("bias", [False, True])
def test_zero_filters_in_front_of_batchnorm_are_reported_with_their_cause(bias):
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    report = initlint.audit(zero_filter_net(bias), x)
    found = [f for f in report.findings if f.code == "IL008"]
    assert [f.module for f in found] == ["0"]
    assert found[0].message.startswith("13 of the 16 filters of 0.weight are exactly zero and feed")
    assert ("frozen" in found[0].message) != bias and ("rounding noise" in found[0].message) == bias
    assert ("IL008", "0") not in initlint.audit(zero_filter_net(bias, zero=False), x).codes()
