"""Activation checkpointing: the audit of a checkpointed model measures what the plain model's does.

Training recipes at hundreds of tokens turn it on (Hugging Face's ``gradient_checkpointing_enable()``,
``torch.utils.checkpoint``), and the callbacks audit that model. The checkpointed forward runs again in the
backward probe, where dropout must stay off as it was in the probe's forward; reentrant checkpointing
runs its forward without autograd and differentiates only through ``.backward()``.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import initlint


def _figures(report: initlint.Report) -> dict:
    """Every measured statistic of the weights and gradients, and of the ops by module and kind."""
    out = {}
    probe = report.probe
    for scope in ("params", "grads"):
        for name, stats in getattr(probe, scope).items():
            for field in dataclasses.fields(stats):
                value = getattr(stats, field.name)
                if isinstance(value, float):
                    out[(scope, name, field.name)] = value
    for op in report.graph:
        stats = probe.ops.get(op.id)
        if stats is None:
            continue
        for field in dataclasses.fields(stats):
            value = getattr(stats, field.name)
            if isinstance(value, float):
                out.setdefault(("ops", op.module, op.kind, field.name), []).append(value)
    return out


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        other = b[key]
        pairs = zip(value, other) if isinstance(value, list) else [(value, other)]
        if isinstance(value, list):
            assert len(value) == len(other), key
        for x, y in pairs:
            assert (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-12), (key, x, y)


def _gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_embd=64, n_layer=3, n_head=4, vocab_size=256, n_positions=64,
                                     resid_pdrop=0.1, attn_pdrop=0.1, embd_pdrop=0.1)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_hugging_face_model_with_gradient_checkpointing_gets_the_plain_models_audit(reentrant):
    model = _gpt2()
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "use_cache": False}  # checkpointing turns the cache off: compare like with like
    plain = initlint.audit(model, batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    flags = {name: m.gradient_checkpointing for name, m in model.named_modules() if hasattr(m, "gradient_checkpointing")}
    assert any(flags.values())
    report = initlint.audit(model, batch)
    assert report.error is None and not report.notes
    assert len(report.probe.grads) == len(plain.probe.grads) > 0
    _assert_same(_figures(plain), _figures(report))
    assert [(f.code, f.module, f.message) for f in report.findings] == \
        [(f.code, f.module, f.message) for f in plain.findings]
    assert flags == {name: m.gradient_checkpointing for name, m in model.named_modules()
                     if hasattr(m, "gradient_checkpointing")}  # the model keeps its checkpointing


class _Block(nn.Module):
    def __init__(self, width: int = 32, branch: bool = False) -> None:
        super().__init__()
        self.branch = branch
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.branch and x.sum() > 1e9:  # data-dependent: fx cannot trace it, the runtime capture runs it
            x = x * 0
        return x + self.down(self.drop(torch.relu(self.up(self.norm(x)))))  # the product saves dropout's output


class _Checkpointed(nn.Module):
    def __init__(self, reentrant, branch: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.blocks = nn.ModuleList(_Block(branch=branch) for _ in range(3))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) if self.reentrant is None else checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


@pytest.mark.parametrize("branch", [False, True], ids=["fx", "runtime"])
def test_torch_checkpoint_without_reentrancy_gets_the_plain_models_audit(branch):
    torch.manual_seed(0)
    model = _Checkpointed(None, branch)
    x = torch.randn(4, 16, 32)
    plain = initlint.audit(model, x)
    model.reentrant = False
    report = initlint.audit(model, x)
    assert report.capture == plain.capture == ("runtime" if branch else "fx")
    assert len(report.probe.grads) == 7 and not report.notes
    _assert_same(_figures(plain), _figures(report))


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
def test_reentrant_checkpointing_traced_by_fx_is_replayed_with_autograd_on():
    torch.manual_seed(0)
    model = _Checkpointed(None, branch=False)
    x = torch.randn(4, 16, 32)
    plain = initlint.audit(model, x)
    model.reentrant = True
    report = initlint.audit(model, x)
    assert report.capture == "fx" and not report.probe.untracked
    assert len(report.probe.grads) == 7
    _assert_same(_figures(plain), _figures(report))


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
def test_reentrant_checkpointing_the_runtime_capture_cannot_follow_is_said_not_taken_for_no_grad():
    torch.manual_seed(0)
    model = _Checkpointed(True, branch=True)
    report = initlint.audit(model, torch.randn(4, 16, 32))
    assert report.capture == "runtime"
    assert set(report.probe.grads) == {"head.weight"}
    assert not report.probe.untracked  # not the model's own no_grad: no finding is demoted for it
    note, = [n for n in report.notes if "reentrant activation checkpointing" in n]
    assert "6 weight(s)" in note and "'blocks.0.down.weight'" in note and "use_reentrant=False" in note


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_streamed_model_with_gradient_checkpointing_gets_the_plain_models_audit(reentrant):
    """A model built on the meta device is audited block by block on a working copy, which recomputes each
    block itself: its checkpointing is off there, and the model keeps it."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=256, attention_dropout=0.1)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    batch = {"input_ids": torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0)), "use_cache": False}
    plain = initlint.audit(model, batch, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    report = initlint.audit(model, batch, device="cpu")
    assert "audited block by block" in report.notes[0]
    assert [(f.code, f.module, f.message) for f in report.findings] == \
        [(f.code, f.module, f.message) for f in plain.findings]
    assert len(report.probe.grads) == len(plain.probe.grads) > 0
    for name, grad in plain.probe.grads.items():
        assert report.probe.grads[name].rms == pytest.approx(grad.rms, rel=1e-5), name
    assert all(m.gradient_checkpointing for m in model.model.layers)



@pytest.mark.slow
def test_every_real_size_zoo_model_that_can_checkpoint_audits_checkpointed_as_plain():
    """Every model of the real-size zoo that can checkpoint (transformers' ``gradient_checkpointing_enable``,
    reentrant or not; diffusers' ``enable_gradient_checkpointing``): the findings, the measured gradients and the
    notes of the plain model."""
    import zoo_real

    checked = []
    for name in zoo_real.ZOO:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, inputs = zoo_real.build(name)
        if getattr(model, "supports_gradient_checkpointing", False):
            modes = [lambda: model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}),
                     lambda: model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})]
        elif getattr(model, "_supports_gradient_checkpointing", False):
            modes = [model.enable_gradient_checkpointing]
        else:
            continue
        plain = zoo_real.audit(model, inputs)
        for enable in modes:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                enable()
            report = zoo_real.audit(model, inputs)
            assert report.codes() == plain.codes(), name
            assert report.probe.grads.keys() == plain.probe.grads.keys(), name
            assert report.notes == plain.notes, name
        checked.append(name)
    assert len(checked) >= 23, checked  # 20 transformers models and diffusers' UNet, VAE and DiT
