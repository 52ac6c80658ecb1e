"""Attention as an op the probe sees inside (q, k, mask), and IL011 attention-saturation."""
import logging
import math
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import initlint
from initlint.capture import FxCapture, RuntimeCapture
from initlint.probe.rows import put_attention
from initlint.probe.run import _Collector, ProbeResult, run_probe
from initlint.capture import ops as O
from test_sync import counting_syncs
from transformer_models import AttentionOnly, NanoGPT, ViT

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from attention_lengths import ScoresOfStd  # noqa: E402  (the model of benchmarks/attention_lengths.py)

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()
logging.getLogger("transformers").setLevel(logging.ERROR)


def codes(report, code):
    return {m for c, m in report.codes() if c == code}


def ids(vocab, batch=2, length=32):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------- the statistics
def attention_stats(call):
    c, result = _Collector(), ProbeResult()
    put_attention(c, 0, call)
    c.finish(result)
    return result.ops[0]


def direct_entropy(scores, allowed):
    """Mean over rows with >= 2 admissible keys of entropy / ln(admissible), computed plainly."""
    scores = scores.masked_fill(~allowed, float("-inf"))
    values = []
    for row, ok in zip(scores.reshape(-1, scores.shape[-1]), allowed.reshape(-1, allowed.shape[-1])):
        n = int(ok.sum())
        if n < 2:
            continue
        p = torch.softmax(row[ok], dim=0)
        values.append(float(-(p * p.log()).sum() / math.log(n)))
    return sum(values) / len(values)


@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "finfo_min", "gat", "gqa"])
def test_sdpa_row_statistics_match_a_direct_computation(mask_kind):
    """With every head and row in the sample (2 x 4 heads, 16 queries) the statistics are exact."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, 8, generator=gen) * 2.0
    heads_k = 2 if mask_kind == "gqa" else 4
    k = torch.randn(2, heads_k, 16, 8, generator=gen)
    allowed = torch.ones(2, 4, 16, 16, dtype=torch.bool)
    kwargs = {}
    if mask_kind == "causal":
        kwargs["is_causal"] = True
        allowed = torch.ones(16, 16, dtype=torch.bool).tril().expand(2, 4, 16, 16)
    elif mask_kind in ("bool", "finfo_min", "gat"):
        allowed = torch.rand(2, 1, 16, 16, generator=gen) > 0.4
        if mask_kind == "bool":
            kwargs["attn_mask"] = allowed
        else:
            value = torch.finfo(torch.float32).min if mask_kind == "finfo_min" else -9e15
            kwargs["attn_mask"] = torch.zeros(2, 1, 16, 16).masked_fill(~allowed, value)
        allowed = allowed.expand(2, 4, 16, 16)
    elif mask_kind == "gqa":
        kwargs["enable_gqa"] = True
    call = O.attention_call("scaled_dot_product_attention", (q, k, k), kwargs)
    stats = attention_stats(call)
    k_full = k.repeat_interleave(2, dim=1) if mask_kind == "gqa" else k
    scores = q @ k_full.transpose(-1, -2) / math.sqrt(8)
    assert stats["entropy"] == pytest.approx(direct_entropy(scores, allowed), abs=1e-4)
    assert stats["keys"] == 16 and stats["head_dim"] == 8 and stats["default_scale"] == 1.0


def test_multi_head_attention_statistics_match_its_own_weights():
    """nn.MultiheadAttention's per-head probabilities (need_weights, unaveraged) against the probe's."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.mul_(4)
    x = torch.randn(2, 10, 32)
    padding = torch.zeros(2, 10, dtype=torch.bool)
    padding[1, 6:] = True
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if O.call_name(func) == "multi_head_attention_forward":
                seen.append(O.attention_call("multi_head_attention_forward", args, kwargs or {}))
            return func(*args, **(kwargs or {}))

    with Spy():
        _, weights = mha(x, x, x, key_padding_mask=padding, need_weights=True, average_attn_weights=False)
    stats = attention_stats(seen[0])
    p = weights.detach()  # (batch, heads, queries, keys); padded keys have probability 0
    admissible = (~padding)[:, None, None, :].expand_as(p)
    entropy = -(torch.special.xlogy(p, p)).sum(-1) / admissible.sum(-1).float().log()
    assert stats["entropy"] == pytest.approx(float(entropy.mean()), abs=1e-4)
    assert stats["maxprob"] == pytest.approx(float(p.amax(-1).mean()), abs=1e-4)


def test_large_batches_and_long_sequences_are_sampled_and_still_close():
    """32 sequences x 12 heads x 256 queries: the sample (8 heads x 64 rows) is within 0.03 of the whole."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(32, 12, 256, 16, generator=gen) * 1.5
    k = torch.randn(32, 12, 256, 16, generator=gen)
    stats = attention_stats(O.attention_call("scaled_dot_product_attention", (q, k, k), {"is_causal": True}))
    allowed = torch.ones(256, 256, dtype=torch.bool).tril()
    p = torch.softmax((q @ k.transpose(-1, -2) / 4).masked_fill(~allowed, float("-inf")), -1)
    n = allowed.sum(-1).float()
    rows = -(torch.special.xlogy(p, p)).sum(-1)[..., 1:] / n[1:].log()
    assert stats["entropy"] == pytest.approx(float(rows.mean()), abs=0.03)


class _NanoGPTWithPositionRows(NanoGPT):
    """The position embedding's first rows instead of ``wpe(torch.arange(length))``: fx traces this on every
    torch initlint supports (torch 2.4's fx cannot call ``torch.arange`` on a traced length; the audit then
    takes the runtime capture, but this test needs both)."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.transformer.wte(idx) + self.transformer.wpe.weight[: idx.shape[1]]
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def test_both_capture_backends_measure_the_same_attention():
    torch.manual_seed(0)
    model = _NanoGPTWithPositionRows(dim=64, layers=2, init="normal")
    x = ids(512, 4, 32)
    stats = []
    for backend in (FxCapture, RuntimeCapture):
        cap = backend(model)
        probe = run_probe(cap, (x,), {}, backward=False)
        stats.append([(op.module, round(probe.ops[op.id]["entropy"], 5)) for op in cap.graph if op.kind == "attention"])
    assert stats[0] == stats[1] and len(stats[0]) == 2
    assert all(entropy < 0.1 for _, entropy in stats[0])


def test_attention_statistics_add_no_host_sync_per_layer():
    def syncs(depth):
        torch.manual_seed(0)
        model = NanoGPT(dim=32, heads=2, layers=depth)
        x = ids(512, 2, 16)
        initlint.audit(model, x)
        with counting_syncs() as counts:
            initlint.audit(model, x)
        return counts

    assert syncs(1) == syncs(6)


# ----------------------------------------------------------------------------- IL011 on real architectures
def test_gpt2_with_query_and_key_scaled_up_is_flagged_at_c_attn():
    torch.manual_seed(0)
    model = tf.GPT2Model(tf.GPT2Config(n_layer=2, n_embd=768, n_head=12, vocab_size=50257))
    with torch.no_grad():
        for block in model.h:
            block.attn.c_attn.weight[:, :2 * 768].mul_(10)  # Conv1D keeps (in, out): q and k columns
    report = initlint.audit(model, {"input_ids": ids(50257)}, select=["IL011"])
    assert codes(report, "IL011") == {"h.0.attn.c_attn", "h.1.attn.c_attn"}
    assert all("zeros_" not in f.fix for f in report.findings)


def test_bert_with_query_and_key_times_ten_is_flagged_at_the_query_projection():
    torch.manual_seed(0)
    model = tf.BertModel(tf.BertConfig(hidden_size=768, num_hidden_layers=2, num_attention_heads=12,
                                       intermediate_size=3072))
    with torch.no_grad():
        for layer in model.encoder.layer:
            layer.attention.self.query.weight.mul_(10)
            layer.attention.self.key.weight.mul_(10)
    report = initlint.audit(model, {"input_ids": ids(30522)}, select=["IL011"])
    assert codes(report, "IL011") == {f"encoder.layer.{i}.attention.self.query" for i in range(2)}
    fix = report.findings[0].fix
    assert "attention.self.query.weight" in fix and "attention.self.key.weight" in fix and "value" not in fix


def test_vit_with_dim_head_to_the_plus_half_names_the_scale_not_the_weights():
    torch.manual_seed(0)
    model = ViT(scale_power=0.5)
    report = initlint.audit(model, torch.randn(2, 3, 64, 64))
    assert codes(report, "IL011") == {f"layers.{i}.0" for i in range(6)}
    assert codes(report, "IL004") == set()  # attention rows are IL011's, not a classifier's softmax
    grouped = [f for f in report.findings if f.code == "IL011"]
    assert len(grouped) == 1 and grouped[0].module == "layers.{0..5}.0"
    assert grouped[0].fix.startswith("scale = 64 ** -0.5") and "to_qkv" not in grouped[0].fix


def test_normal_init_nanogpt_is_flagged_in_every_block():
    torch.manual_seed(0)
    model = NanoGPT(init="normal")
    report = initlint.audit(model, ids(512, 2, 64), select=["IL011"])
    assert codes(report, "IL011") == {f"transformer.h.{i}.attn.c_attn" for i in range(6)}


def test_multi_head_attention_module_with_large_projections_is_flagged():
    torch.manual_seed(0)
    model = AttentionOnly(depth=2)
    with torch.no_grad():
        model.layers[1].in_proj_weight.mul_(20)
    report = initlint.audit(model, torch.randn(2, 16, 256), select=["IL011"])
    assert codes(report, "IL011") == {"layers.1"}
    assert report.findings[0].fix == "nn.init.xavier_uniform_(model.layers[1].in_proj_weight)"


def test_healthy_and_masked_attention_is_not_flagged():
    """Causal, padded and GAT-style (-9e15) masked attention at a healthy init: rows are judged
    against the keys they may see, so none of it looks saturated."""
    torch.manual_seed(0)

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(64, 192)

        def forward(self, x):
            q, k, v = (t.unflatten(-1, (4, 16)).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
            keep = torch.zeros(x.shape[1], x.shape[1], dtype=torch.bool)
            keep[:, :3] = True  # every query may see three keys
            bias = torch.zeros(keep.shape).masked_fill(~keep, -9e15)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            b = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return (a + b).transpose(1, 2).flatten(2)

    assert codes(initlint.audit(Masked(), torch.randn(2, 24, 64), select=["IL011"]), "IL011") == set()
    model = tf.LlamaModel(tf.LlamaConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=512, vocab_size=1000))
    mask = torch.ones(2, 32, dtype=torch.long)
    mask[0, 8:] = 0  # one sequence mostly padding
    report = initlint.audit(model, {"input_ids": ids(1000), "attention_mask": mask}, select=["IL011"])
    assert codes(report, "IL011") == set()


class ReducedKeys(nn.Module):
    """Attention whose keys and values are the tokens pooled to ``keys`` (SegFormer's spatial reduction)."""

    def __init__(self, keys, gain=1.0):
        super().__init__()
        self.q, self.kv = nn.Linear(64, 64), nn.Linear(64, 128)
        for layer in (self.q, self.kv):
            nn.init.normal_(layer.weight, std=gain / 8)
        self.keys = keys

    def forward(self, x):
        pooled = F.adaptive_avg_pool1d(x.transpose(1, 2), self.keys).transpose(1, 2)
        q = self.q(x).unflatten(-1, (4, 16)).transpose(1, 2)
        k, v = (t.unflatten(-1, (4, 16)).transpose(1, 2) for t in self.kv(pooled).chunk(2, -1))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)


def test_attention_with_a_single_key_per_query_is_not_judged():
    # SegFormer-B0 on a 32 x 32 image: stage 0 reduces its 8 x 8 tokens by 8 to one key, so every row
    # is one-hot by shape; IL011 reported "mean entropy 0, mean max-probability 0" there
    x = torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    assert codes(initlint.audit(ReducedKeys(1), x, select=["IL011"]), "IL011") == set()
    # with 16 keys the same layers are judged: clean at 1 / sqrt(fan_in), flagged at 8 times it
    for gain, expected in ((1.0, set()), (8.0, {"q"})):
        torch.manual_seed(0)
        assert codes(initlint.audit(ReducedKeys(16, gain), x, select=["IL011"]), "IL011") == expected
    config = tf.SegformerConfig()
    torch.manual_seed(0)
    report = initlint.audit(tf.SegformerModel(config), torch.randn(2, 3, 32, 32), select=["IL011"])
    assert report.error is None and codes(report, "IL011") == set()


def test_a_large_unnormalised_input_is_named_as_the_cause():
    from transformer_models import CausalSelfAttention

    torch.manual_seed(0)
    model = CausalSelfAttention(256, 4)  # default nn.Linear init: the projection keeps its input's scale
    report = initlint.audit(model, 30 * torch.randn(2, 32, 256), select=["IL011"])
    assert codes(report, "IL011") == {"c_attn"}
    assert "the input of the q/k projection c_attn has scale (rms) 29.9" in report.findings[0].message
    assert report.findings[0].fix.startswith("normalise the input of c_attn")


def test_a_fixed_std_too_large_for_the_width_names_the_projections_and_the_std_the_width_needs():
    """Llama-3-70B's shape at Hugging Face's std 0.02 (hidden 8192, head dim 128): q and k gain 1.81 each on a
    normalised input, scores of std 3.3. The same statistics at hidden 256 (std 0.02 * sqrt(8192 / 256)):
    the cause is the projections' std, not the input (rms 1 after the norm); the fix names 1/sqrt(fan_in)."""
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=256, intermediate_size=896, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=2, head_dim=128, vocab_size=64, initializer_range=0.02 * 32 ** 0.5)
    model = tf.LlamaForCausalLM(config)
    report = initlint.audit(model, {"input_ids": ids(64, 2, 32)}, select=["IL011"])
    assert codes(report, "IL011") == {"model.layers.0.self_attn.q_proj"}
    finding = report.findings[0]
    assert "the scores have std 3.3" in finding.message and "has weight std 0.113, 1.81x the 1/sqrt(fan_in 256)" \
        in finding.message
    assert finding.fix == "nn.init.normal_(model.model.layers[0].self_attn.q_proj.weight, std=0.0625)"


@pytest.mark.parametrize("mask_value", [float("-inf"), -torch.finfo(torch.float32).max, -1e4])
def test_explicit_causal_softmax_is_judged_against_the_keys_each_query_sees(mask_value):
    class Causal(nn.Module):
        def __init__(self):
            super().__init__()
            self.qk = nn.Linear(64, 128)

        def forward(self, x):
            q, k = (t.unflatten(-1, (4, 16)).transpose(1, 2) for t in self.qk(x).chunk(2, -1))
            sim = torch.einsum("bhid,bhjd->bhij", q, k) * 16 ** -0.5
            causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
            return sim.masked_fill(causal, mask_value).softmax(dim=-1)

    torch.manual_seed(0)
    model, x = Causal(), torch.randn(2, 24, 64)
    report = initlint.audit(model, x, select=["IL011", "IL004"])
    softmax = next(op for op in report.graph if op.kind == "softmax")
    with torch.no_grad():
        p = model(x)
    allowed = p > 0
    n = allowed.sum(-1).float()
    expected = (-(torch.special.xlogy(p, p)).sum(-1)[..., 1:] / n[..., 1:].log()).mean()
    assert report.probe.ops[softmax.id]["entropy"] == pytest.approx(float(expected), abs=1e-4)
    assert float(expected) > 0.9 and report.codes() == []


class Phrases(nn.Module):
    """Self-attention written out, its mask letting each token see the tokens of its own phrase (Grounding
    DINO's text enhancer): text without phrase delimiters leaves each token itself alone."""

    def __init__(self, gain: float = 1.0):
        super().__init__()
        self.qk = nn.Linear(64, 128)
        nn.init.normal_(self.qk.weight, std=gain / 8)

    def forward(self, x, phrase):
        q, k = (t.unflatten(-1, (4, 16)).transpose(1, 2) for t in self.qk(x).chunk(2, -1))
        sim = q @ k.transpose(-1, -2) * 16 ** -0.5
        same = phrase[:, None, :, None] == phrase[:, None, None, :]
        return sim.masked_fill(~same, torch.finfo(sim.dtype).min).softmax(dim=-1)


def test_rows_a_mask_leaves_with_one_key_are_not_saturation():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(0))
    alone = torch.arange(16).expand(2, 16)  # every token its own phrase: one key per row
    assert codes(initlint.audit(Phrases(), (x, alone), select=["IL011"]), "IL011") == set()
    # phrases of four tokens: the rows that see four keys are judged, and large projections still flagged
    four = alone // 4
    assert codes(initlint.audit(Phrases(), (x, four), select=["IL011"]), "IL011") == set()
    assert codes(initlint.audit(Phrases(gain=16.0), (x, four), select=["IL011"]), "IL011") == {"qk"}
    # with scores that large, exact zeros can be the scores' own: one-hot rows count as saturated again
    assert codes(initlint.audit(Phrases(gain=64.0), (x, alone), select=["IL011"]), "IL011") == {"qk"}


def test_a_nan_filled_attention_model_is_il009s_finding_and_no_rule_crashes():
    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 32)
            self.att = nn.MultiheadAttention(32, 4, batch_first=True)
            self.fc = nn.Linear(32, 100)

        def forward(self, x):
            h = self.emb(x)
            a, _ = self.att(h, h, h)
            return self.fc(h + a)

    torch.manual_seed(0)
    model = Tokens()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    codes = {(f.code, f.module) for f in initlint.audit(model, torch.randint(0, 100, (4, 16))).findings}
    assert ("IL009", "emb") in codes
    assert not any(code == "IL000" for code, _ in codes)


@pytest.mark.parametrize("sdpa", [True, False], ids=["sdpa", "written"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_one_set_of_weights_gets_one_verdict_at_16_and_2048_tokens(causal, sdpa):
    """Scores of std 2.2 and 3.1 either side of the limit (2.62: entropy 0.5 over 64 keys). A fixed entropy
    limit flagged std 2.8 at 16 tokens (entropy 0.44) and passed it at 2048 (0.55); judged against what such
    scores give over the rows' own key count, each std gets one verdict at every length."""
    for std, saturated in ((2.2, False), (3.1, True)):
        torch.manual_seed(0)
        model = ScoresOfStd(std, causal, sdpa)
        for length in (16, 512, 2048):
            x = torch.randn(1, length, 256, generator=torch.Generator().manual_seed(1))
            report = initlint.audit(model, x, select=["IL011"])
            assert bool(codes(report, "IL011")) == saturated, (std, length, [f.message for f in report.findings])
            if saturated:
                finding = report.findings[0]
                assert finding.value < finding.threshold
                assert ("keys, the same score spread as 0.5 at 64 keys" in finding.message) == (length != 64)


def test_the_entropy_limit_is_what_scores_of_one_std_give_over_each_key_count():
    from initlint.rules.spread import entropy_limit, gaussian_entropy, limit_std

    std = limit_std(0.5)
    assert std == pytest.approx(2.62, abs=0.02)
    assert entropy_limit(64, 0.5) == 0.5
    limits = [entropy_limit(n, 0.5) for n in (2, 16, 512, 2048, 1 << 20)]
    assert limits == sorted(limits) and limits[-1] == entropy_limit(1 << 16, 0.5)
    for n, limit in ((16, limits[1]), (2048, limits[3])):  # an independent draw of many rows agrees
        z = torch.randn(4096, n, generator=torch.Generator().manual_seed(5)) * std
        p = torch.softmax(z, -1)
        assert float(torch.special.entr(p).sum(-1).mean()) / math.log(n) == pytest.approx(limit, abs=0.01)
    assert gaussian_entropy(16, 3.0) < limits[1] and gaussian_entropy(2048, 3.0) < limits[3]
