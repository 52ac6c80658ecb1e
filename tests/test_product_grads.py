"""The backward probe's gradient statistics taken from weight products, against formed gradients.

Without a step, the probe asks autograd for the gradients of the products' outputs instead of their
weights, and takes each weight's gradient norm and mean from those and the products' inputs
(``initlint.probe.products._product_grads``). These tests hold the figures to the formed gradients'
(their norms summed in float64) and check which weights take which path."""
from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.nn as nn

from initlint.capture.fx import FxCapture
from initlint.capture.runtime import RuntimeCapture
from initlint.probe import run as R

WIDTH, VOCAB = 256, 600


class Mixed(nn.Module):
    """Every form of weight product the probe reads, and weights it must leave to autograd."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, padding_idx=0)
        self.fc = nn.Linear(WIDTH, 2 * WIDTH)  # its 3-D output is written in place
        self.proj_w = nn.Parameter(torch.randn(2 * WIDTH, WIDTH) * 0.03)  # GPT-2's Conv1D: addmm(b, x, W)
        self.proj_b = nn.Parameter(torch.zeros(WIDTH))
        self.shared = nn.Linear(WIDTH, WIDTH)  # called twice
        self.rot = nn.Parameter(torch.randn(WIDTH, WIDTH) * 0.05)  # x @ W.t()
        self.narrow = nn.Linear(WIDTH, 4)  # more rows than its gradient has entries' worth: formed
        self.reg = nn.Linear(WIDTH, WIDTH)  # also read outside a product: formed
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: a lookup and a product of one weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        h = self.fc(x)
        h.relu_()
        x = x + torch.addmm(self.proj_b, h.reshape(-1, 2 * WIDTH), self.proj_w).view_as(x)
        x = self.shared(torch.tanh(self.shared(x)))
        x = x @ self.rot.t()
        x = self.reg(x) + 1e-3 * self.reg.weight.sum()
        return self.head(x) + self.narrow(x).sum(-1, keepdim=True)


IDS = torch.randint(0, VOCAB, (4, 12), generator=torch.Generator().manual_seed(0))
IDS[0, :5] = 0  # padding: its embedding row gets no gradient
IDS[1, :4] = 7  # a repeated id: its row sums several gradients


def probe(capture, model, monkeypatch, products=True):
    """The probe's gradient statistics, and the names of the weights taken from products. The reference
    (``products=False``) forms every gradient and sums its norm in float64."""
    chosen = {}
    original = R._by_products

    def spy(graph, c, weights):
        chosen.update(original(graph, c, weights) if products else {})
        return chosen

    with monkeypatch.context() as m:
        m.setattr(R, "_by_products", spy)
        if not products:
            m.setattr(R, "_acc", lambda t: torch.float64)
        result = R.run_probe(capture(model), (IDS,), {})
    return result.grads, set(chosen)


def assert_same(grads, reference):
    assert set(grads) == set(reference)
    for name, stats in grads.items():
        ref = reference[name]
        assert stats["rms"] == pytest.approx(ref["rms"], rel=1e-6), name
        assert stats["std"] == pytest.approx(ref["std"], rel=1e-6), name
        assert abs(stats["mean"] - ref["mean"]) <= 1e-6 * ref["rms"], name


@pytest.mark.parametrize("capture", [RuntimeCapture, FxCapture], ids=["runtime", "fx"])
def test_gradient_statistics_from_products_equal_the_formed_gradients(capture, monkeypatch):
    torch.manual_seed(0)
    model = Mixed()
    grads, chosen = probe(capture, model, monkeypatch)
    reference, _ = probe(capture, model, monkeypatch, products=False)
    assert_same(grads, reference)
    expected = {"embed.weight", "fc.weight", "proj_w", "shared.weight"}
    if capture is RuntimeCapture:
        expected.add("rot")  # fx sees W.t() as a separate node: its product is left to autograd
    assert chosen == expected
    assert {"narrow.weight", "reg.weight"} <= set(grads)  # formed, and measured all the same


class Convs(nn.Module):
    """2-D convolutions: strided and dilated, 1x1, a rectangular kernel called twice, a reflect-padded one
    (the runtime capture sees ``F.pad`` then ``conv2d``); and those whose gradient stays formed: a first
    layer with more output positions than its gradient has entries' worth, ``padding="same"``, grouped."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv2d(3, 64, 3, padding=1)
        self.strided = nn.Conv2d(64, 128, 3, stride=2, padding=2, dilation=2)
        self.point = nn.Conv2d(128, 256, 1)
        self.twice = nn.Conv2d(256, 256, (3, 1), padding=(1, 0), bias=False)
        self.same = nn.Conv2d(256, 256, 3, padding="same")
        self.grouped = nn.Conv2d(256, 256, 3, padding=1, groups=4)
        self.reflect = nn.Conv2d(256, 256, 3, padding=1, padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.first(x))
        x = torch.relu(self.strided(x))
        x = self.twice(self.point(x))
        x = self.twice(torch.tanh(x))
        return self.reflect(self.grouped(self.same(x)))


IMAGES = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("capture", [RuntimeCapture, FxCapture], ids=["runtime", "fx"])
def test_convolution_gradients_from_unfolded_products_equal_the_formed_gradients(capture, monkeypatch):
    torch.manual_seed(0)
    model = Convs()
    monkeypatch.setattr(sys.modules[__name__], "IDS", IMAGES)
    grads, chosen = probe(capture, model, monkeypatch)
    reference, _ = probe(capture, model, monkeypatch, products=False)
    assert_same({n: s for n, s in grads.items() if n in chosen}, {n: reference[n] for n in chosen})
    for name in set(grads) - chosen:  # formed: their float32 norms of up to 590k entries are the less exact
        assert grads[name]["rms"] == pytest.approx(reference[name]["rms"], rel=1e-4), name
    expected = {"strided.weight", "point.weight", "twice.weight"}
    if capture is RuntimeCapture:
        expected.add("reflect.weight")  # fx keeps the module call, whose input is not yet padded
    assert chosen == expected
    assert {"first.weight", "same.weight", "grouped.weight"} <= set(grads)  # formed, and measured all the same


def test_weights_taken_from_products_are_not_asked_of_autograd(monkeypatch):
    torch.manual_seed(0)
    model = Mixed()
    asked = []
    grad = R.grad_without_dropout

    def recording(outputs, inputs, *args, **kwargs):
        asked.extend(inputs)
        return grad(outputs, inputs, *args, **kwargs)

    monkeypatch.setattr(R, "grad_without_dropout", recording)
    _, chosen = probe(RuntimeCapture, model, monkeypatch)
    named = dict(model.named_parameters())
    asked_params = {id(t) for t in asked if isinstance(t, torch.Tensor)}
    assert chosen and not any(id(named[n]) in asked_params for n in chosen)
    assert id(named["reg.weight"]) in asked_params and id(named["narrow.weight"]) in asked_params


def test_an_overflowing_gradient_is_measured_as_the_formed_one(monkeypatch):
    """50 Linear(256, 256) layers drawn at std 1 (seed 002's RandnStack, wider): the signal overflows
    float32 and so do the gradients. Their Gram products would give NaN (inf - inf) where the formed
    gradient's norm is inf, and the reverse; such weights are formed from the kept products after the
    transfer, so the figures are the formed gradients' (inf stays inf, NaN stays NaN)."""
    torch.manual_seed(0)
    layers = [nn.Linear(WIDTH, WIDTH) for _ in range(50)]
    for layer in layers:
        nn.init.normal_(layer.weight)
        nn.init.normal_(layer.bias)
    model = nn.Sequential(*layers)
    x = torch.randn(8, WIDTH)
    chosen = {}
    original = R._by_products

    def spy(graph, c, weights):
        chosen.update(original(graph, c, weights))
        return chosen

    with monkeypatch.context() as m:
        m.setattr(R, "_by_products", spy)
        grads = R.run_probe(RuntimeCapture(model), (x,), {}).grads
    with monkeypatch.context() as m:
        m.setattr(R, "_by_products", lambda graph, c, weights: {})
        formed = R.run_probe(RuntimeCapture(model), (x,), {}).grads
    assert len(chosen) == 50
    overflowed = [n for n, s in formed.items() if not math.isfinite(s["rms"])]
    assert {"inf", "nan"} <= {repr(formed[n]["rms"]) for n in overflowed}  # both kinds occur
    for name, stats in grads.items():
        ref = formed[name]
        if name in overflowed:
            assert repr(stats["rms"]) == repr(ref["rms"]), name
        else:
            assert stats["rms"] == pytest.approx(ref["rms"], rel=1e-4), name


class Stack(nn.Module):
    """Layers of one shape, each used in one product: their gradients are measured in one batch; one layer
    of another shape and one used twice are measured alone."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(5))
        self.wide = nn.Linear(WIDTH, 2 * WIDTH)
        self.twice = nn.Linear(2 * WIDTH, 2 * WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.twice(torch.tanh(self.twice(self.wide(x))))


@pytest.mark.parametrize("capture", [RuntimeCapture, FxCapture], ids=["runtime", "fx"])
def test_layers_of_one_shape_are_measured_in_one_batch_as_the_formed_gradients(capture, monkeypatch):
    from initlint.probe import products as P

    torch.manual_seed(0)
    model = Stack()
    x = torch.randn(4, 12, WIDTH)
    batches = []
    original = P._batched_grads
    monkeypatch.setattr(P, "_batched_grads", lambda c, items, *a: batches.append([n for n, _, _ in items])
                        or original(c, items, *a))

    def grads(products: bool):
        with monkeypatch.context() as m:
            if not products:
                m.setattr(R, "_by_products", lambda graph, c, weights: {})
                m.setattr(R, "_acc", lambda t: torch.float64)
            return R.run_probe(capture(model), (x,), {}).grads

    measured = grads(True)
    assert batches == [[f"layers.{i}.weight" for i in range(5)]]
    assert_same(measured, grads(False))
