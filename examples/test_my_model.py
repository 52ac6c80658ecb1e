"""Using initlint from your own test suite (the ``initlint_audit`` fixture comes with the package).

    pip install initlint
    pytest examples/test_my_model.py

The fixture audits a freshly constructed model and fails the test with a table of the
findings (code, module, measured value against the threshold, and the fix) when any of
them is a warning or an error.
"""
import pytest
import torch
import torch.nn as nn

import initlint


def make_mlp(depth: int = 8, width: int = 128, out: int = 10, kaiming: bool = True) -> nn.Sequential:
    layers = []
    for _ in range(depth):
        linear = nn.Linear(width, width)
        if kaiming:
            nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
            nn.init.zeros_(linear.bias)
        layers += [linear, nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, out))


def test_mlp_is_well_initialised(initlint_audit):
    report = initlint_audit(make_mlp(), torch.randn(32, 128))
    assert report.codes() == []


def test_default_init_is_caught():
    # PyTorch's default nn.Linear init shrinks the signal of a deep ReLU MLP; with the fixture
    # this test would fail and print the findings table. initlint.audit returns the report instead.
    report = initlint.audit(make_mlp(kaiming=False))
    assert ("IL001", "0") in report.codes()


@pytest.mark.initlint(select=["IL002"])  # only check for biases cancelled by a norm
def test_conv_block_has_no_dead_bias(initlint_audit):
    block = nn.Sequential(nn.Conv2d(3, 16, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU())
    initlint_audit(block, torch.randn(8, 3, 32, 32))


@initlint.ignore("IL001", reason="the output layer is scaled down on purpose")
class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(128, 10)
        nn.init.normal_(self.proj.weight, std=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


@pytest.mark.initlint(fail_on="error")  # report warnings, fail only on errors
def test_with_suppressed_head(initlint_audit):
    model = nn.Sequential(make_mlp(depth=4, out=128), nn.ReLU(), Head())
    report = initlint_audit(model)  # other warnings are in report.findings; they do not fail the test
    assert ("IL001", "2.proj") not in report.codes()


def test_report_assert_clean():
    # without the fixture: audit, inspect, then assert
    report = initlint.audit(make_mlp(depth=2))
    report.assert_clean()
