"""Published architectures at their real widths and vocabularies (``tests/zoo_real.py``).

Each one is audited at its default init and must give no warning; then one of its layers is
corrupted and the finding must name exactly that layer; and its gradient statistics taken from
weight products must equal the formed gradients'. One build serves the three tests: the
fixture is parametrised per model at module scope, so pytest runs a model's tests
together and frees the model before building the next.
"""
import gc

import pytest
import torch

from zoo_real import ZOO, audit, build

pytestmark = pytest.mark.slow  # real widths and vocabularies: about a minute on 2 cores


@pytest.fixture(scope="module", params=list(ZOO))
def zoo_model(request):
    model, inputs = build(request.param)
    yield request.param, model, inputs
    del model, inputs
    gc.collect()


def test_default_init_gives_no_warning(zoo_model):
    name, model, inputs = zoo_model
    report = audit(model, inputs)
    assert report.error is None
    assert report.probe.forward_ran and report.probe.backward_ran
    corrupted = ZOO[name].corrupt.path
    assert corrupted in {op.module for op in report.graph if op.params}, "the corrupted layer must be seen"
    assert [(f.code, f.module, f.message) for f in report.findings if f.severity != "info"] == []


def test_corrupted_layer_is_found_at_its_module(zoo_model):
    name, model, inputs = zoo_model
    entry = ZOO[name]
    weight = model.get_submodule(entry.corrupt.path).weight
    saved = weight.detach().clone()
    entry.corrupt(model)
    try:
        report = audit(model, inputs)
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert entry.expect in report.codes(), (str(entry.corrupt), report.codes())


def test_gradient_statistics_equal_the_formed_gradients(zoo_model, monkeypatch):
    """The backward probe takes most weights' gradient statistics from their products (no gradient
    formed); at real widths and vocabularies they agree with the formed gradients summed in float64."""
    from initlint.probe import run as R

    name, model, inputs = zoo_model
    chosen = set()
    original = R._by_products

    def spy(graph, c, weights):
        found = original(graph, c, weights)
        chosen.update(found)
        return found

    with monkeypatch.context() as m:
        m.setattr(R, "_by_products", spy)
        report = audit(model, inputs)
    with monkeypatch.context() as m:
        m.setattr(R, "_by_products", lambda graph, c, weights: {})
        m.setattr(R, "_acc", lambda t: torch.float64)
        reference = audit(model, inputs)
    assert set(report.probe.grads) == set(reference.probe.grads) and report.probe.grads
    assert chosen, "a weight product read"
    for weight, stats in report.probe.grads.items():
        ref = reference.probe.grads[weight]
        # a formed gradient's norm is summed in float32 by the probe: up to 1e-3 off on tens of millions of entries
        tol = 1e-5 if weight in chosen else 1e-3
        assert abs(stats.rms - ref.rms) <= tol * ref.rms and abs(stats.std - ref.std) <= tol * ref.rms, weight
        assert abs(stats.mean - ref.mean) <= tol * ref.rms, weight
