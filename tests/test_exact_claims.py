"""What IL001 and IL009 state is exactly what was computed: predictions say so, measurements are exact."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import initlint
from models import mlp


class MaskedLogProbs(nn.Module):
    """Log-probabilities over classes, some of them masked out with -inf (constrained decoding)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(32, 64)
        self.head = nn.Linear(64, 10)
        self.register_buffer("allowed", torch.arange(10) < 6)

    def forward(self, x):
        logits = self.head(torch.relu(self.body(x)))
        return F.log_softmax(logits.masked_fill(~self.allowed, -math.inf), dim=-1)


def test_log_softmax_of_masked_logits_is_not_an_overflow():
    torch.manual_seed(0)
    report = initlint.audit(MaskedLogProbs(), torch.randn(8, 32))
    assert [c for c, _ in report.codes() if c == "IL009"] == []


def test_an_overflow_is_still_reported_where_it_happens():
    torch.manual_seed(0)
    model = mlp(3, width=64, init="he")
    with torch.no_grad():
        model[2].weight.mul_(1e38)
    report = initlint.audit(model, torch.randn(8, 64))
    assert ("IL009", "2") in report.codes()


def test_il001_states_its_compounded_factor_as_a_prediction_and_the_weight_scale_as_rms():
    torch.manual_seed(0)
    model = mlp(3, width=100, init="he")
    with torch.no_grad():
        model[2].weight.mul_(200)
    report = initlint.audit(model, torch.randn(8, 100))
    f = next(f for f in report.findings if f.code == "IL001" and f.module == "2")
    w = model[2].weight.detach()
    assert math.isclose(f.value, w.pow(2).mean().sqrt().item(), rel_tol=1e-5)
    assert f.message.startswith(f"weight rms {f.value:.3g} ")
    assert "predicted from the weight scales of the 2 mismatched layer(s)" in f.message  # 2 and the He-scaled head


def test_uninitialised_memory_is_not_measured():
    """``new_empty`` holds whatever was in memory (NaN at times): IL009 must never judge it."""
    import initlint as il
    import torch.nn as tnn

    class Scratch(tnn.Module):
        def __init__(self):
            super().__init__()
            self.fc = tnn.Linear(8, 8)

        def forward(self, x):
            scratch = x.new_empty(x.shape)  # may hold NaN until written
            scratch.copy_(x)
            return self.fc(scratch)

    report = il.audit(Scratch(), torch.randn(4, 8))
    empties = [op for op in report.graph if op.kind == "empty"]
    assert empties and all(op.id not in report.probe.ops or "rms" not in report.probe.ops[op.id] for op in empties)
    assert "IL009" not in {code for code, _ in report.codes()}
