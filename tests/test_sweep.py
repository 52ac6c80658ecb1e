"""``initlint.sweep`` and ``initlint sweep``: the measurement over sizes, the fits, the verdicts of
width-unstable and depth-unstable, the report's formats, and the errors (one sentence, exit 2).
Tiny models and 2-3 sizes: each test runs in about a second."""
import json
import os
import random
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from cli_server import run_initlint

import initlint
from initlint.coord import run as sweep_run
from initlint.errors import LoadError, UsageError
from initlint.inputs.optimizer import parse_optimizer
from initlint.probe.coords import INPUT_GRAD, LOGITS, OUTPUT, STREAM, fit_power
from initlint.rules.il018_width_unstable import mlp_at_fixed_std

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, INITLINT_NO_PROGRESS="1", NO_COLOR="1")


# ----------------------------------------------------------------------------- models
class Attention(nn.Module):
    """Single-head self-attention through SDPA; ``mup``: scale 1/d and a zero query projection."""

    def __init__(self, width, mup=False):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)
        self.mup = mup
        for layer in (self.q, self.k, self.v):
            nn.init.normal_(layer.weight, std=1.0)  # q . k sums `width` terms of unit scale: grows as sqrt(width)
        if mup:
            nn.init.zeros_(self.q.weight)
            nn.init.zeros_(self.q.bias)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        return F.scaled_dot_product_attention(q, k, v, scale=1 / q.size(-1) if self.mup else None)


def attention_net(width=16, mup=False):
    return nn.Sequential(nn.Linear(8, width), Attention(width, mup), nn.Linear(width, 4))


def attention_net_mup(width=16):
    return attention_net(width, mup=True)


def tokens(model):
    return torch.randint(0, 8, (2, 6), generator=torch.Generator().manual_seed(0)),


class MHANet(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.attn = nn.MultiheadAttention(width, 1, batch_first=True)
        with torch.no_grad():
            self.attn.in_proj_weight.normal_(std=1.0)

    def forward(self, x):
        h = self.inp(x)
        return self.attn(h, h, h)[0]  # need_weights=True: the explicit softmax path


def mlp_fixed_std(width=16):
    return mlp_at_fixed_std(width)  # every weight N(0, 0.02): layer "2" grows as sqrt(width), "4" as width


class ShrinkingReadout(nn.Module):
    """Default init with a readout multiplier 1/width: the output shrinks with width, which is no finding."""

    def __init__(self, width=16):
        super().__init__()
        self.width = width
        self.body = nn.Linear(8, width)
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        return self.head(torch.relu(self.body(x))) * (16 / self.width)


def fails_above_32(width=16):
    model = mlp_fixed_std(width)
    if width > 32:
        model.forward = lambda x: x @ torch.ones(3, 3)  # a shape error in the forward at this width only
    return model


def always_fails(width=16):
    raise ValueError(f"cannot build width {width}")


def out_of_memory_at_64(width=16):
    if width >= 64:
        raise MemoryError("could not allocate")
    return mlp_fixed_std(width)


WIDTHS = {"width": [16, 32, 64]}


# ----------------------------------------------------------------------------- fits
def test_fit_recovers_a_power_law_and_its_error():
    fit = fit_power([8, 16, 32, 64], [3 * s ** 0.5 for s in [8, 16, 32, 64]])
    assert fit.alpha == pytest.approx(0.5) and fit.error == pytest.approx(0, abs=1e-9) and fit.points == 4
    assert fit.predict(256) == pytest.approx(3 * 16)
    noisy = fit_power([8, 16, 32], [1.0, 2.0 * 1.1, 4.0])
    assert noisy.error > 0.01


def test_fit_leaves_out_zeros_and_needs_two_sizes():
    assert fit_power([8, 16, 32], [0.0, 0.0, 0.0]) is None
    assert fit_power([8, 16, 32], [None, 1.0, None]) is None
    assert fit_power([8, 16, 32], [0.0, 1.0, 2.0]).alpha == pytest.approx(1.0)


# ----------------------------------------------------------------------------- measurement
def test_layers_are_matched_across_sizes_and_blocks_pooled_by_role():
    from initlint.rules.il019_depth_unstable import PreNormStack as pre_norm_stack

    paths = sweep_run.pooled_paths(pre_norm_stack(3))
    assert paths["blocks.2.fc"] == "blocks.{i}.fc" and paths["inp"] == "inp"
    assert sweep_run.pooled_paths(mlp_fixed_std())["2"] == "2"  # numbered single layers keep their number
    assert sweep_run.main_stack(pre_norm_stack(3)) == ("blocks", "blocks.2")
    assert sweep_run.main_stack(mlp_fixed_std()) == (None, None)


def test_depth_sweep_records_stream_and_input_gradient_per_step():
    from initlint.rules.il019_depth_unstable import PreNormStack as pre_norm_stack

    report = initlint.sweep(pre_norm_stack, depth={"n_layer": [2, 4]}, steps=2)
    stream, grad = report.curve("blocks", STREAM), report.curve("inp", INPUT_GRAD)
    assert stream.sizes == [2, 4] and len(stream.values) == 3 and all(v > 0 for row in stream.values for v in row)
    assert len(grad.values) == 3 and all(v > 0 for row in grad.values for v in row)
    assert report.curve("blocks.{i}.fc").values[0][0] > 0
    assert report.data.axis("depth").input_layer == "inp" and report.data.axis("depth").readout == "out"


def test_sdpa_attention_logits_grow_with_width_and_are_flagged():
    report = initlint.sweep(attention_net, width=WIDTHS, steps=0)
    logits = report.curve("1", LOGITS)
    assert logits.fit(0).alpha > 0.5  # q and k grow as sqrt(width) each; the 1/sqrt(d) scale takes one half off
    assert ("IL018", "1") in report.codes()


def test_zero_logits_of_mup_attention_are_no_finding():
    report = initlint.sweep(attention_net_mup, width=WIDTHS, steps=0)
    assert report.curve("1", LOGITS).values[0] == [0.0, 0.0, 0.0]  # a zero query projection
    assert ("IL018", "1") not in report.codes()


def test_explicit_softmax_attention_of_multihead_attention_is_measured():
    report = initlint.sweep(MHANet, width=WIDTHS, steps=0)
    assert report.curve("attn", LOGITS).fit(0).alpha > 0.3
    assert report.curve("attn", OUTPUT) is not None  # the module holds its own in_proj_weight


def test_a_shrinking_readout_is_no_finding():
    report = initlint.sweep(ShrinkingReadout, width={"width": [16, 32, 64]}, steps=1)
    assert report.curve("").fit(0).alpha < -0.8  # the model's output, after the multiplier
    assert report.data.axis("width").readout == ""
    assert report.codes() == []


def test_finding_names_exponent_limit_and_target_width():
    report = initlint.sweep(mlp_fixed_std, width=WIDTHS, steps=0, target_width=4096)
    finding = next(f for f in report.findings if f.module == "4")
    assert finding.threshold == 0.2 and finding.value > 0.8
    assert "width^" in finding.message and "at width=4096" in finding.message
    assert "1/width" in finding.fix  # the readout: muP's multiplier


def test_rule_options_change_the_limit():
    report = initlint.sweep(mlp_fixed_std, width=WIDTHS, steps=0, rule_options={"width-unstable": {"limit": 0.8}})
    assert report.codes() == [("IL018", "4")]
    with pytest.raises(UsageError):
        initlint.sweep(mlp_fixed_std, width=WIDTHS, rule_options={"IL018": {"limit": -1}})


def test_optimizer_loss_and_inputs_are_the_users():
    seen = []

    def loss(output, inputs):
        seen.append(inputs.shape)
        return output.pow(2).mean()

    report = initlint.sweep(attention_net, width={"width": [8, 16]}, steps=1, optimizer=parse_optimizer("SGD(lr=0.1)"),
                            loss=loss, example_inputs=lambda model: torch.randn(3, 5, 8))
    assert seen == [(3, 5, 8)] * 4 and report.data.axis("width").measured == [8, 16]


def test_token_inputs_get_cross_entropy_on_random_labels():
    out = torch.randn(2, 6, 10, requires_grad=True)
    value = sweep_run.loss_of(out, tokens(None), {}, None, 0, None)
    assert 1.5 < float(value.detach()) < 4.5  # about log(10) + the logits' spread


def test_nothing_of_the_users_changes():
    torch.manual_seed(123)
    random.seed(5)
    state, py_state, grad = torch.get_rng_state(), random.getstate(), torch.is_grad_enabled()
    queued = [c for c in torch.cuda._lazy_seed_tracker.get_calls() if c]  # the seed CUDA gets when first used
    initlint.sweep(mlp_fixed_std, width={"width": [8, 16]}, steps=1)
    assert torch.equal(torch.get_rng_state(), state) and random.getstate() == py_state
    assert torch.is_grad_enabled() == grad
    assert [c for c in torch.cuda._lazy_seed_tracker.get_calls() if c] == queued


# ----------------------------------------------------------------------------- failures
def test_a_factory_that_rejects_the_keyword_is_a_usage_error():
    with pytest.raises(UsageError, match="takes no keyword 'd_model'"):
        initlint.sweep(mlp_fixed_std, width={"d_model": [8, 16]})
    with pytest.raises(UsageError, match="two different sizes"):
        initlint.sweep(mlp_fixed_std, width={"width": [8]})


def test_a_size_whose_forward_fails_is_reported_and_the_sweep_goes_on():
    report = initlint.sweep(fails_above_32, width={"width": [16, 32, 64]}, steps=0)
    assert list(report.failed) == ["width=64"] and "RuntimeError" in report.failed["width=64"]
    assert report.data.axis("width").measured == [16, 32] and ("IL018", "4") in report.codes()
    assert "failed at width=64" in report.to_text()


def test_out_of_memory_at_one_size_is_reported():
    report = initlint.sweep(out_of_memory_at_64, width={"width": [16, 32, 64]}, steps=0)
    assert report.failed["width=64"].startswith("out of memory")


def test_a_size_too_big_for_memory_is_not_built(monkeypatch):
    built = []
    monkeypatch.setattr(sweep_run, "_free_bytes", lambda device: 2e5)

    def factory(width=16):
        built.append(width)
        return mlp_fixed_std(width)

    report = initlint.sweep(factory, width={"width": [8, 16, 512]}, steps=0)
    assert built == [8, 16] and report.failed["width=512"].startswith("not built")


def test_nothing_measured_is_one_error():
    with pytest.raises(LoadError, match="no size of always_fails could be measured"):
        initlint.sweep(always_fails, width={"width": [8, 16]})


# ----------------------------------------------------------------------------- formats
def test_table_json_sarif_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    report = initlint.sweep(mlp_fixed_std, width=WIDTHS, steps=1)
    table = report.table()
    assert "width=16" in table and "width=64" in table and "after" not in table and "<-" in table
    doc = json.loads(report.to_json())
    curve = next(c for c in doc["axes"][0]["curves"] if c["layer"] == "4" and c["quantity"] == OUTPUT)
    assert len(curve["values"]) == 2 and len(curve["alpha"]) == 2 and doc["findings"][0]["code"] == "IL018"
    sarif = json.loads(report.to_sarif())
    assert {r["ruleId"] for r in sarif["runs"][0]["results"]} == {"IL018"}
    report.plot(str(tmp_path / "coord.png"))
    assert (tmp_path / "coord.png").read_bytes()[:4] == b"\x89PNG"


# ----------------------------------------------------------------------------- command line
FACTORY = textwrap.dedent("""
    import torch.nn as nn

    def mlp(width=16, depth=2):
        layers = [nn.Linear(16, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(width, 10))
        for m in model:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        return model

    def flat(width=16):
        return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 4))
""")


def run(tmp_path, *args):
    (tmp_path / "models.py").write_text(FACTORY)
    return run_initlint(["sweep", *args], cwd=str(tmp_path), env=ENV)


def test_cli_findings_exit_1_and_json(tmp_path):
    pytest.importorskip("matplotlib")
    out = run(tmp_path, "models.py:mlp", "--width", "width=16,32,64", "--steps", "1", "--format", "json",
              "--plot", "coord.png")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert ("IL018", "4") in {(f["code"], f["module"]) for f in doc["findings"]}
    assert "took" in out.stderr and (tmp_path / "coord.png").exists()


def test_cli_clean_exit_0_with_depth_axis(tmp_path):
    out = run(tmp_path, "models.py:flat", "--width", "width=8,16", "--steps", "0")
    assert out.returncode == 0, out.stderr
    assert "no findings" in out.stdout


@pytest.mark.parametrize("args, words", [
    (("models.py:mlp", "--width", "d_model=8,16"), "takes no keyword 'd_model'"),
    (("models.py:mlp", "--width", "width=8"), "at least two different sizes"),
    (("models.py", "--width", "width=8,16"), "name the factory"),
    (("models.py:mlp",), "--width KEYWORD=SIZES"),
    (("models.py:mlp", "--width", "width=8,16", "--optimizer", "Adamm(lr=1)"), "no optimizer named Adamm"),
])
def test_cli_usage_errors_are_one_line_exit_2(tmp_path, args, words):
    out = run(tmp_path, *args)
    assert out.returncode == 2
    assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_cli_hugging_face_config_class(tmp_path):
    pytest.importorskip("transformers")
    out = run(tmp_path, "transformers:GPT2Config", "--width", "n_embd=16,32", "--set", "vocab_size=64",
              "--set", "n_layer=1", "--set", "n_positions=32", "--steps", "1", "--format", "json")
    assert out.returncode in (0, 1), out.stderr
    doc = json.loads(out.stdout)
    layers = {(c["layer"], c["quantity"]) for c in doc["axes"][0]["curves"]}
    assert ("transformer.h.{i}.attn", LOGITS) in layers and ("lm_head", OUTPUT) in layers
    assert any("n_head" in note for note in doc["notes"])  # 12 heads do not divide 16


def test_cli_reads_the_sweep_rules_options_from_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.initlint.rules.width-unstable]\nlimit = 5.0\n'
                                             '[tool.initlint.rules.dead-relu]\nmax-dead-fraction = 0.9\n')
    out = run(tmp_path, "models.py:mlp", "--width", "width=16,32,64", "--steps", "0")
    assert out.returncode == 0, out.stderr


def test_a_model_the_factory_hands_out_twice_is_left_as_it_was():
    held = {}

    def cached(width=16):
        if width not in held:
            held[width] = mlp_fixed_std(width)
        return held[width]

    before = {w: {k: v.clone() for k, v in cached(w).state_dict().items()} for w in (16, 32)}
    initlint.sweep(cached, width={"width": [16, 32]}, steps=2)
    for w in (16, 32):
        assert all(torch.equal(v, before[w][k]) for k, v in held[w].state_dict().items())
        assert all(p.grad is None for p in held[w].parameters())
