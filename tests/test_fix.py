"""initlint.fix and `initlint fix`: repair what the findings blame, leave the rest bit for bit, hand back code."""
import os
import subprocess
import sys

import pytest
from cli_server import run_initlint
import torch
import torch.nn as nn

import initlint
from initlint.api import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, EXAMPLES)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kaiming_mlp import KaimingMLP  # noqa: E402
from linear_stack import RandnStack  # noqa: E402
from models import Residual  # noqa: E402
from naive_mlp import NaiveMLP  # noqa: E402
from seed_models import DeadConvNet, DefaultReluMLP, HotSoftmaxHead, narrow_pyramid  # noqa: E402

REPAIRED = {"IL001", "IL003", "IL004", "IL005", "IL006", "IL007", "IL008", "IL009"}

# name -> (builder, audit keywords, modules the fix may change beyond those the findings name)
BAD = {
    "naive_mlp": (NaiveMLP, {"logits": True}, set()),
    "pyramid100_relu_lecun": (lambda: narrow_pyramid(100, "relu", "lecun"), {}, set()),
    "pyramid100_relu_glorot": (lambda: narrow_pyramid(100, "relu", "glorot"), {}, set()),
    "pyramid10_tanh_uniform": (lambda: narrow_pyramid(10, "tanh", "naive"), {}, set()),
    "randn_stack": (RandnStack, {}, set()),
    "default_relu_mlp": (DefaultReluMLP, {}, set()),
    # IL003 is reported at the functional torch.relu (module <model>); the rule names conv2's bias as the cause
    "dead_conv": (DeadConvNet, {}, {"conv2"}),
    "hot_softmax_head": (HotSoftmaxHead, {}, set()),
}


def build(builder, seed=0):
    torch.manual_seed(seed)
    return builder()


def warnings_of(report):
    return {(f.code, m) for f in report.findings if f.severity != "info" for m in f.members or [f.module]}


def blamed(report):
    return {m for f in report.findings for m in (f.members or [f.module])}


def apply_code(code, model):
    namespace = {}
    exec(compile(code, "<initlint fix>", "exec"), namespace)
    return namespace["apply_initlint_fixes"](model)


def same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("name", list(BAD))
def test_fix_repairs_the_seed_models_and_its_code_reproduces_the_repair(name):
    builder, options, causes = BAD[name]
    model = build(builder)
    rng = torch.get_rng_state()
    rep = initlint.fix(model, **options)
    assert torch.equal(torch.get_rng_state(), rng)  # fresh draws come from the fix's own generator
    assert {c for c, _ in warnings_of(rep.before)} & REPAIRED
    assert not {c for c, _ in warnings_of(rep.after)} & REPAIRED, rep.summary()
    assert rep.fixed and rep.audits <= 3
    assert rep.changes
    assert {c.module for c in rep.changes} <= blamed(rep.before) | causes
    original = build(builder)
    for change in rep.changes:
        assert set(change.rule.split(", ")) <= REPAIRED and change.init
        assert not torch.equal(model.get_parameter(change.name), original.get_parameter(change.name))

    fresh = apply_code(rep.code(), build(builder))
    assert same_state(fresh, model)  # the same weights, bit for bit
    assert warnings_of(initlint.audit(fresh, **options)) == warnings_of(rep.after) == set()


def test_the_new_seed_models_have_the_findings_the_readme_lists():
    found = {b: warnings_of(initlint.audit(build(b))) for b in (DeadConvNet, DefaultReluMLP, HotSoftmaxHead)}
    assert {c for c, _ in found[DeadConvNet]} == {"IL003", "IL005"} and ("IL003", "") in found[DeadConvNet]
    assert {c for c, _ in found[DefaultReluMLP]} == {"IL001", "IL006"}
    assert {m for c, m in found[DefaultReluMLP] if c == "IL001"} == {f"layers.{i}" for i in range(0, 40, 2)} | {"head"}
    assert found[HotSoftmaxHead] == {("IL004", "head")}


def test_changes_report_measured_stds_and_the_init_call():
    model = build(NaiveMLP)
    rep = initlint.fix(model, logits=True)
    by_name = {c.name: c for c in rep.changes}
    assert set(by_name) == {"fc1.weight", "fc2.weight", "fc3.weight"}
    fc1 = by_name["fc1.weight"]
    assert fc1.rule == "IL001" and fc1.module == "fc1"
    assert fc1.before_std == pytest.approx(1.0, rel=0.02)
    assert fc1.after_std == pytest.approx(model.fc1.weight.std(unbiased=False).item(), rel=1e-6)
    assert fc1.after_std == pytest.approx((2 / 200) ** 0.5, rel=0.05)  # He for the ReLU after fc1
    assert 'kaiming_normal_(model.fc1.weight, nonlinearity="relu")' in fc1.init.replace("'", '"')
    assert 'nonlinearity="linear"' in by_name["fc3.weight"].init.replace("'", '"')  # the output layer: no activation


def test_the_distribution_family_is_kept():
    model = build(lambda: narrow_pyramid(10, "tanh", "naive"))  # uniform draws
    rep = initlint.fix(model)
    assert all("uniform_" in c.init for c in rep.changes)
    w = model[0].weight
    bound = w.abs().max().item()
    assert bound <= (3 / 320) ** 0.5 * 1.0001  # LeCun uniform for tanh: U(-sqrt(3 / fan_in), +)
    rep = initlint.fix(build(NaiveMLP), logits=True)  # normal draws
    assert all("normal_" in c.init for c in rep.changes)


class LayerScaleNet(nn.Module):
    """A pre-norm residual branch scaled by a learnable 1e-5 (LayerScale): small on purpose."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.fc = nn.Linear(64, 64)
        self.gamma = nn.Parameter(torch.full((64,), 1e-5))
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(x + self.gamma * self.fc(self.norm(x)))


def conv_bn():
    def block(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(*block(3, 16), *block(16, 32), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def gpt2():
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64, bos_token_id=0,
                        eos_token_id=0)
    return GPT2LMHeadModel(config)


HEALTHY = {
    "he_mlp": (KaimingMLP, {"logits": True}),
    "batchnorm_conv": (conv_bn, {}),
    "gpt2": (gpt2, {"logits": True}),
    "zero_init_residual": (Residual, {}),
    "layerscale": (LayerScaleNet, {}),
}


@pytest.mark.parametrize("name", list(HEALTHY))
def test_healthy_models_are_left_bit_for_bit(name):
    builder, options = HEALTHY[name]
    model = build(builder)
    reference = build(builder)
    rep = initlint.fix(model, **options)
    assert rep.changes == [] and rep.steps == [] and rep.audits == 1
    assert same_state(model, reference)
    assert "nn.init" not in rep.code()
    assert warnings_of(rep.after) == set()


def test_healthy_layers_of_a_bad_model_are_untouched():
    model = build(DeadConvNet)
    reference = build(DeadConvNet)
    rep = initlint.fix(model)
    assert [c.name for c in rep.changes] == ["conv2.bias"]
    for name, param in model.named_parameters():
        if name != "conv2.bias":
            assert torch.equal(param, reference.get_parameter(name)), name


class SineNet(nn.Module):
    """A custom activation (sin) whose gain initlint does not know, then a ReLU layer."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)
        self.c = nn.Linear(64, 64)
        self.head = nn.Linear(64, 10)
        for layer in (self.b, self.c, self.head):
            nn.init.normal_(layer.weight)
        nn.init.normal_(self.a.weight, std=30.0)  # far off for any gain: IL001 flags it on its own

    def forward(self, x):
        return self.head(torch.relu(self.c(torch.relu(self.b(torch.sin(self.a(x)))))))


def test_auto_measures_where_the_gain_is_unknown_and_computes_where_it_is_known():
    model = build(SineNet)
    rep = initlint.fix(model)
    calls = {c.name: c.init for c in rep.changes}
    assert ".mul_(" in calls["a.weight"] and "nn.init" not in calls["a.weight"]  # LSUV in front of sin
    assert "kaiming_normal_" in calls["b.weight"]  # He in front of a ReLU
    assert warnings_of(rep.after) == set()
    assert same_state(apply_code(rep.code(), build(SineNet)), model)


class RandnBranches(nn.Module):
    """Residual branches whose last layer has randn weights: only the backward probe sees the harm (IL006)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(64, 64)
        self.up = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
        self.down = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
        self.head = nn.Linear(64, 10)
        for layer in self.down:
            nn.init.normal_(layer.weight)

    def forward(self, x):
        x = self.inp(x)
        for up, down in zip(self.up, self.down):
            x = x + down(torch.relu(up(x)))
        return self.head(x)


def test_a_symptom_without_an_init_cause_is_measured_and_only_off_layers_change():
    model = build(RandnBranches)
    reference = build(RandnBranches)
    rep = initlint.fix(model)
    assert {c for c, _ in warnings_of(rep.before)} == {"IL006"} and warnings_of(rep.after) == set()
    changed = {c.module for c in rep.changes}
    assert {f"down.{i}" for i in range(4)} <= changed <= {f"down.{i}" for i in range(4)} | {"head"}
    assert all(".mul_(" in c.init for c in rep.changes)
    for i in range(4):  # layers that pass on the scale they receive are not touched
        assert torch.equal(model.up[i].weight, reference.up[i].weight)
    assert same_state(apply_code(rep.code(), build(RandnBranches)), model)


def _pyramid(seed):
    torch.manual_seed(seed)
    return narrow_pyramid(100, "relu", "lecun")


def test_a_symptom_repair_never_trades_the_symptom_for_an_init_scale_finding():
    # Seed 11: after the He redraw, IL006 remains; the last layer's few live inputs carry a signal that
    # unit-variance scaling would multiply by about 1.3e4, which IL001 would then flag.
    model = _pyramid(11)
    rep = initlint.fix(model, seed=11)
    factors = [float(c.init.rsplit(".mul_(", 1)[1].rstrip(")")) for c in rep.changes if ".mul_(" in c.init]
    assert factors and all(0.25 <= f <= 4.0 for f in factors)
    assert {c for c, _ in warnings_of(rep.after)} == {"IL006"}  # reported as remaining, not hidden
    assert {f.code for f in rep.remaining} == {"IL006"} and not rep.fixed
    assert same_state(apply_code(rep.code(), _pyramid(11)), model)


def test_a_layer_dead_for_the_whole_batch_at_a_sound_scale_gets_a_fresh_draw():
    # Seed 1: the He redraw leaves all 6 units after layer 190 dead for every sample (IL003 at 191).
    model = _pyramid(1)
    rep = initlint.fix(model, seed=1)
    assert rep.audits == 3 and warnings_of(rep.after) == set()
    redrawn = [c for c in rep.changes if c.module == "190"]
    assert len(redrawn) == 1 and "IL003" in redrawn[0].rule and "uniform_" in redrawn[0].init
    assert same_state(apply_code(rep.code(), _pyramid(1)), model)


@pytest.mark.parametrize("method", ["analytic", "lsuv"])
def test_methods(method):
    model = build(NaiveMLP)
    rep = initlint.fix(model, logits=True, method=method)
    assert rep.method == method and warnings_of(rep.after) == set()
    inits = [c.init for c in rep.changes]
    if method == "analytic":
        assert all(i.startswith("nn.init.") for i in inits)
    else:
        assert all(".mul_(" in i for i in inits)
        x = torch.randn(16, 200, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            pre = model.fc1(x)
        assert pre.pow(2).mean().sqrt().item() == pytest.approx(1.0, rel=1e-3)  # unit scale on the probe batch
    assert same_state(apply_code(rep.code(), build(NaiveMLP)), model)


class ConstantHidden(nn.Module):
    """A hidden layer with every weight equal: its units stay clones (IL008)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(64, 64)
        self.out = nn.Linear(64, 10)
        nn.init.constant_(self.hidden.weight, 0.1)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


def test_constant_weights_get_a_fresh_draw():
    model = build(ConstantHidden)
    rep = initlint.fix(model)
    assert ("IL008", "hidden") in warnings_of(rep.before) and warnings_of(rep.after) == set()
    assert [(c.name, c.rule) for c in rep.changes] == [("hidden.weight", "IL008")]
    assert torch.unique(model.hidden.weight, dim=0).shape[0] == 64  # 64 distinct units
    assert "kaiming_normal_" in rep.changes[0].init  # a constant has no family: normal, He for the ReLU
    assert model.hidden.weight.std().item() == pytest.approx((2 / 64) ** 0.5, rel=0.1)
    assert same_state(apply_code(rep.code(), build(ConstantHidden)), model)


def test_draws_without_a_generator_in_nn_init(monkeypatch):
    """On a torch whose nn.init takes no generator, draws are written as tensor methods, still reproducible."""
    from initlint.repair import planner as repair

    monkeypatch.setattr(repair, "NN_INIT_TAKES_GENERATOR", False)
    model = build(NaiveMLP)
    rep = initlint.fix(model, logits=True)
    assert "nn.init" not in rep.code() and ".normal_(0.0, " in rep.code()
    assert warnings_of(rep.after) == set()
    assert same_state(apply_code(rep.code(), build(NaiveMLP)), model)


def test_architecture_findings_stay_with_their_code_change():
    from conv_bias_bn import ConvBlock

    model = build(ConvBlock)
    reference = build(ConvBlock)
    rep = initlint.fix(model)
    assert rep.changes == [] and same_state(model, reference)
    assert [(f.code, f.module) for f in rep.unrepairable] == [("IL002", "conv1")]
    assert rep.fixed  # nothing an init can repair is left
    assert "bias=False" in rep.code() and "bias=False" in rep.summary()


def test_select_and_suppressions_limit_what_is_repaired():
    rep = initlint.fix(build(NaiveMLP), logits=True, select=["IL004"])
    assert [(c.name, c.rule) for c in rep.changes] == [("fc3.weight", "IL004")]
    assert warnings_of(rep.after) == set()
    model = build(NaiveMLP)
    rep = initlint.fix(model, logits=True, per_module_ignores={"fc1": ["IL001"]}, ignore=["IL005", "IL006"])
    assert {c.name for c in rep.changes} == {"fc2.weight", "fc3.weight"}  # fc1's scale is declared deliberate
    assert torch.equal(model.fc1.weight, build(NaiveMLP).fc1.weight)


def test_bad_arguments_are_usage_errors():
    with pytest.raises(UsageError, match="unknown fix method 'fast'"):
        initlint.fix(build(NaiveMLP), method="fast")
    with pytest.raises(UsageError, match="expects an nn.Module"):
        initlint.fix("model.py")
    with torch.device("meta"):
        meta = nn.Linear(4, 4)
    with pytest.raises(UsageError, match="meta device"):
        initlint.fix(meta)


# --------------------------------------------------------------------------------- command line
ENV = dict(os.environ, INITLINT_NO_PROGRESS="1", NO_COLOR="1")

UNREPAIRABLE = '''import torch
import torch.nn as nn


class Folded(nn.Module):
    """Every unit is dead by construction (relu of -|x|): no init can revive it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        return self.head(torch.relu(-torch.abs(self.fc(x))))
'''


def cli(*args, cwd=ROOT):
    return run_initlint(["fix", *args], cwd=cwd, env=ENV)


def test_cli_repairs_and_writes_the_code_never_the_source(tmp_path):
    source = os.path.join(EXAMPLES, "naive_mlp.py")
    with open(source, encoding="utf-8") as fh:
        before = fh.read()
    out_file = tmp_path / "fixes.py"
    out = cli("examples/naive_mlp.py", "--logits", "--output", str(out_file))
    assert out.returncode == 0, out.stderr
    assert "before: 5 finding(s)" in out.stdout and "after: clean" in out.stdout
    assert "fc1.weight" in out.stdout and f"code: written to {out_file}" in out.stdout
    with open(source, encoding="utf-8") as fh:
        assert fh.read() == before
    model = apply_code(out_file.read_text(), build(NaiveMLP))  # the CLI seeded the build with 0, as here
    assert warnings_of(initlint.audit(model, logits=True)) == set()
    assert same_state(model, apply_code(initlint.fix(build(NaiveMLP), logits=True).code(), build(NaiveMLP)))


def test_cli_healthy_model_prints_code_that_changes_nothing():
    out = cli("examples/kaiming_mlp.py", "--logits")
    assert out.returncode == 0, out.stderr
    assert "changed nothing" in out.stdout and "def apply_initlint_fixes(model" in out.stdout


def test_cli_exits_1_when_a_repairable_finding_remains(tmp_path):
    path = tmp_path / "folded.py"
    path.write_text(UNREPAIRABLE)
    out = cli(str(path))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "still flagged: IL003" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["examples/naive_mlp.py", "--method", "fast"], "unknown --method 'fast'"),
    (["examples/linear_stack.py"], "holds 5 models"),
    (["examples/naive_mlp.py", "--output", "examples/naive_mlp.py"], "never edits it"),
    (["examples/missing.py"], "missing.py"),
])
def test_cli_errors_exit_2_with_one_sentence(args, message):
    from initlint.repair import command as fix_cli
    from initlint.repair import planner as repair

    assert fix_cli.METHODS == repair.METHODS
    out = cli(*args)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ HF Conv1D (a Linear stored transposed)
def gpt2(corrupt, n_embd=768, vocab=50257, n_layer=2):
    """HF GPT-2 built from its config (offline), with one Conv1D weight redrawn at std 1."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=n_embd, n_layer=n_layer, n_head=12, vocab_size=vocab, n_positions=256)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        nn.init.normal_(model.get_parameter(corrupt), std=1.0)
    return model


def gpt2_ids(vocab=50257):
    return torch.randint(0, vocab, (2, 32), generator=torch.Generator().manual_seed(0))


@pytest.mark.slow
@pytest.mark.parametrize("corrupt, code", [("transformer.h.1.mlp.c_fc.weight", "IL012"),
                                           ("transformer.h.0.attn.c_attn.weight", "IL011")])
def test_gpt2_conv1d_at_gpt2_small_width_is_repaired_and_its_code_reproduces_the_repair(corrupt, code):
    model = gpt2(corrupt)
    rep = initlint.fix(model, gpt2_ids())
    layer = corrupt.rsplit(".", 1)[0]
    assert code in {c for c, _ in rep.before.codes()}
    assert corrupt in {c.name for c in rep.changes}  # the corrupted layer, whatever rule asked for it
    assert not {c for c, _ in warnings_of(rep.after)}, rep.summary()
    assert rep.changes[0].after_std < 0.1 and all(c.module == layer for c in rep.changes), rep.summary()
    fresh = gpt2(corrupt)
    apply_code(rep.code(), fresh)
    assert same_state(model, fresh)


def test_a_transposed_linear_is_recognised_by_its_shape_not_by_importing_transformers():
    from initlint.repair.planner import transposed_linear

    class Conv1D(nn.Module):  # HF's layout: weight (in, out), y = x @ W + b
        def __init__(self, nf, nx):
            super().__init__()
            self.nf = nf
            self.weight = nn.Parameter(torch.randn(nx, nf))
            self.bias = nn.Parameter(torch.zeros(nf))

        def forward(self, x):
            return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(*x.shape[:-1], self.nf)

    class Conv1DLookalike(Conv1D):
        pass

    assert transposed_linear(Conv1D(8, 4)) and not transposed_linear(nn.Linear(4, 8))
    assert not transposed_linear(Conv1DLookalike(8, 4))  # another class: not assumed to be HF's
    odd = Conv1D(8, 4)
    odd.nf = 4  # nf names the out features: a weight of another layout is not taken for one
    assert not transposed_linear(odd)


def test_a_small_gpt2_conv1d_is_rescaled_from_measurements_like_a_linear():
    model = gpt2("transformer.h.1.mlp.c_fc.weight", n_embd=96, vocab=512)
    rep = initlint.fix(model, gpt2_ids(512), method="lsuv")
    assert not any("not a Linear/Conv" in n for n in rep.notes), rep.notes
    changed = {c.name: c for c in rep.changes}
    assert "transformer.h.1.mlp.c_fc.weight" in changed and changed["transformer.h.1.mlp.c_fc.weight"].after_std < 0.5
    fresh = gpt2("transformer.h.1.mlp.c_fc.weight", n_embd=96, vocab=512)
    apply_code(rep.code(), fresh)
    assert same_state(model, fresh)


def test_attention_saturated_by_multiheadattention_s_own_projections_is_repaired_through_them():
    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(64, 4, batch_first=True)
            with torch.no_grad():
                self.attn.in_proj_weight.normal_(0, 1)  # q, k and v drawn N(0, 1)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]

    x = torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(1))
    model = build(SelfAttention)
    rep = initlint.fix(model, x)
    assert ("IL011", "attn") in warnings_of(rep.before) and not warnings_of(rep.after), rep.summary()
    assert [c.name for c in rep.changes] == ["attn.in_proj_weight"]
    fresh = build(SelfAttention)
    apply_code(rep.code(), fresh)
    assert same_state(model, fresh)


def test_a_repair_that_raises_is_a_note_and_the_other_repairs_go_on(monkeypatch):
    """A rule's repair that raises leaves its finding unrepaired with a note; the fix does not abort."""
    from initlint.rules import all_rules

    torch.manual_seed(0)
    model = RandnStack()
    inputs = None  # inferred, as for the other example models
    before = initlint.audit(model, inputs)
    broken_code = before.findings[0].code

    def broken(self, plan, finding, module):
        raise RuntimeError("boom")

    monkeypatch.setattr(all_rules()[broken_code], "repair", broken)
    report = initlint.fix(model, inputs)
    assert any(note.startswith(f"{broken_code} at ") and "its repair raised RuntimeError: boom" in note
               for note in report.notes), report.notes
