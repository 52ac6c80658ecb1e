"""IL004 on logits known from the output (no --logits needed), fixes that fit tied weights, and IL002
on transposed convolutions."""
import logging
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import initlint
from transformer_models import NanoGPT, dcgan_generator

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()
logging.getLogger("transformers").setLevel(logging.ERROR)


def codes(report, code):
    return {m for c, m in report.codes() if c == code}


def ids(vocab, batch=2, length=16):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


def t5(tied: bool) -> nn.Module:
    config = tf.T5Config(d_model=512, d_ff=2048, num_layers=2, num_heads=8, d_kv=64, vocab_size=32128,
                         tie_word_embeddings=tied)
    return tf.T5ForConditionalGeneration(config)


def t5_inputs():
    return {"input_ids": ids(32128), "decoder_input_ids": ids(32128)}


def test_t5_with_a_unit_normal_head_gets_il004_without_being_told_about_logits():
    torch.manual_seed(0)
    model = t5(tied=False)
    with torch.no_grad():
        nn.init.normal_(model.lm_head.weight, 0.0, 1.0)
    report = initlint.audit(model, t5_inputs(), select=["IL004"])
    assert codes(report, "IL004") == {"lm_head"}
    # the expected initial cross-entropy is far above ln(32128) = 10.4 (transformers PR #26441 saw ~110)
    assert report.probe.logits["xent"] > 5 * math.log(32128)
    assert report.probe.logits["declared"] == 0.0
    assert codes(initlint.audit(model, t5_inputs(), select=["IL004"], logits=False), "IL004") == set()


def test_default_t5_and_gpt2_language_models_are_clean_with_their_logits_checked():
    torch.manual_seed(0)
    report = initlint.audit(t5(tied=True), t5_inputs(), select=["IL004"])
    assert report.probe.logits is not None and report.probe.logits["classes"] == 32128
    assert report.probe.logits["xent"] < 1.5 * math.log(32128)  # 12.2 at this seed: logits of std ~1.9
    assert codes(report, "IL004") == set()
    gpt2 = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=768, n_head=12, vocab_size=50257))
    report = initlint.audit(gpt2, {"input_ids": ids(50257)}, select=["IL004"])
    assert report.probe.logits is not None and codes(report, "IL004") == set()


def test_a_tied_head_is_recognised_and_its_fix_keeps_the_shared_table():
    torch.manual_seed(0)
    model = NanoGPT(dim=128, layers=2)
    with torch.no_grad():
        model.lm_head.weight.mul_(50)  # the same tensor as transformer.wte.weight
    report = initlint.audit(model, ids(512), select=["IL004"])
    assert codes(report, "IL004") == {"lm_head"}
    finding = report.findings[0]
    assert "transformer.wte" in finding.message
    assert "zeros_" not in finding.fix and "wte.weight.mul_" not in finding.fix
    assert "hidden *" in finding.fix
    assert codes(initlint.audit(model, ids(512), select=["IL004"], logits=False), "IL004") == set()


def test_an_untied_classifier_head_is_not_taken_for_logits_unless_declared():
    torch.manual_seed(0)
    head = nn.Linear(256, 10)
    nn.init.normal_(head.weight, std=1.0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), head)
    assert codes(initlint.audit(model, torch.randn(8, 32)), "IL004") == set()
    report = initlint.audit(model, torch.randn(8, 32), logits=True)
    assert codes(report, "IL004") == {"2"}
    assert "nn.init.zeros_(model[2].weight)" in report.findings[0].fix  # its output feeds nothing else


# ----------------------------------------------------------------------------- IL002 on ConvTranspose
def test_dcgan_generator_conv_transpose_biases_before_batchnorm_are_flagged():
    torch.manual_seed(0)
    model = dcgan_generator()
    z = torch.randn(4, 100, 1, 1)
    report = initlint.audit(model, z, select=["IL002"])
    assert codes(report, "IL002") == {"0", "3", "6"}  # the last one feeds Tanh, not a norm
    # the claim holds: each flagged bias changes nothing (BatchNorm in training mode subtracts it)
    model.train()
    with torch.no_grad():
        before = model(z)
        for index in (0, 3, 6):
            model[index].bias.add_(torch.randn_like(model[index].bias))
        assert (model(z) - before).abs().max() < 1e-4


@pytest.mark.parametrize("dims", [1, 3])
def test_functional_conv_transpose_with_bias_before_batch_norm(dims):
    class Up(nn.Module):
        def __init__(self):
            super().__init__()
            shape = (8, 4) + (3,) * dims
            self.weight = nn.Parameter(torch.randn(shape) * 0.1)
            self.bias = nn.Parameter(torch.zeros(4))
            self.bn = nn.BatchNorm1d(4) if dims == 1 else nn.BatchNorm3d(4)

        def forward(self, x):
            conv = F.conv_transpose1d if dims == 1 else F.conv_transpose3d
            return self.bn(conv(x, self.weight, self.bias))

    x = torch.randn(2, 8, *(5,) * dims)
    report = initlint.audit(Up(), x, select=["IL002"])
    assert [(f.code, f.message.split()[1]) for f in report.findings] == [("IL002", "bias")]


def test_a_large_vocabularys_logits_are_measured_on_a_bounded_number_of_rows(monkeypatch):
    """16 x 16 positions over 50257 classes: the logits' softmax statistics read 64 whole rows (not all
    256); 300 rows of 10 classes are all read."""
    from initlint.probe import run

    seen = []
    original = run.put_softmax

    def recording(c, scope, key, y, dim, *args, **kwargs):
        if scope == "logits":
            seen.append(tuple(y.shape))
        return original(c, scope, key, y, dim, *args, **kwargs)

    monkeypatch.setattr(run, "put_softmax", recording)
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=16, n_layer=1, n_head=2))
    batch = {"input_ids": ids(50257, batch=16)}
    initlint.audit(model, batch, logits=True, select=["IL004"])
    assert seen == [(run.logit_rows(50257), 50257)] and run.logit_rows(50257) == 64
    initlint.audit(nn.Sequential(nn.Linear(8, 10)), torch.randn(300, 8), logits=True, select=["IL004"])
    assert seen[-1] == (300, 10)


class TopScoreRouter(nn.Module):
    """A mixture-of-experts router that, like PhiMoE's sparse mixer, masks with -inf every score
    further than ``keep`` (relative) below the row's top one, then takes the softmax."""

    def __init__(self, width=256, experts=16, keep=0.02, gain=1.0):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.router = nn.Linear(width, experts, bias=False)
        nn.init.normal_(self.router.weight, std=gain / math.sqrt(width))
        self.keep = keep

    def forward(self, x):
        scores = self.router(self.norm(x))
        top = scores.amax(-1, keepdim=True)
        far = (top - scores) / scores.abs().clamp(min=top) > self.keep
        return torch.softmax(scores.masked_fill(far, float("-inf")), dim=-1)


def test_a_router_that_masks_all_but_its_top_score_is_not_a_saturated_softmax():
    # PhiMoE's router (transformers' PhimoeTopKRouter) keeps the scores within 2 * jitter of the top one:
    # nearly every row has a single entry left, by the mask, at any init
    x = torch.randn(4, 64, 256, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    assert codes(initlint.audit(TopScoreRouter(), x), "IL004") == set()
    # rows the mask leaves several entries are still judged: a wider keep with 30x the weights is flagged,
    # and so is the same router without a mask
    for keep in (0.9, 1e9):
        torch.manual_seed(0)
        assert codes(initlint.audit(TopScoreRouter(keep=keep, gain=30.0), x), "IL004") == {"router"}
        torch.manual_seed(0)
        assert codes(initlint.audit(TopScoreRouter(keep=keep), x), "IL004") == set()


def test_phimoe_at_default_init_has_no_saturated_router():
    config = tf.PhimoeConfig(vocab_size=1000, hidden_size=256, intermediate_size=128, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=4, num_local_experts=16)
    torch.manual_seed(0)
    report = initlint.audit(tf.PhimoeModel(config), ids(1000))
    assert report.error is None
    assert codes(report, "IL004") == set()


class TokenPooling(nn.Module):
    """Attention pooling written out: one score per token, a softmax over the sequence's positions (its rows as
    long as the probe), the tokens averaged by it. ``std``: the scores' std on a unit input."""

    def __init__(self, std: float, dim: int = 256):
        super().__init__()
        self.score = nn.Linear(dim, 1, bias=False)
        with torch.no_grad():  # a random direction of norm std: scores of std std on a unit input
            self.score.weight.normal_().mul_(std / self.score.weight.norm())

    def forward(self, x):
        weights = torch.softmax(self.score(x).squeeze(-1), dim=-1)
        return (weights[..., None] * x).sum(1)


@pytest.mark.parametrize("std, saturated", [(2.2, False), (2.8, True), (3.1, True)])
def test_a_softmax_over_the_tokens_gets_one_verdict_at_16_and_2048_tokens(std, saturated):
    """Its entropy over ln(tokens) rises with the length for the same scores (std 2.8: 0.44 over 16, 0.55 over
    2048, which a fixed limit of 0.5 passed), so the limit follows the rows' length as IL011's does."""
    torch.manual_seed(0)
    model = TokenPooling(std)
    for batch, length in ((64, 16), (8, 2048)):  # 64 rows at least
        x = torch.randn(batch, length, 256, generator=torch.Generator().manual_seed(1))
        report = initlint.audit(model, x, select=["IL004"])
        assert (codes(report, "IL004") == {"score"}) == saturated, (length, [f.message for f in report.findings])
        if saturated:
            assert f"for rows of {length} entries, the same score spread as 0.5 at 64" in report.findings[0].message
