"""One corrupted layer in Hugging Face GPT-2 at GPT-2 small's real width (768, vocabulary 50257):
the findings name the corrupted layer, and no help text sends the user to a healthy one.

Training with these corruptions: benchmarks/gpt2_corrupt_layer.py (docs/benchmarks.md).
"""
import logging
import re

import pytest
import torch

import initlint

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()
logging.getLogger("transformers").setLevel(logging.ERROR)

pytestmark = pytest.mark.slow  # builds a 2-block GPT-2 small (about 50 M parameters) and audits it three times

C_FC, C_ATTN = "transformer.h.1.mlp.c_fc", "transformer.h.0.attn.c_attn"


def _audit(model: torch.nn.Module) -> initlint.Report:
    ids = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(0))
    return initlint.audit(model, {"input_ids": ids})


@pytest.fixture(scope="module")
def reports():
    """The intact model's report, and one per layer redrawn from N(0, 1) (27.7x 1/sqrt(768)); the model
    is built once and each corruption undone before the next."""
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=768, n_head=12, vocab_size=50257))
    found = {None: _audit(model)}
    for name in (C_FC, C_ATTN):
        weight = model.get_submodule(name).weight
        intact = weight.detach().clone()
        with torch.no_grad():
            weight.normal_(0.0, 1.0)
        found[name] = _audit(model)
        with torch.no_grad():
            weight.copy_(intact)
    return found


def named_in_help(report) -> set:
    """Modules whose parameters a finding's fix names (``model.transformer.h[1].mlp.c_fc.weight``)."""
    paths = set()
    for f in report.findings:
        for path in re.findall(r"model((?:\.\w+|\[\d+\])+)\.(?:weight|bias)\b", f.fix):
            paths.add(re.sub(r"\[(\d+)\]", r".\1", path).lstrip("."))
    return paths


def test_the_intact_twin_is_clean(reports):
    assert reports[None].codes() == []


def test_an_over_scaled_c_fc_is_named_and_its_healthy_c_proj_is_not(reports):
    report = reports[C_FC]
    assert set(report.codes()) == {("IL006", C_FC), ("IL012", C_FC)}
    assert named_in_help(report) == {C_FC}
    fix = next(f.fix for f in report.findings if f.code == "IL012")
    # back to the scale of the same layer in the other block (GPT-2's 0.02)
    assert fix.startswith("nn.init.normal_(model.transformer.h[1].mlp.c_fc.weight, std=0.02)")


def test_an_over_scaled_c_attn_is_named_by_the_attention_and_residual_rules(reports):
    report = reports[C_ATTN]
    assert set(report.codes()) == {("IL011", C_ATTN), ("IL012", C_ATTN)}
    assert named_in_help(report) == {C_ATTN}
    # the first branch on the embedding: information, as every drowned embedding (no measured harm)
    assert next(f.severity for f in report.findings if f.code == "IL012") == "info"
