"""IL017 precision-headroom and the precision probe: fp16 overflow and headroom, fp16 gradient underflow with
and without a loss scaler, half-precision residual branches; nothing of the user's changes; bad input."""
import os

import pytest
import torch
import torch.nn as nn

import initlint
from cli_server import run_initlint
from initlint.errors import UsageError
from model_state import deep_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, INITLINT_NO_PROGRESS="1", NO_COLOR="1")


def mlp(first=1.0, out=1.0):
    """64-256-256-10; the first layer times ``first`` (the second's bias too, so both hidden layers scale and
    the float32 function only changes at the output), the output layer times ``out``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    with torch.no_grad():
        model[0].weight.mul_(first)
        model[0].bias.mul_(first)
        model[2].bias.mul_(first)
        model[4].weight.mul_(out / first)
    return model, torch.randn(32, 64)


def il017(report, severity=None):
    return {(f.code, f.module) for f in report.findings if f.code == "IL017" and severity in (None, f.severity)}


def peak(model, x):
    with torch.no_grad():
        return float(model[2](model[1](model[0](x))).abs().max().maximum(model[0](x).abs().max()))


def test_fp16_overflow_is_an_error_at_the_first_layer_where_it_happens():
    model, x = mlp(first=3e4)
    assert peak(model, x) > 65504
    assert il017(initlint.audit(model, x, precision="fp16"), "error") == {("IL017", "0")}


def test_fp16_near_the_limit_is_a_warning_and_headroom_is_an_option():
    model, x = mlp()
    factor = 65504 / 4 / peak(model, x)  # the largest activation at a quarter of the limit
    model, x = mlp(first=factor)
    range_only = {"flush": 1.0}  # the output layer is divided by the factor: its gradients underflow too
    report = initlint.audit(model, x, precision="fp16", rule_options={"IL017": range_only})
    assert il017(report, "warning") in ({("IL017", "0")}, {("IL017", "2")})
    assert not il017(initlint.audit(model, x, precision="fp16", rule_options={"IL017": {**range_only, "headroom": 2}}))
    assert not il017(initlint.audit(model, x, precision="bf16"))  # bfloat16 has float32's range


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_sound_model_is_clean(precision):
    model, x = mlp()
    assert il017(initlint.audit(model, x, precision=precision)) == set()


def test_gradients_that_underflow_fp16_are_flagged_without_a_scaler_and_pass_with_one():
    model, x = mlp(out=1e-5)
    assert il017(initlint.audit(model, x, precision="fp16")) == {("IL017", "0")}
    assert il017(initlint.audit(model, x, precision="fp16", grad_scaler=True)) == set()
    assert il017(initlint.audit(model, x, precision="bf16")) == set()


def test_the_users_loss_sets_the_gradients_the_precision_probe_judges():
    model, x = mlp(out=1e-5)
    seen = []

    def scaled(out, inputs):  # the same loss scaled up 65536-fold, as a GradScaler would
        seen.append(inputs is x)
        return out.float().pow(2).mean() * 65536.0

    assert il017(initlint.audit(model, x, precision="fp16", loss=scaled)) == set()
    assert seen and all(seen)  # called with the inputs as audit took them


def test_gradients_below_even_the_scalers_reach_are_flagged_with_it():
    model, x = mlp(out=1e-10)
    assert il017(initlint.audit(model, x, precision="fp16", grad_scaler=True))


class Residual(nn.Module):
    def __init__(self, width=64, depth=2, branch=1.0):
        super().__init__()
        self.fc1 = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.fc2 = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        with torch.no_grad():
            for fc in self.fc2:
                fc.weight.mul_(branch)
                fc.bias.mul_(branch)

    def forward(self, x):
        for fc1, fc2 in zip(self.fc1, self.fc2):
            x = x + fc2(torch.relu(fc1(x)))
        return x


def test_a_bf16_residual_branch_below_the_streams_resolution_rounds_away():
    torch.manual_seed(0)
    model = Residual(branch=1e-4).to(torch.bfloat16)
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    report = initlint.audit(model, x, precision="bf16")
    assert il017(report) == {("IL017", "fc2.0")}
    torch.manual_seed(0)
    assert il017(initlint.audit(Residual(branch=1e-4), torch.randn(16, 64), precision="bf16")) == set()  # fp32 stream
    torch.manual_seed(0)
    sound = Residual().to(torch.bfloat16)
    assert il017(initlint.audit(sound, torch.randn(16, 64, dtype=torch.bfloat16), precision="bf16")) == set()


def test_a_zero_branch_is_deliberate():
    torch.manual_seed(0)
    model = Residual(branch=0.0).to(torch.bfloat16)
    assert il017(initlint.audit(model, torch.randn(16, 64, dtype=torch.bfloat16), precision="bf16")) == set()


def test_t5_ffn_output_beyond_fp16_is_named():
    pytest.importorskip("transformers")
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                      feed_forward_proj="relu", dropout_rate=0.0)
    model = T5EncoderModel(config)
    with torch.no_grad():  # trained T5 checkpoints grow wi and wo until the FFN output passes 65504
        for block in model.encoder.block:
            block.layer[1].DenseReluDense.wi.weight.mul_(200)
            block.layer[1].DenseReluDense.wo.weight.mul_(200)
    ids = torch.randint(0, 64, (2, 16))
    report = initlint.audit(model, {"input_ids": ids}, precision="fp16")
    assert ("IL017", "encoder.block.0.layer.1.DenseReluDense.wo") in il017(report, "error")
    assert il017(initlint.audit(model, {"input_ids": ids}, precision="bf16")) == set()


def test_bf16_weights_whose_first_update_is_lost_are_flagged(monkeypatch):
    from types import SimpleNamespace

    from initlint.rules import il017_precision_headroom as il017_module

    def param(lost, dtype="bfloat16"):
        return SimpleNamespace(dtype=dtype, lost=lost, lr=1e-5, shape=(64, 64))

    step = SimpleNamespace(stepped=True, optimizer="AdamW",
                           params={"0.weight": param(0.2), "2.weight": param(0.97), "4.weight": param(0.99, "float32")})
    monkeypatch.setattr(il017_module, "step_of", lambda audit: step)
    torch.manual_seed(0)
    model = mlp()[0].to(torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    assert il017(initlint.audit(model, x, precision="bf16")) == {("IL017", "2")}
    step.params["2.weight"] = param(0.3)
    assert il017(initlint.audit(model, x, precision="bf16")) == set()


class TinyLM(nn.Module):
    """An embedding of 1000 rows (a probe batch uses few of them), a LayerNorm (gain 1.0), a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 1000)
        for w in (self.embed.weight, self.head.weight):
            nn.init.normal_(w, std=0.02)

    def forward(self, ids):
        return self.head(self.norm(self.embed(ids)))


def test_pure_bf16_weights_are_judged_by_the_step_their_gradient_drives():
    """Stored in bfloat16 with AdamW (weight decay 0.1): at lr 1e-3 the gradient's step (about lr) survives on
    every weight; the embedding rows the batch does not use move by their decay alone (rounded away, and no
    harm), and the norm's gain of 1.0 cannot move by less than 0.004 (not judged): no finding. At lr 1e-5 the
    gradient's step itself rounds away on the weights of std 0.02 (half a unit in the last place there is 6e-5),
    the used embedding rows' and the head's alike."""
    torch.manual_seed(0)
    model = TinyLM().to(torch.bfloat16)
    ids = torch.randint(0, 1000, (4, 16))
    adamw = lambda lr: (lambda m: torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.1))  # noqa: E731
    fine = initlint.audit(model, ids, optimizer=adamw(1e-3), precision="bf16")
    assert il017(fine) == set()
    assert fine.step.params["embed.weight"].lost == 0.0 and fine.step.params["norm.weight"].lost == 1.0
    stalled = initlint.audit(model, ids, optimizer=adamw(1e-5), precision="bf16")
    assert il017(stalled) == {("IL017", "embed")}  # the worst of the two, named once ("2 weights in all")
    assert stalled.step.params["embed.weight"].lost > 0.8 and stalled.step.params["head.weight"].lost > 0.8
    # SGD's first step is the smallest of its run (momentum builds up): however much of it rounds away, no finding
    # (benchmarks/bench_lost_updates.py: 36 pure-bf16 SGD runs with 0.63-1.0 of it lost, none in trouble)
    sgd = initlint.audit(model, ids, optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9),
                         precision="bf16")
    assert il017(sgd) == set() and sgd.step.params["head.weight"].lost > 0.9


def test_no_precision_no_finding():
    model, x = mlp(first=3e4)
    assert il017(initlint.audit(model, x)) == set()


def test_nothing_of_the_users_changes():
    model, x = mlp(out=1e-5)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    torch.manual_seed(123)
    before = deep_state(model, x)
    autocast = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
    initlint.audit(model, x, precision="fp16")
    initlint.audit(model, x, precision="bf16", grad_scaler=True)
    assert deep_state(model, x) == before
    assert (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")) == autocast


@pytest.mark.parametrize("kwargs, message", [
    (dict(precision="fp8"), "precision must be fp16, bf16 or None, not .fp8."),
    (dict(precision=16), "precision must be"),
    (dict(precision="fp16", grad_scaler="yes"), "grad_scaler must be"),
])
def test_bad_precision_is_a_usage_error(kwargs, message):
    model, x = mlp()
    with pytest.raises(UsageError, match=message):
        initlint.audit(model, x, **kwargs)


def test_a_device_that_cannot_autocast_is_a_usage_error():
    with torch.device("meta"):
        model = nn.Linear(8, 8)
    with pytest.raises(UsageError, match="autocast"):
        initlint.audit(model, torch.randn(2, 8, device="meta"), device="meta", precision="bf16")


def test_cli_precision_flag_and_config_key(tmp_path):
    src = tmp_path / "model.py"
    src.write_text("import torch, torch.nn as nn\n\ndef build():\n    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), "
                   "nn.Linear(8, 2))\n    with torch.no_grad():\n        m[0].weight.mul_(1e6)\n        "
                   "m[2].weight.div_(1e6)\n    return m\n")
    flagged = run_initlint(["check", f"{src}:build", "--precision", "fp16", "--select", "IL017"], cwd=ROOT, env=ENV)
    assert flagged.returncode == 1 and "IL017" in flagged.stdout, flagged.stderr
    clean = run_initlint(["check", f"{src}:build", "--select", "IL017"], cwd=ROOT, env=ENV)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.initlint]\nprecision = "fp16"\n')
    configured = run_initlint(["check", f"{src}:build", "--select", "IL017"], cwd=tmp_path, env=ENV)
    assert configured.returncode == 1 and "IL017" in configured.stdout, configured.stderr
    bad = run_initlint(["check", f"{src}:build", "--precision", "fp8"], cwd=ROOT, env=ENV)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


class RefusesHalf(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        if y.dtype != torch.float32:
            raise TypeError("this model only runs in float32")
        return y


def test_a_forward_that_fails_under_autocast_is_a_note_not_a_crash():
    model = RefusesHalf()
    report = initlint.audit(model, torch.randn(4, 8), precision="fp16")
    assert report.error is None and il017(report) == set()
    assert any("autocast (fp16) raised TypeError" in note for note in report.notes)


class WeightedLoss(nn.Module):
    """Returns its own loss, weighted (as Hugging Face models do given labels)."""

    def __init__(self, weight):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        self.weight = weight

    def forward(self, x, labels):
        logits = self.net(x)
        return {"loss": self.weight * nn.functional.cross_entropy(logits.float(), labels), "logits": logits}


def test_gradients_that_overflow_fp16_are_an_error_at_the_layer_nearest_the_loss_unless_a_scaler_backs_off():
    torch.manual_seed(0)
    inputs = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    assert il017(initlint.audit(WeightedLoss(1e6), inputs, precision="fp16"), "error") == {("IL017", "net.2")}
    assert il017(initlint.audit(WeightedLoss(1e6), inputs, precision="fp16", grad_scaler=True)) == set()
    assert il017(initlint.audit(WeightedLoss(1.0), inputs, precision="fp16")) == set()
