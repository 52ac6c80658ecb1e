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
