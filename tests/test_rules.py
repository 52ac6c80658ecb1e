"""Each rule on a bad and a good fixture; findings are compared as (code, module) pairs."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import initlint
from models import FunctionalBN, FunctionalNet, Residual, he_head, mlp


def codes(report, code):
    return {m for c, m in report.codes() if c == code}


def linears(model):
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]


# ----------------------------------------------------------------------------- IL001
def test_il001_default_init_passes_in_a_shallow_relu_net():
    torch.manual_seed(0)
    assert codes(initlint.audit(mlp(1)), "IL001") == set()


def test_il001_default_init_flagged_when_it_compounds_in_a_deep_relu_net():
    torch.manual_seed(0)
    model = mlp(8)
    assert codes(initlint.audit(model), "IL001") == set(linears(model))


def test_il001_he_init_is_clean_even_deep():
    torch.manual_seed(0)
    assert codes(initlint.audit(he_head(mlp(16, init="he"))), "IL001") == set()


def test_il001_randn_init_flagged_with_measured_and_expected_std():
    torch.manual_seed(0)
    model = mlp(2, width=256, init="randn")
    report = initlint.audit(model)
    found = {f.module: f for f in report.findings if f.code == "IL001"}
    assert set(found) == {"0", "2", "4"}
    first = found["0"]
    assert first.value == pytest.approx(1.0, rel=0.05)
    assert first.threshold == pytest.approx(math.sqrt(2 / 256), rel=1e-6)
    assert 'kaiming_normal_(model[0].weight, nonlinearity="relu")' in first.fix


@pytest.mark.parametrize("gain", [1.0, 5 / 3])
def test_il001_tanh_accepts_lecun_and_pytorch_gain(gain):
    torch.manual_seed(0)
    model = mlp(30, width=128, act=nn.Tanh)
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=gain / math.sqrt(m.in_features))
    assert codes(initlint.audit(model), "IL001") == set()


def test_il001_is_normalisation_aware():
    torch.manual_seed(0)
    layers = []
    for _ in range(10):
        lin = nn.Linear(64, 64)
        nn.init.normal_(lin.weight, std=0.001)  # far too small, but BatchNorm follows
        layers += [lin, nn.BatchNorm1d(64), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(64, 10))
    assert codes(initlint.audit(model), "IL001") == set()


def test_il001_reads_functional_and_method_activations():
    torch.manual_seed(0)
    report = initlint.audit(FunctionalNet(std=1.0))
    assert {"a", "b", "c"} <= codes(report, "IL001")


def test_il001_small_residual_branches_are_not_flagged():
    torch.manual_seed(0)
    model = Residual()
    for layer in model.up:
        nn.init.normal_(layer.weight, std=0.02)  # GPT-2 style behind LayerNorm
    assert initlint.audit(model).clean


def test_il001_exploding_residual_branch_is_flagged():
    torch.manual_seed(0)
    model = Residual(blocks=2)
    nn.init.normal_(model.up[0].weight, std=30.0)  # 150x the GELU scale, inside a residual branch
    report = initlint.audit(model)
    assert codes(report, "IL001") == {"up.0"}


# ----------------------------------------------------------------------------- IL002
def test_il002_conv_bias_before_batchnorm():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, bias=False),
                          nn.BatchNorm2d(8), nn.ReLU())
    report = initlint.audit(model)
    assert codes(report, "IL002") == {"0"}
    assert "bias=False" in next(f.fix for f in report.findings if f.code == "IL002")


def test_il002_linear_bias_before_batchnorm1d_and_functional_batch_norm():
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.1), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    assert codes(initlint.audit(model), "IL002") == {"0"}
    assert codes(initlint.audit(FunctionalBN()), "IL002") == {"fc"}
    assert codes(initlint.audit(FunctionalBN(bias=False)), "IL002") == set()


@pytest.mark.parametrize("between", ["relu", "layernorm", "groupnorm", "shared"])
def test_il002_not_flagged_when_the_bias_survives(between):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.gn = nn.GroupNorm(2, 8)

        def forward(self, x):
            h = self.conv(x)
            if between == "relu":
                return self.bn(torch.relu(h))
            if between == "groupnorm":
                return self.gn(h)
            if between == "layernorm":
                return F.layer_norm(h, h.shape[1:])
            return self.bn(h) + h  # the conv output has a second user

    assert codes(initlint.audit(Net()), "IL002") == set()


def test_il002_linear_on_a_sequence_into_batchnorm1d_needs_the_channel_axis():
    class Seq(nn.Module):
        def __init__(self, transpose):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.bn = nn.BatchNorm1d(8)
            self.transpose = transpose

        def forward(self, x):  # x: (N, L, 8)
            h = self.fc(x)
            return self.bn(h.transpose(1, 2) if self.transpose else h)

    x = torch.randn(4, 8, 8)
    assert codes(initlint.audit(Seq(True), x), "IL002") == {"fc"}
    # without the transpose BatchNorm1d normalises over L, not over the bias's axis
    assert codes(initlint.audit(Seq(False), x), "IL002") == set()


# ----------------------------------------------------------------------------- IL003
def test_il003_negative_bias_kills_units():
    torch.manual_seed(0)
    fc = nn.Linear(64, 128)
    nn.init.constant_(fc.bias, -5.0)
    model = nn.Sequential(fc, nn.ReLU(), nn.Linear(128, 10))
    report = initlint.audit(model)
    assert codes(report, "IL003") == {"1"}
    finding = next(f for f in report.findings if f.code == "IL003")
    assert finding.value > 0.9 and "nn.init.zeros_(model[0].bias)" in finding.fix


def test_il003_healthy_relu_layers_are_clean_although_half_their_outputs_are_zero():
    torch.manual_seed(0)
    report = initlint.audit(he_head(mlp(6, init="he")))
    relu = next(op for op in report.graph if op.kind == "relu")
    assert report.probe.ops[relu.id]["dead"] / int(report.probe.ops[relu.id]["units"]) < 0.1
    assert codes(report, "IL003") == set()


def test_il003_channels_of_conv_maps_count_as_units():
    conv = nn.Conv2d(3, 16, 3, padding=1)
    with torch.no_grad():
        conv.bias[:12] = -50.0  # 12 of 16 channels dead
    model = nn.Sequential(conv, nn.ReLU())
    report = initlint.audit(model)
    relu = next(op for op in report.graph if op.kind == "relu")
    assert int(report.probe.ops[relu.id]["units"]) == 16 and report.probe.ops[relu.id]["dead"] == 12


def test_il003_needs_enough_observations_per_unit():
    fc = nn.Linear(64, 128)
    nn.init.constant_(fc.bias, -5.0)
    model = nn.Sequential(fc, nn.ReLU())
    assert codes(initlint.audit(model, torch.randn(2, 64)), "IL003") == set()


# ----------------------------------------------------------------------------- IL004
def test_il004_oversized_head_saturates_explicit_softmax():
    torch.manual_seed(0)
    head = nn.Linear(256, 10)
    nn.init.normal_(head.weight, std=1.0)
    model = nn.Sequential(nn.Linear(32, 256), nn.LayerNorm(256), nn.ReLU(), head, nn.Softmax(dim=-1))
    assert codes(initlint.audit(model), "IL004") == {"3"}


def test_il004_logits_flag_and_healthy_head():
    torch.manual_seed(0)
    bad = mlp(2, width=256, init="randn")
    assert codes(initlint.audit(bad), "IL004") == set()  # not declared logits, no softmax op
    assert codes(initlint.audit(bad, logits=True), "IL004") == {"4"}
    good = he_head(mlp(2, width=256, init="he"))
    assert codes(initlint.audit(good, logits=True), "IL004") == set()


def test_il004_causal_attention_softmax_is_not_saturated():
    class Causal(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(32, 32)
            self.k = nn.Linear(32, 32)

        def forward(self, x):
            scores = self.q(x) @ self.k(x).transpose(1, 2) / math.sqrt(32)
            mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
            return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)

    assert codes(initlint.audit(Causal(), torch.randn(4, 6, 32)), "IL004") == set()


# ----------------------------------------------------------------------------- IL005 / IL009
def test_il005_and_il009_on_randn_linear_stack():
    torch.manual_seed(0)
    layers = [nn.Linear(100, 100) for _ in range(50)]
    for layer in layers:
        nn.init.normal_(layer.weight)
    report = initlint.audit(nn.Sequential(*layers))
    nonfinite = [f for f in report.findings if f.code == "IL009"]
    assert nonfinite and nonfinite[0].severity == "error"
    assert int(nonfinite[0].module) < 50


def test_il005_vanishing_and_link_to_il001():
    torch.manual_seed(0)
    layers = [nn.Linear(100, 100) for _ in range(30)]
    for layer in layers:
        nn.init.normal_(layer.weight, std=0.01)
        nn.init.zeros_(layer.bias)
    report = initlint.audit(nn.Sequential(*layers))
    drift = [f for f in report.findings if f.code == "IL005"]
    assert [f.module for f in drift] == ["0"]
    assert drift[0].value < 1e-10
    assert any(ref.startswith("IL001") for ref in drift[0].caused_by)


def test_il005_clean_on_he_mlp():
    torch.manual_seed(0)
    assert codes(initlint.audit(he_head(mlp(30, init="he"))), "IL005") == set()


# ----------------------------------------------------------------------------- IL006
def test_il006_leaves_existing_grads_alone_and_flags_naive_tanh():
    import sys, os
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    from pyramid import pyramid

    torch.manual_seed(0)
    model = pyramid(10, "tanh", "naive")
    model[0].weight.grad = torch.ones_like(model[0].weight)
    report = initlint.audit(model)
    assert "IL006" in {c for c, _ in report.codes()}
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight))
    assert model[2].weight.grad is None


def test_il006_not_fooled_by_global_pooling_before_a_head():
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    assert codes(initlint.audit(model), "IL006") == set()


# ----------------------------------------------------------------------------- IL007
def test_il007_saturated_tanh():
    torch.manual_seed(0)
    layer = nn.Linear(500, 500)
    nn.init.normal_(layer.weight, std=0.2)
    model = nn.Sequential(layer, nn.Tanh(), nn.Linear(500, 1))
    report = initlint.audit(model)
    assert codes(report, "IL007") == {"1"}
    assert 'nonlinearity="tanh"' in next(f.fix for f in report.findings if f.code == "IL007")


def test_il007_clean_with_xavier():
    torch.manual_seed(0)
    layer = nn.Linear(500, 500)
    nn.init.xavier_normal_(layer.weight)
    assert codes(initlint.audit(nn.Sequential(layer, nn.Tanh(), nn.Linear(500, 1))), "IL007") == set()


# ----------------------------------------------------------------------------- IL008
def test_il008_constant_and_zero_hidden_layers():
    torch.manual_seed(0)
    model = he_head(mlp(3, width=64, init="he"))
    nn.init.constant_(model[0].weight, 0.1)
    nn.init.zeros_(model[2].weight)
    report = initlint.audit(model)
    assert codes(report, "IL008") == {"0", "2"}
    constant = next(f for f in report.findings if f.code == "IL008" and f.module == "0")
    assert "equal 0.1" in constant.message


def test_il008_duplicated_rows():
    torch.manual_seed(0)
    model = he_head(mlp(2, width=64, init="he"))
    with torch.no_grad():
        model[2].weight[5] = model[2].weight[7]
    report = initlint.audit(model)
    assert codes(report, "IL008") == {"2"}
    assert next(f for f in report.findings if f.code == "IL008").value == 1


def test_il008_deliberate_zero_inits_are_not_defects():
    torch.manual_seed(0)
    assert codes(initlint.audit(Residual()), "IL008") == set()  # zero-init residual branch ends
    head_zero = he_head(mlp(2, width=64, init="he"))
    nn.init.zeros_(head_zero[-1].weight)  # zero-initialised classifier head
    bn = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    nn.init.zeros_(bn[1].weight)  # a zero BatchNorm gamma is not a weight layer
    assert codes(initlint.audit(head_zero), "IL008") == set()
    assert codes(initlint.audit(bn), "IL008") == set()


# ----------------------------------------------------------------------------- selection
def test_select_and_ignore_by_prefix_and_name():
    torch.manual_seed(0)
    model = mlp(8)
    assert {c for c, _ in initlint.audit(model, select=["IL001"]).codes()} == {"IL001"}
    assert "IL001" not in {c for c, _ in initlint.audit(model, ignore=["init-scale"]).codes()}
    with pytest.raises(ValueError):
        initlint.audit(model, select=["IL999"])


def test_rule_options_change_thresholds():
    torch.manual_seed(0)
    model = mlp(8)
    report = initlint.audit(model, select=["IL001"], rule_options={"init-scale": {"max-variance-drift": 1e12}})
    assert report.clean


def test_il007_a_gate_set_near_a_bound_by_its_offset_is_information():
    # Kimi Delta Attention's decay gate (Bailing's hybrid): sigmoid(exp(A_log) * (f_proj(h) + dt_bias))
    class DecayGate(nn.Module):
        def __init__(self, width=64, offset=True):
            super().__init__()
            self.f_proj = nn.Linear(width, width, bias=False)
            nn.init.normal_(self.f_proj.weight, std=0.02)
            self.A_log = nn.Parameter(torch.empty(width).uniform_(1, 16).log())
            dt = torch.empty(width).uniform_(math.log(1e-3), math.log(1e-1)).exp()
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)) if offset else torch.zeros(width))

        def forward(self, h):
            return torch.sigmoid(self.A_log.exp() * (self.f_proj(h) + self.dt_bias)) * h

    torch.manual_seed(0)
    report = initlint.audit(DecayGate(), torch.randn(4, 16, 64))
    found = [f for f in report.findings if f.code == "IL007"]
    assert [(f.module, f.severity) for f in found] == [("", "info")]
    assert "by the offset dt_bias" in found[0].message
    # the same gate saturated by its weights, without the offset, is a warning
    torch.manual_seed(0)
    model = DecayGate(offset=False)
    nn.init.normal_(model.f_proj.weight, std=1.0)
    assert {f.severity for f in initlint.audit(model, torch.randn(4, 16, 64)).findings
            if f.code == "IL007"} == {"warning"}


def test_il005_an_average_over_positions_of_one_batchnormed_example_is_not_judged():
    # ALIGN's EfficientNet on one image (the probe's fallback batch when two run out of memory): every
    # training-mode BatchNorm centres its channels on that image's positions, so the pooled mean is rounding
    class Tower(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.bn0 = nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32)
            self.conv, self.bn1 = nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32)
            self.head = nn.Linear(32, 10)

        def forward(self, x):
            h = self.bn0(self.stem(x))
            h = h + self.bn1(self.conv(F.relu(h)))
            return self.head(F.avg_pool2d(h, h.shape[-1]).flatten(1))

    torch.manual_seed(0)
    one = torch.randn(1, 3, 16, 16)
    model = Tower()
    with torch.no_grad():
        model.train()
        h = model.bn0(model.stem(one))
        pooled = F.avg_pool2d(h + model.bn1(model.conv(F.relu(h))), 16)
    assert float(pooled.abs().max()) < 1e-5  # what the probe measures at a batch of 1
    assert codes(initlint.audit(model, one), "IL005") == set()
    assert codes(initlint.audit(model, torch.randn(4, 3, 16, 16)), "IL005") == set()


def test_il001_a_squeeze_excitation_gate_does_not_count_its_inputs_growth_twice():
    # PP-LCNetV4 (PP-OCRv6's recognition backbone) with its depthwise token convs at He's std over their
    # true fan-in 9 (0.47, 1.45x identity's): IL001 predicted the variance to grow 1.7e6x over stage 3's six
    # blocks, counting each block's growth again through its squeeze-excitation gate; the stream stays at rms
    # 1-3.5, and this init learnt the task of benchmarks/hf_init_training.py fastest
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    backbone = tf.PPLCNetV4Backbone(tf.PPLCNetV4Config())
    for m in backbone.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / (m.in_channels // m.groups * m.kernel_size[0] ** 2)))
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    streams = []
    hooks = [b.register_forward_hook(lambda _m, _i, out: streams.append(float(out.pow(2).mean().sqrt())))
             for b in backbone.encoder.blocks[2].blocks]
    try:
        with torch.no_grad():
            backbone(x)
    finally:
        for h in hooks:
            h.remove()
    assert max(streams) < 10  # measured: no compounding growth
    assert codes(initlint.audit(backbone, x), "IL001") == set()
    # growth through layers without a gate still compounds (2x identity's std, 12 layers)
    deep = nn.Sequential(*[nn.Linear(64, 64) for _ in range(12)])
    for layer in deep:
        nn.init.normal_(layer.weight, std=2.0 / 8)
    assert codes(initlint.audit(deep, torch.randn(4, 64)), "IL001") == {str(i) for i in range(12)}


# ----------------------------------------------------------------------------- IL013: collapses still found
class _Collapsing(nn.Module):
    """Pre-norm self-attention blocks whose output projections are 30x too large: every token collapses to
    the same vector. ``start`` makes the stream: patches of a conv stem, or a learned table broadcast over the
    batch."""

    def __init__(self, start, dim=128, depth=6):
        super().__init__()
        self.start = start
        self.stem = nn.Conv2d(3, dim, 8, 8)
        self.latents = nn.Parameter(torch.randn(64, dim))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(depth))
        self.layers = nn.ModuleList(nn.MultiheadAttention(dim, 4, batch_first=True) for _ in range(depth))
        with torch.no_grad():
            for attn in self.layers:
                attn.out_proj.weight.mul_(30)

    def forward(self, x):
        if self.start == "conv":
            x = self.stem(x).flatten(2).transpose(1, 2)
        else:
            x = self.latents.unsqueeze(0).expand(x.shape[0], -1, -1) + 0 * x.mean()
        for norm, attn in zip(self.norms, self.layers):
            h = norm(x)
            x = x + attn(h, h, h, need_weights=False)[0]
        return x


@pytest.mark.parametrize("start", ["conv", "latents"])
def test_il013_a_stream_of_patches_or_of_learned_latents_that_collapses_is_flagged(start):
    # neither begins as copies of one token: a conv stem's patches differ, and a learned table broadcast
    # over the batch (latents.expand(batch, -1, -1)) is not OneFormer's task token repeated per query
    torch.manual_seed(0)
    report = initlint.audit(_Collapsing(start), torch.randn(2, 3, 64, 64), select=["IL013"])
    assert [f.code for f in report.findings] == ["IL013"]


def test_il013_a_stack_without_residuals_inside_one_long_skip_is_still_judged():
    # the skip around the whole stack (x + cross(stack(x), memory)) is not each attention layer's own block
    class StackInSkip(nn.Module):
        def __init__(self, dim=128, depth=6):
            super().__init__()
            self.layers = nn.ModuleList(nn.MultiheadAttention(dim, 4, batch_first=True) for _ in range(depth))
            self.cross = nn.MultiheadAttention(dim, 4, batch_first=True)

        def forward(self, memory, x):
            h = x
            for attn in self.layers:
                h = attn(h, h, h, need_weights=False)[0]
            return x + self.cross(h, memory, memory, need_weights=False)[0]

    torch.manual_seed(0)
    report = initlint.audit(StackInSkip(), (torch.randn(2, 32, 128), torch.randn(2, 64, 128)), select=["IL013"])
    assert codes(report, "IL013") == {"layers.1"}
