"""The first step (initlint.probe.step): the optimizer's real step on a private copy, IL015, IL016, the
API's checks of optimizer / loss / precision, the CLI flags, config keys and hook, and the output."""
import copy
import json
import math
import os
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import initlint
from initlint.errors import UsageError
from initlint.probe.step import HALF

from cli_server import run_initlint
from model_state import bits, deep_state, process_state
from transformer_models import NanoGPT



def mlp(std=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    if std is not None:
        for layer in (model[0], model[2]):
            nn.init.normal_(layer.weight, std=std)
    return model


def optimizer_state(opt):
    sd = opt.state_dict()
    return (len(opt.state), [(k, {n: bits(v) if isinstance(v, torch.Tensor) else v for n, v in s.items()})
                             for k, s in sd["state"].items()],
            [{k: v for k, v in g.items()} for g in sd["param_groups"]])


# ----------------------------------------------------------------------------- nothing of the user's changes
@pytest.mark.parametrize("make", [
    lambda p: torch.optim.Adam(p, lr=1e-2),
    lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
])
def test_model_grads_optimizer_state_and_rng_are_unchanged(make):
    model, x = mlp(), torch.randn(8, 32)
    opt = make(model.parameters())
    for _ in range(2):  # an optimizer that already has state: step counts, moments, momentum buffers
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    model[0].weight.grad = torch.full_like(model[0].weight, 0.5)  # a .grad left by the user
    before_model, before_opt, before_rng = deep_state(model, x), optimizer_state(opt), process_state()
    report = initlint.audit(model, x, optimizer=opt, loss=lambda out, inputs: out.square().mean())
    assert report.step is not None and report.step.stepped
    assert deep_state(model, x) == before_model
    assert optimizer_state(opt) == before_opt
    assert process_state() == before_rng


def test_step_equals_a_real_step_of_a_copy_with_state():
    """The measured update is the update of the user's optimizer class, state and hyperparameters."""
    model, x = mlp(), torch.randn(8, 32)
    loss = lambda out, inputs: F.mse_loss(out, torch.ones_like(out))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.8, 0.95))
    for _ in range(3):
        opt.zero_grad()
        loss(model(x), x).backward()
        opt.step()
    opt.zero_grad()
    report = initlint.audit(model, x, optimizer=opt, loss=loss)
    twin, twin_opt = copy.deepcopy(model), None
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.8, 0.95))
    twin_opt.load_state_dict(opt.state_dict())
    before = {n: p.detach().clone() for n, p in twin.named_parameters()}
    loss(twin(x), x).backward()
    twin_opt.step()
    for name, p in twin.named_parameters():
        update = p.detach() - before[name]
        s = report.step.params[name]
        assert s.update_rms == pytest.approx(update.square().mean().sqrt().item(), rel=1e-4)
        assert s.ratio == pytest.approx(s.update_rms / before[name].square().mean().sqrt().item(), rel=1e-4)
    assert report.step.loss == "loss(output, inputs)"


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),
    lambda p: torch.optim.RMSprop(p, lr=1e-3),
])
def test_sampled_step_matches_the_exact_step(make, monkeypatch):
    """Elementwise optimizers step a sample of each large tensor's elements: within 3% of the exact ratio."""
    from initlint.probe import step as S

    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)), torch.randn(16, 256)
    opt = make(model.parameters())
    approx = initlint.audit(model, x, optimizer=opt, logits=True).step
    assert approx.params["0.weight"].sampled == S.SAMPLE and approx.params["2.weight"].sampled == 0
    monkeypatch.setattr(S, "SAMPLE", None)
    exact = initlint.audit(model, x, optimizer=opt, logits=True).step
    assert exact.params["0.weight"].sampled == 0
    for name in ("0.weight", "2.weight", "0.bias"):
        assert approx.params[name].ratio == pytest.approx(exact.params[name].ratio, rel=0.03)
        assert approx.params[name].weight_rms == exact.params[name].weight_rms


def test_adam_first_update_is_lr_per_entry():
    """At step one Adam moves every entry with a nonzero gradient by lr (m/sqrt(v) = sign(g))."""
    model, x = mlp(std=0.02), torch.randn(8, 32)
    report = initlint.audit(model, x, optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=1e-2), logits=True)
    s = report.step.params["2.weight"]
    assert s.update_rms == pytest.approx(1e-2, rel=0.05)
    assert s.ratio == pytest.approx(0.5, rel=0.06)
    assert report.step.loss == "cross-entropy against random labels"
    assert [g.median_ratio for g in report.step.groups][0] == pytest.approx(0.5, rel=0.1)


def test_an_optimizer_at_lr_zero_is_said_to_leave_the_first_step_unjudged():
    """A warm-up's optimizer starts at lr 0: its first step moves nothing, which is no verdict on the recipe."""
    model, x = mlp(std=1.0), torch.randn(8, 32)  # far too large an init for SGD at lr 10: IL015 at that lr
    optimizer = torch.optim.SGD(model.parameters(), lr=10.0)
    assert any(f.code == "IL015" for f in initlint.audit(model, x, optimizer=optimizer, logits=True).findings)
    warm_up = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step / 100)  # lr 0 now
    report = initlint.audit(model, x, optimizer=optimizer, logits=True)
    assert not any(f.code == "IL015" for f in report.findings) and warm_up.get_last_lr() == [0.0]
    assert [n for n in report.notes if "has lr 0" in n and "update-scale" in n]
    assert not [n for n in initlint.audit(model, x, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                          logits=True).notes if "has lr 0" in n]


def test_clipping_scales_the_first_step_as_training_does():
    """``clip_grad_norm=``: the step is taken on the gradients ``clip_grad_norm_(model.parameters(), max_norm)``
    leaves; for SGD without momentum the update shrinks by exactly its factor, and a step IL015 flags unclipped can
    pass clipped. ``clip_grad_value=`` clamps each element, as ``clip_grad_value_`` does."""
    model, x = mlp(std=0.05), torch.randn(8, 32)
    loss = lambda out, inputs: F.cross_entropy(out, torch.arange(8) % 10)
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=10.0)
    plain = initlint.audit(model, x, optimizer=sgd, loss=loss)
    clipped = initlint.audit(model, x, optimizer=sgd, loss=loss, clip_grad_norm=0.02)
    twin = copy.deepcopy(model)
    loss(twin(x), x).backward()
    total = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.02).item()
    factor = 0.02 / (total + 1e-6)
    assert factor < 0.05
    for name, p in twin.named_parameters():
        assert clipped.step.params[name].update_rms == pytest.approx(plain.step.params[name].update_rms * factor,
                                                                     rel=1e-4)
        assert clipped.step.params[name].update_rms == pytest.approx(10.0 * p.grad.square().mean().sqrt().item(),
                                                                     rel=1e-4)
    assert {f.code for f in plain.findings} == {"IL015"} and not clipped.findings
    assert clipped.step.clipping == f"clipped to norm 0.02 (their total norm {total:.3g}: scaled by {factor:.3g})"
    assert "clipped to norm 0.02" in clipped.step.lines()[0]
    by_value = initlint.audit(model, x, optimizer=sgd, loss=loss, clip_grad_value=1e-3)
    twin.zero_grad()
    loss(twin(x), x).backward()
    torch.nn.utils.clip_grad_value_(twin.parameters(), 1e-3)
    for name, p in twin.named_parameters():
        assert by_value.step.params[name].update_rms == pytest.approx(10.0 * p.grad.square().mean().sqrt().item(),
                                                                      rel=1e-4)
    assert by_value.step.clipping == "clamped to +-0.001 (clip_grad_value_)"


def test_clipping_takes_numpy_and_tensor_numbers_and_refuses_one_past_floats_range():
    model, x = mlp(), torch.randn(8, 32)
    np = pytest.importorskip("numpy")
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.1)
    for value in (np.float32(1.0), np.int64(1), torch.tensor(1.0), 1):
        assert initlint.audit(model, x, optimizer=sgd, clip_grad_norm=value).step.clipping.startswith("clipped to norm 1 ")
    with pytest.raises(UsageError, match=r"finite number above 0 .*, not 1000000000000000000000000000000000000\.\.\.$"):
        initlint.audit(model, x, optimizer=sgd, clip_grad_norm=10 ** 400)


def test_an_sgd_step_on_one_of_the_runs_batches_is_judged_by_the_least_the_runs_step_can_be():
    """``batches_per_step=k``: the run steps on the mean of k batches like the probe's. SGD's step is the gradient,
    whose noise shrinks by sqrt(k) in the mean: the warning needs the ratio over sqrt(k) above the limit, a ratio
    between is information. Adam's first step is the same on one batch as on k: judged as without it."""
    model, x = mlp(std=0.05), torch.randn(8, 32)
    loss = lambda out, inputs: F.cross_entropy(out, torch.arange(8) % 10)
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=10.0, momentum=0.9)
    plain = initlint.audit(model, x, optimizer=sgd, loss=loss, select=["IL015"])
    (worst,) = [f for f in plain.findings if f.value == max(g.value for g in plain.findings)]
    assert worst.severity == "warning" and worst.value > 2 * 0.5
    ratio = worst.value
    k = int((ratio / 0.5) ** 2 / 2)  # ratio / sqrt(k) is above the limit
    some = initlint.audit(model, x, optimizer=sgd, loss=loss, select=["IL015"], batches_per_step=k)
    same = [f for f in some.findings if f.module == worst.module]
    assert [(f.severity, f.value) for f in same] == [("warning", pytest.approx(ratio / math.sqrt(k)))]
    assert f"over {math.sqrt(k):.3g}, for the run's step on the mean of {k} such batches, where the noise of one " \
           f"batch's gradient shrinks by sqrt({k})" in same[0].message
    many = initlint.audit(model, x, optimizer=sgd, loss=loss, select=["IL015"], batches_per_step=4 * k)
    same = [f for f in many.findings if f.module == worst.module]
    assert [(f.severity, f.value) for f in same] == [("info", pytest.approx(ratio))]
    assert "the probe cannot tell" in same[0].message
    assert many.step.batches_per_step == 4 * k and many.step.linear
    assert f"the run steps on the mean of {4 * k} such batches" in many.step.lines()[0]
    adam = lambda m: torch.optim.Adam(m.parameters(), lr=0.1)
    one, four = (initlint.audit(model, x, optimizer=adam, loss=loss, select=["IL015"], batches_per_step=b)
                 for b in (1, 4 * k))
    assert not four.step.linear
    assert [(f.module, f.severity, f.value) for f in four.findings] == \
        [(f.module, f.severity, f.value) for f in one.findings] != []


def test_one_batchs_sgd_step_over_sqrt_k_is_about_the_step_on_all_k_where_the_gradient_is_noise():
    """What ``batches_per_step`` rests on: where the gradient is all noise (random labels), the first SGD step on
    each eighth of a batch is sqrt(8) times the step on the whole batch, within the draw of the batches (-25% to
    +30%), not the same: an eighth's step over sqrt(8) is the least the whole batch's is expected to be."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    x, y = torch.randn(256, 32), torch.randint(0, 10, (256,))
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    def ratios(lo: int, hi: int):
        loss = lambda out, inputs: F.cross_entropy(out, y[lo:hi])
        step = initlint.audit(model, x[lo:hi], optimizer=sgd, loss=loss, select=["IL015"]).step
        return {name: s.ratio for name, s in step.params.items() if name.endswith("weight")}

    whole = ratios(0, 256)
    parts = [ratios(32 * i, 32 * (i + 1)) for i in range(8)]
    for name in whole:
        for part in parts:
            assert 0.75 < part[name] / math.sqrt(8) / whole[name] < 1.3, name


def test_norm_clipping_eases_the_division_as_it_eases_on_the_runs_smaller_gradient():
    """Clipped to a norm the probe's gradients exceed, the run's step on the mean of k batches is about as large as
    the probe's: its smaller gradient is scaled down less. The divisor is ``max(1, c sqrt(k))`` for a clipping factor
    ``c``: here 1, and the warning stands, as the audit of the run's whole batch finds it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    k = 16
    x, y = torch.randn(16 * k, 32), torch.randint(0, 10, (16 * k,))
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=60.0)

    def audit(n: int, **settings):
        loss = lambda out, inputs: F.cross_entropy(out, y[:n])
        return initlint.audit(model, x[:n], optimizer=sgd, loss=loss, select=["IL015"], **settings)

    whole = audit(16 * k, clip_grad_norm=0.05)
    micro = audit(16, clip_grad_norm=0.05, batches_per_step=k)
    assert micro.step.clip_factor * math.sqrt(k) < 1
    assert [(f.severity, f.module) for f in whole.findings] == [("warning", "2")]
    assert [(f.severity, f.module, f.value) for f in micro.findings] == \
        [("warning", "2", micro.step.params["2.weight"].ratio)]
    ratio = micro.step.params["2.weight"].ratio
    assert ratio / math.sqrt(k) <= 0.5 < ratio  # divided by sqrt(k), the clipped step would have been information
    clamped = audit(16, clip_grad_value=1e-3, batches_per_step=k)  # each element clamped: judged as the probe took it
    assert clamped.step.clip_factor is None
    assert [f.value for f in clamped.findings] == [s.ratio for n, s in clamped.step.params.items()
                                                   if n.endswith("weight") and s.ratio > 0.5]


def test_findings_of_one_code_are_grouped_by_severity():
    """Layers whose SGD step is above the limit however large the run's batch, and layers the probe cannot tell: one
    run of warnings and the information apart, not one warning over both."""
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(6))
            self.head = nn.Linear(64, 10)
            for i, layer in enumerate(self.layers):  # larger weights, smaller steps relative to them
                nn.init.normal_(layer.weight, std=0.02 * (1 + i))

        def forward(self, x):
            for layer in self.layers:
                x = x + layer(x)
            return self.head(x)

    torch.manual_seed(0)
    model, x, y = Residual(), torch.randn(16, 64), torch.randint(0, 10, (16,))
    report = initlint.audit(model, x, select=["IL015"], batches_per_step=16,
                            loss=lambda out, _: F.cross_entropy(out, y),
                            optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=4.0))
    assert {(f.severity, f.module) for f in report.findings} >= {("warning", "layers.{0..3}"), ("info", "layers.4")}
    for f in report.findings:
        for member in f.members or [f.module]:
            ratio = report.step.params[f"{member}.weight"].ratio
            assert (ratio / 4 > 0.5) == (f.severity == "warning"), (member, ratio)


def test_batches_per_step_of_one_needs_no_optimizer():
    model, x = mlp(), torch.randn(8, 32)
    assert initlint.audit(model, x, batches_per_step=1).step is None


@pytest.mark.parametrize("value", [0, -2, 1.5, "3", True, float("inf"), 2 ** 21])
def test_bad_batches_per_step_is_a_usage_error(value):
    model, x = mlp(), torch.randn(8, 32)
    with pytest.raises(UsageError, match="batches_per_step must be a whole number from 1"):
        initlint.audit(model, x, optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1), batches_per_step=value)
    with pytest.raises(UsageError, match="no optimizer was given"):
        initlint.audit(model, x, batches_per_step=2)


def test_the_private_step_runs_no_global_optimizer_hook():
    """A hook registered for every optimizer (a user's logging) does not see the audit's private step, and is
    still registered after it."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    seen = []
    handle = register_optimizer_step_post_hook(lambda opt, args, kwargs: seen.append(type(opt).__name__))
    try:
        model, x = mlp(), torch.randn(8, 32)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        assert initlint.audit(model, x, optimizer=opt).step.stepped and seen == []
        model(x).sum().backward()
        opt.step()
        assert seen == ["AdamW"]
    finally:
        handle.remove()


@pytest.mark.parametrize("settings, words", [
    ({"clip_grad_norm": -1.0}, "clip_grad_norm must be a finite number above 0"),
    ({"clip_grad_norm": float("nan")}, "clip_grad_norm must be a finite number above 0"),
    ({"clip_grad_value": True}, "clip_grad_value must be a finite number above 0"),
    ({"clip_grad_norm": "1"}, "clip_grad_norm must be a finite number above 0"),
    ({"clip_grad_norm": 1.0, "clip_grad_value": 1.0}, "were both given"),
])
def test_bad_clipping_is_a_usage_error(settings, words):
    model, x = mlp(), torch.randn(8, 32)
    with pytest.raises(UsageError, match=words):
        initlint.audit(model, x, optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1), **settings)
    with pytest.raises(UsageError, match="no optimizer was given"):
        initlint.audit(model, x, clip_grad_norm=1.0)


def test_half_parameters_report_the_lost_share():
    model, x = mlp(), torch.randn(8, 32)
    model = model.to(torch.bfloat16)
    report = initlint.audit(model, x.to(torch.bfloat16),
                            optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=1e-6))
    assert report.step.params["0.weight"].dtype == "bfloat16"
    assert report.step.params["0.weight"].lost > 0.99  # 1e-6 * gradient is far below half a bf16 ulp
    model32 = mlp()
    report32 = initlint.audit(model32, x, optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=1e-6))
    assert report32.step.params["0.weight"].lost == 0.0
    assert torch.bfloat16 in HALF


# ----------------------------------------------------------------------------- bad input: one sentence
@pytest.mark.parametrize("optimizer, words", [
    (lambda m: torch.optim.Adam(nn.Linear(3, 3).parameters()), "holds none of the model's parameters"),
    (3, "must be a torch.optim.Optimizer"),
    ("Adam", "must be a torch.optim.Optimizer"),
    (lambda m: 1 / 0, "optimizer(model) raised ZeroDivisionError"),
    (lambda m: "adam", "returned str"),
    (lambda m: torch.optim.SGD(m.parameters(), lr=float("nan")), "lr nan"),
])
def test_bad_optimizers_are_usage_errors(optimizer, words):
    model, x = mlp(), torch.randn(8, 32)
    before = deep_state(model, x)
    with pytest.raises(UsageError, match=None) as info:
        initlint.audit(model, x, optimizer=optimizer)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert deep_state(model, x) == before


def test_nan_lr_set_after_construction_is_refused():
    model, x = mlp(), torch.randn(8, 32)
    opt = torch.optim.Adam(model.parameters())
    opt.param_groups[0]["lr"] = float("nan")
    with pytest.raises(UsageError, match="lr nan"):
        initlint.audit(model, x, optimizer=opt)


@pytest.mark.parametrize("precision, words", [("fp8", "fp16, bf16 or None"), (16, "fp16, bf16 or None")])
def test_bad_precisions_are_usage_errors(precision, words):
    with pytest.raises(UsageError, match=words):
        initlint.audit(mlp(), torch.randn(8, 32), precision=precision)


def test_precision_the_device_cannot_autocast_is_a_usage_error(monkeypatch):
    from initlint import api

    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    with pytest.raises(UsageError, match="cannot autocast"):
        api.check_precision("bf16", False, torch.device("cpu"))


def test_precision_and_grad_scaler_reach_the_rules():
    from initlint.rules.base import AuditContext

    seen = {}
    original = AuditContext.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.update(precision=self.precision, grad_scaler=self.grad_scaler)

    AuditContext.__init__ = spy
    try:
        initlint.audit(mlp(), torch.randn(8, 32), precision="float16", grad_scaler=True)
    finally:
        AuditContext.__init__ = original
    assert seen == {"precision": "fp16", "grad_scaler": True}
    with pytest.raises(UsageError, match="grad_scaler"):
        initlint.audit(mlp(), torch.randn(8, 32), grad_scaler="yes")


def test_loss_errors_are_usage_errors():
    model, x = mlp(), torch.randn(8, 32)
    adam = lambda m: torch.optim.Adam(m.parameters())
    with pytest.raises(UsageError, match="loss.output, inputs. raised KeyError"):
        initlint.audit(model, x, optimizer=adam, loss=lambda out, inputs: {}["x"])
    with pytest.raises(UsageError, match="scalar"):
        initlint.audit(model, x, optimizer=adam, loss=lambda out, inputs: out)
    with pytest.raises(UsageError, match="pass optimizer= or precision= too"):
        initlint.audit(model, x, loss=lambda out, inputs: out.sum())


# ----------------------------------------------------------------------------- IL015 on real models
def _gpt():
    torch.manual_seed(0)
    return NanoGPT(vocab=256, dim=128, heads=4, layers=4, block=32), torch.randint(0, 256, (4, 32))


def test_nanogpt_adam_1e2_flags_every_block_and_1e3_passes():
    model, x = _gpt()
    hot = initlint.audit(model, x, optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), select=["IL015"])
    flagged = {m for c, m in hot.codes() if c == "IL015"}
    assert {f"transformer.h.{i}.attn.c_proj" for i in range(4)} <= flagged
    assert "lm_head" in flagged or "transformer.wte" in flagged
    assert len(hot.findings) < len(flagged)  # runs of blocks are grouped
    assert any("lr = " in f.fix for f in hot.findings)
    ok = initlint.audit(model, x, optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), select=["IL015"])
    assert ok.codes() == []
    ratio = ok.step.params["transformer.h.0.attn.c_proj.weight"].ratio
    assert ratio == pytest.approx(1e-3 / (0.02 / math.sqrt(8)), rel=0.1)  # ~0.14, nanoGPT's usual setting


def test_hf_gpt2_and_llama_from_config():
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32))
    ids = torch.randint(0, 128, (2, 16))
    report = initlint.audit(gpt2, {"input_ids": ids, "labels": ids},
                            optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=6e-4, weight_decay=0.1))
    assert report.step.loss == "the model's loss" and report.step.stepped
    assert not [c for c in report.codes() if c[0] in ("IL015", "IL016")]
    llama = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=128))
    report = initlint.audit(llama, {"input_ids": ids}, optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=3e-2))
    assert report.step.loss == "cross-entropy against random labels"
    assert {m for c, m in report.codes() if c == "IL015"} >= {"model.layers.0.mlp.down_proj"}


def test_cnn_with_batch_norm_and_lstm():
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(),
                        nn.Linear(16 * 8 * 8, 10))
    x = torch.randn(16, 3, 8, 8)
    before = deep_state(cnn, x)  # BN running statistics included
    report = initlint.audit(cnn, x, optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                            logits=True)
    assert deep_state(cnn, x) == before
    assert report.step.stepped and "1.weight" in report.step.params  # the BN gain is stepped, not judged
    assert not [c for c in report.codes() if c[0] in ("IL015", "IL016")]
    lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
    report = initlint.audit(lstm, torch.randn(4, 10, 16), optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=1e-3))
    assert report.step.stepped and "weight_hh_l1" in report.step.params
    assert not [c for c in report.codes() if c[0] in ("IL015", "IL016")]
    hot = initlint.audit(lstm, torch.randn(4, 10, 16), optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=0.1))
    assert ("IL015", "") in hot.codes()  # an LSTM's weights are the root module's


def test_zero_initialised_weight_is_judged_against_a_sound_init():
    model, x = mlp(std=0.02), torch.randn(8, 32)
    nn.init.zeros_(model[2].weight)
    report = initlint.audit(model, x, optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=0.1), select=["IL015"])
    zero = [f for f in report.findings if f.module == "2"]
    assert zero and "1/sqrt(fan_in) = 0.125" in zero[0].message
    assert zero[0].value == pytest.approx(0.1 * 8, rel=0.1)  # update rms 0.1 over 1/sqrt(64)


def test_limit_option():
    model, x = mlp(std=0.02), torch.randn(8, 32)
    adam = lambda m: torch.optim.Adam(m.parameters(), lr=1e-2)
    assert initlint.audit(model, x, optimizer=adam, rule_options={"IL015": {"limit": 0.6}}).codes() == []


# ----------------------------------------------------------------------------- IL016
def test_stale_doubly_held_and_frozen_parameters():
    model, x = mlp(), torch.randn(8, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model[2] = nn.Linear(64, 10)  # replaced after the optimizer was built: the old head is held, the new one not
    report = initlint.audit(model, x, optimizer=opt)
    codes = report.codes()
    assert ("IL016", "") in codes and ("IL016", "2") in codes
    stale = [f for f in report.findings if f.module == ""][0]
    assert "2 tensor(s)" in stale.message
    model, opt = mlp(), None
    model[0].bias.requires_grad_(False)
    opt = torch.optim.SGD([{"params": [model[0].weight, model[0].bias]}, {"params": [model[2].weight, model[2].bias]}],
                          lr=0.01)
    opt.param_groups[1]["params"].append(model[0].weight)  # slips past the constructor's check
    report = initlint.audit(model, x, optimizer=opt)
    found = {(f.module, f.severity, "twice" in f.message or "more than once" in f.message) for f in report.findings
             if f.code == "IL016"}
    assert ("0", "warning", True) in found and ("0", "info", False) in found


def test_unused_module_is_information_without_optimizer_and_a_warning_under_ddp():
    from initlint.rules.il016_not_optimized import ClassifierWithLeftoverHead

    torch.manual_seed(0)
    model, x = ClassifierWithLeftoverHead(), torch.randn(8, 32)
    report = initlint.audit(model, x)
    assert [(f.code, f.module, f.severity) for f in report.findings if f.code == "IL016"] == [("IL016", "old_head", "info")]
    assert report.clean
    import torch.distributed as dist
    import socket

    with socket.socket() as free:  # a port no other test process holds
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        report = initlint.audit(ddp, x)
    finally:
        dist.destroy_process_group()
    assert [(f.module, f.severity) for f in report.findings if f.code == "IL016"] == [("old_head", "warning")]
    assert "DistributedDataParallel stops on it" in report.findings[0].message


# ----------------------------------------------------------------------------- output
def test_text_and_json_carry_the_step():
    from initlint.output.formats import FORMATS

    def render(reports, fmt):
        return FORMATS[fmt](reports)

    model, x = mlp(std=0.02), torch.randn(8, 32)
    opt = torch.optim.AdamW([{"params": [model[0].weight, model[2].weight], "weight_decay": 0.1},
                             {"params": [model[0].bias, model[2].bias], "weight_decay": 0.0}], lr=3e-2)
    report = initlint.audit(model, x, optimizer=opt)
    text = render([report], "text")
    assert "param group 0: lr 0.03, weight decay 0.1, 2 tensors (2,688 parameters), median update ratio 1.4" in text
    assert "param group 1: lr 0.03, weight decay 0" in text
    data = json.loads(render([report], "json"))
    step = data["results"][0]["step"]
    assert step["optimizer"] == "AdamW" and step["params"]["0.weight"]["ratio"] == pytest.approx(1.5, rel=0.1)
    for fmt in ("sarif", "github", "concise"):
        assert "IL015" in render([report], fmt)
    for notebook in (report._repr_html_(), report._repr_markdown_()):
        assert "param group 1: lr 0.03, weight decay 0, 2 tensors" in notebook


def test_plot_series_gain_the_update_ratio(tmp_path):
    model, x = mlp(std=0.02), torch.randn(8, 32)
    report = initlint.audit(model, x, optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=1e-2))
    pytest.importorskip("matplotlib")
    series = report.plot(str(tmp_path / "p.png"))
    assert len(series["update ratio"]) == 2 and max(series["update ratio"].values) == pytest.approx(0.5, rel=0.1)


# ----------------------------------------------------------------------------- CLI, config, hook
def run_cli(*args, cwd):
    return run_initlint(list(args), cwd=str(cwd))


MODEL = textwrap.dedent("""
    import torch, torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(64, 128)
            self.fc2 = nn.Linear(128, 10)
            for layer in (self.fc1, self.fc2):
                nn.init.normal_(layer.weight, std=0.02)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))
""")


@pytest.mark.slow  # eight command-line runs
def test_cli_flags_config_and_hook(tmp_path):
    (tmp_path / "m.py").write_text(MODEL)
    hot = run_cli("check", "m.py", "--optimizer", "Adam(lr=3e-2)", "--input-shape", "8,64", "--format", "concise",
                  cwd=tmp_path)
    assert hot.returncode == 1 and hot.stdout.count("IL015") == 2, hot.stdout + hot.stderr
    bad = run_cli("check", "m.py", "--optimizer", "Adam(lr=", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not valid syntax" in bad.stderr
    bad = run_cli("check", "m.py", "--precision", "fp8", cwd=tmp_path)
    assert bad.returncode == 2 and "'fp8' is not one of 'fp16', 'bf16'" in bad.stderr
    unknown = run_cli("check", "m.py", "--optimizer", "Adamm(lr=1e-2)", "--input-shape", "8,64", cwd=tmp_path)
    assert unknown.returncode == 2 and "no optimizer named Adamm" in unknown.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.initlint]\noptimizer = "SGD(lr=1e-3)"\nprecision = "bf16"\n'
                                             'input-shape = "8,64"\n')
    calm = run_cli("check", "m.py", "--format", "json", cwd=tmp_path)
    result = json.loads(calm.stdout)["results"][0]
    assert calm.returncode == 0 and result["step"]["optimizer"] == "SGD"
    flag_wins = run_cli("check", "m.py", "--optimizer", "Adam(lr=3e-2)", "--format", "concise", cwd=tmp_path)
    assert flag_wins.returncode == 1 and "IL015" in flag_wins.stdout
    (tmp_path / "pyproject.toml").write_text('[tool.initlint]\noptimizer = "Adam(lr=[)"\n')
    broken = run_cli("check", "m.py", cwd=tmp_path)
    assert broken.returncode == 2 and "not valid syntax" in broken.stderr
    (tmp_path / "pyproject.toml").unlink()
    (tmp_path / "h.py").write_text(MODEL + textwrap.dedent("""
        def initlint_optimizer(model):
            return torch.optim.SGD(model.fc1.parameters(), lr=1e-3)
    """))
    hooked = run_cli("check", "h.py", "--input-shape", "8,64", "--format", "concise", cwd=tmp_path)
    assert hooked.returncode == 1 and "IL016 [fc2]" in hooked.stdout, hooked.stdout + hooked.stderr
    clipped = run_cli("check", "m.py", "--optimizer", "SGD(lr=1e-3)", "--clip-grad-norm", "0.5", "--input-shape",
                      "8,64", "--format", "json", cwd=tmp_path)
    assert clipped.returncode == 0 and json.loads(clipped.stdout)["results"][0]["step"]["clipping"].startswith(
        "clipped to norm 0.5"), clipped.stdout + clipped.stderr
    for flags, words in ((("--clip-grad-norm", "-1"), "--clip-grad-norm must be a finite number above 0, not -1.0"),
                         (("--clip-grad-norm", "1", "--clip-grad-value", "1"), "were both given"),
                         (("--clip-grad-value", "1", "--input-shape", "8,64"), "no optimizer was given")):
        bad = run_cli("check", "m.py", *flags, cwd=tmp_path)
        assert bad.returncode == 2 and words in bad.stderr, bad.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.initlint]\nclip-grad-norm = 1.0\noptimizer = "SGD(lr=1e-3)"\n'
                                             'input-shape = "8,64"\n')
    by_value = run_cli("check", "m.py", "--clip-grad-value", "0.5", "--format", "json", cwd=tmp_path)
    assert by_value.returncode == 0 and json.loads(by_value.stdout)["results"][0]["step"]["clipping"] == \
        "clamped to +-0.5 (clip_grad_value_)", by_value.stdout + by_value.stderr  # the flag replaces the file's way
    (tmp_path / "pyproject.toml").write_text('[tool.initlint]\nclip-grad-norm = 0\n')
    bad = run_cli("check", "m.py", cwd=tmp_path)
    assert bad.returncode == 2 and "clip-grad-norm" in bad.stderr and "a finite number above 0" in bad.stderr
    (tmp_path / "pyproject.toml").unlink()
    accumulated = run_cli("check", "m.py", "--optimizer", "SGD(lr=1e-3)", "--batches-per-step", "8", "--input-shape",
                          "8,64", "--format", "json", cwd=tmp_path)
    assert accumulated.returncode == 0 and json.loads(accumulated.stdout)["results"][0]["step"]["batches_per_step"] \
        == 8, accumulated.stdout + accumulated.stderr
    for flags, words in ((("--batches-per-step", "0"), "--batches-per-step must be an integer of at least 1"),
                         (("--batches-per-step", "2", "--input-shape", "8,64"), "no optimizer was given")):
        bad = run_cli("check", "m.py", *flags, cwd=tmp_path)
        assert bad.returncode == 2 and words in bad.stderr, bad.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.initlint]\nbatches-per-step = 4\noptimizer = "SGD(lr=1e-3)"\n'
                                             'input-shape = "8,64"\n')
    from_file = run_cli("check", "m.py", "--format", "json", cwd=tmp_path)
    assert json.loads(from_file.stdout)["results"][0]["step"]["batches_per_step"] == 4, from_file.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.initlint]\nbatches-per-step = 1\ninput-shape = "8,64"\n')
    default = run_cli("check", "m.py", cwd=tmp_path)  # the default needs no optimizer
    assert default.returncode == 0, default.stdout + default.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.initlint]\nbatches-per-step = 1.5\n')
    bad = run_cli("check", "m.py", cwd=tmp_path)
    assert bad.returncode == 2 and "batches-per-step" in bad.stderr and "an integer of at least 1" in bad.stderr


@pytest.mark.parametrize("conv", [nn.Conv2d, nn.ConvTranspose2d])
def test_weights_feeding_a_batchnorm_are_not_judged_but_those_without_one_are(conv):
    """A conv (or transposed conv) whose output goes straight into a BatchNorm is scale-invariant: Adam at 3e-2
    moves it by 0.6 of its rms and IL015 stays silent; without the BatchNorm the same step is flagged."""
    def net(norm):
        torch.manual_seed(0)
        return nn.Sequential(conv(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16) if norm else nn.Identity(),
                             nn.ReLU(), conv(16, 16, 3, padding=1, bias=False),
                             nn.BatchNorm2d(16) if norm else nn.Identity(), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(16, 10))

    adam = lambda m: torch.optim.Adam(m.parameters(), lr=3e-2)  # noqa: E731
    x = torch.randn(8, 3, 16, 16)
    with_norm = initlint.audit(net(True), x, optimizer=adam, select=["IL015"])
    without = initlint.audit(net(False), x, optimizer=adam, select=["IL015"])
    assert max(s.ratio for n, s in with_norm.step.params.items() if n == "3.weight") > 0.5
    assert with_norm.codes() == []
    assert ("IL015", "3") in without.codes()


def test_a_ratio_just_past_the_limit_never_reads_as_the_limit():
    """AdamW at lr 1e-2 moves weights of std 0.02 by about 0.5 of their rms: the findings that pass the limit by a
    hair print enough digits to show it (0.5003, not 0.5, against the limit 0.5)."""
    from initlint.rules.base import fmt_beyond

    assert [fmt_beyond(x, 0.5) for x in (0.5003, 0.501, 1.42, 0.5)] == ["0.5003", "0.501", "1.42", "0.5"]
    assert fmt_beyond(4.00004, 4.0) == "4.00004" and fmt_beyond(0.009999, 0.01) == "0.009999"
    model, x = mlp(std=0.02), torch.randn(16, 32)
    adam = lambda m: torch.optim.Adam(m.parameters(), lr=1e-2)
    ratio = initlint.audit(model, x, optimizer=adam, logits=True).step.params["2.weight"].ratio
    limit = ratio * (1 - 1e-4)  # passed by a hair: both print alike at 3 digits
    assert f"{ratio:.3g}" == f"{limit:.3g}"
    report = initlint.audit(model, x, optimizer=adam, logits=True, rule_options={"IL015": {"limit": limit}})
    (finding,) = [f for f in report.findings if f.code == "IL015" and f.module == "2"]
    shown = finding.message.split("moves it by ")[1].split(" of its rms")[0]
    assert float(shown) > float(f"{limit:.7g}") and shown != f"{limit:.3g}", finding.message
