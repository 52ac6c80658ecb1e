"""Published architectures at their real widths and vocabularies (``tests/zoo_real.py``).

Each one is audited at its default init and must give no warning; then one of its layers is
corrupted and the finding must name exactly that layer. One build serves both tests: the
fixture is parametrised per model at module scope, so pytest runs a model's two tests
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
