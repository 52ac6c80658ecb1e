"""The examples the README lists, with their expected findings; seed 004's grid cell by cell."""
import os
import sys

import pytest
import torch

import initlint
from initlint.inputs.load import resolve

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES)

# (file, class, logits) -> expected set of (code, module) for warnings and errors
EXPECTED = {
    ("naive_mlp.py", "NaiveMLP", True): {("IL001", "fc1"), ("IL001", "fc2"), ("IL001", "fc3"), ("IL004", "fc3"),
                                          ("IL005", "fc1")},
    ("kaiming_mlp.py", "KaimingMLP", True): set(),
    ("conv_bias_bn.py", "ConvBlock", False): {("IL002", "conv1")},
    ("dead_relu.py", "DeadReluNet", False): {("IL003", "act")},
    ("softmax_head.py", "SoftmaxClassifier", False): {("IL004", "head")},
    ("tanh_stack.py", "TanhStack", False): {("IL001", f"net.{i}") for i in range(0, 20, 2)} | {("IL005", "net.0")},
    ("tanh_stack.py", "TanhStackLeCun", False): set(),
    ("linear_stack.py", "ScaledStack", False): set(),
    ("linear_stack.py", "KaimingReluStack", False): set(),
}


def audit_example(filename, cls, logits):
    torch.manual_seed(0)
    [candidate] = [c for c in resolve(os.path.join(EXAMPLES, filename)) if c.name == cls]
    return initlint.audit(candidate.instantiate(), logits=logits)


def problems(report):
    return {(c, m) for f in report.findings if f.severity != "info" for c, m in [(f.code, x) for x in f.members or [f.module]]}


@pytest.mark.parametrize("key", list(EXPECTED), ids=lambda k: f"{k[1]}")
def test_example_findings(key):
    assert problems(audit_example(*key)) == EXPECTED[key]


def test_seed002_linear_stacks_behave_as_the_notebook_says():
    randn = audit_example("linear_stack.py", "RandnStack", False)
    assert "IL009" in {c for c, _ in problems(randn)}  # overflow to inf/NaN
    tiny = audit_example("linear_stack.py", "TinyStack", False)
    drift = [f for f in tiny.findings if f.code == "IL005"]
    assert drift and drift[0].value < 1e-30  # zeros everywhere after 50 layers
    relu = audit_example("linear_stack.py", "ScaledReluStack", False)
    assert {"IL001", "IL005"} <= {c for c, _ in problems(relu)}


@pytest.mark.slow  # a grid of deep models
def test_seed004_pyramid_grid():
    from pyramid import grid

    cells = {(d, a, i): codes for d, a, i, codes in grid()}
    for depth in (10, 100):
        for act in ("tanh", "relu"):
            assert cells[(depth, act, "naive")], f"naive {act} x{depth} must be flagged"
        for init in ("lecun", "glorot"):
            assert cells[(depth, "tanh", init)] == [], f"{init} tanh x{depth} must be clean"
        assert cells[(depth, "relu", "he")] == []
    for init in ("lecun", "glorot"):
        assert {"IL001", "IL005", "IL006"} <= set(cells[(100, "relu", init)])  # vanishing, forward and backward
    assert "IL006" in cells[(10, "tanh", "naive")] and "IL007" in cells[(10, "tanh", "naive")]
