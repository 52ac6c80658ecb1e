"""IL012 residual-growth and IL013 token-collapse on hand-written and real transformers."""
import logging
import math
import os
import sys

import pytest
import torch

import initlint
from initlint.rules import Audit
from initlint.rules.base import measured, residual_adds
from transformer_models import AttentionOnly, NanoGPT, ResidualAttention

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from seed_models import PostNormResidualMLP  # noqa: E402

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()
logging.getLogger("transformers").setLevel(logging.ERROR)


def codes(report, code):
    return {m for c, m in report.codes() if c == code}


def ids(vocab, batch=2, length=64):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------- residual additions
def test_residual_additions_are_found_with_their_stream_and_branch():
    torch.manual_seed(0)
    model = NanoGPT(dim=64, layers=3)
    report = initlint.audit(model, ids(512, 2, 16), select=["IL012"])
    adds = residual_adds(report.graph)
    assert [r.layers[-1].module for r in adds] == [f"transformer.h.{i}.{part}.c_proj"
                                                   for i in range(3) for part in ("attn", "mlp")]
    audit = Audit(model=model, graph=report.graph, probe=report.probe)
    first = adds[0]
    # the stream of the first block is the embedding sum; its branch ends at the attention's c_proj
    assert measured(audit, first.stream).kind == "add" and measured(audit, first.branch).module.endswith("attn.c_proj")
    # x + pos_emb(x), rotary mixing and score + mask are not residual additions: no weight layer between
    assert all(any(layer.kind == "linear" for layer in r.layers) for r in adds)


# ----------------------------------------------------------------------------- IL012
def test_post_norm_bert_with_output_projections_times_twenty():
    torch.manual_seed(0)
    model = tf.BertModel(tf.BertConfig(num_hidden_layers=3))
    with torch.no_grad():
        for layer in model.encoder.layer:
            layer.attention.output.dense.weight.mul_(20)
            layer.output.dense.weight.mul_(20)
    report = initlint.audit(model, {"input_ids": ids(30522, 2, 32)}, select=["IL012"])
    assert codes(report, "IL012") == {f"encoder.layer.{i}.{part}" for i in range(3)
                                      for part in ("output.dense", "attention.output.dense")}
    assert all(f.fix.startswith("nn.init.normal_(model.encoder.layer[") for f in report.findings)


def test_one_oversized_branch_is_located_at_its_block():
    torch.manual_seed(0)
    model = NanoGPT()
    with torch.no_grad():
        model.transformer.h[3].mlp.c_proj.weight.mul_(20)
    report = initlint.audit(model, ids(512), select=["IL012"])
    assert codes(report, "IL012") == {"transformer.h.3.mlp.c_proj"}
    # 20x the same layer of the other blocks: the fix gives it their scale back
    c_proj = model.transformer.h[0].mlp.c_proj.weight
    assert report.findings[0].fix.startswith("nn.init.normal_(model.transformer.h[3].mlp.c_proj.weight, std=")
    assert float(report.findings[0].fix.split("std=")[1].split(")")[0]) == pytest.approx(c_proj.std().item(), rel=0.05)


def test_every_mlp_branch_scaled_alike_is_information_and_one_scaled_block_warns():
    """Every MLP's output projection x30: the first MLP dwarfs a stream of the embedding and one small
    attention branch (about 20x), and every later MLP matches it. The calibration's runs of that stack
    (``residual_training.py --branch mlp``) learned sooner than the unscaled one, so it is information;
    only the third block's x30 stands out, drowns the blocks after it, and warns."""
    def scaled(blocks):
        torch.manual_seed(0)
        model = NanoGPT()
        with torch.no_grad():
            for i in blocks:
                model.transformer.h[i].mlp.c_proj.weight.mul_(30)
        return initlint.audit(model, ids(512), select=["IL012"])

    every = scaled(range(6))
    assert [(f.module, f.severity) for f in every.findings] == [("transformer.h.0.mlp.c_proj", "info")]
    assert every.findings[0].value > 4 * every.findings[0].threshold and "a later branch" in every.findings[0].message
    one = scaled([2])
    assert [(f.module, f.severity) for f in one.findings] == [("transformer.h.2.mlp.c_proj", "warning")]


def test_an_embedding_drowned_by_the_first_branch():
    """The issue's nanoGPT-style model with every weight N(0, 1): the first attention branch adds a
    signal ~180x the embedding's (c_attn and c_proj far above 1/sqrt(fan_in))."""
    torch.manual_seed(0)
    report = initlint.audit(NanoGPT(init="normal"), ids(512), select=["IL012"])
    # reported at the first over-scaled layer of the branch; the fix re-initialises both
    assert codes(report, "IL012") == {"transformer.h.0.attn.c_attn"}
    assert report.findings[0].fix.startswith("nn.init.normal_(model.transformer.h[0].attn.c_attn.weight, std=0.0625); "
                                             "nn.init.normal_(model.transformer.h[0].attn.c_proj.weight, std=0.0625)")
    assert report.findings[0].value > report.findings[0].threshold
    # pre-norm stacks trained unharmed with the embedding drowned 193x (benchmarks/residual_training.py)
    assert report.findings[0].severity == "info"


def test_post_norm_limit_and_a_normalised_stream_at_default_init():
    """nn.TransformerEncoder (post-norm): 0.26 at default init; its feed-forward output x10 crosses 1."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
    x = torch.randn(2, 32, 512)
    assert codes(initlint.audit(model, x, select=["IL012"]), "IL012") == set()
    with torch.no_grad():
        for block in model.layers:
            block.linear2.weight.mul_(10)
    assert codes(initlint.audit(model, x, select=["IL012"]), "IL012") == {f"layers.{i}.linear2" for i in range(3)}


def test_default_nanogpt_is_clean():
    torch.manual_seed(0)
    report = initlint.audit(NanoGPT(), ids(512), select=["IL011", "IL012", "IL013"])
    assert report.codes() == []


# ----------------------------------------------------------------------------- IL013
def test_attention_only_stack_collapses_and_the_residual_one_does_not():
    torch.manual_seed(0)
    x = torch.randn(2, 32, 256, generator=torch.Generator().manual_seed(0))
    report = initlint.audit(AttentionOnly(), x, select=["IL013"])
    assert codes(report, "IL013") == {"layers.1"}
    assert report.findings[0].value > 0.95
    assert "x = x + attn(" in report.findings[0].fix
    torch.manual_seed(0)
    assert codes(initlint.audit(ResidualAttention(), x, select=["IL013"]), "IL013") == set()


def test_attention_only_stack_of_causal_sdpa_collapses():
    from transformer_models import CausalSelfAttention

    class SDPAOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(256) for _ in range(8))
            self.attn = torch.nn.ModuleList(CausalSelfAttention(256, 8) for _ in range(8))

        def forward(self, x):
            for norm, attn in zip(self.norms, self.attn):
                x = attn(norm(x))
            return x

    torch.manual_seed(0)
    report = initlint.audit(SDPAOnly(), torch.randn(2, 32, 256), select=["IL013"])
    flagged = codes(report, "IL013")
    assert len(flagged) == 1 and flagged.pop().startswith("attn.")


def test_inputs_that_are_alike_from_the_start_are_not_a_collapse():
    torch.manual_seed(0)
    x = torch.randn(1, 1, 256).expand(2, 32, 256) + 0.01 * torch.randn(2, 32, 256)
    assert codes(initlint.audit(AttentionOnly(), x, select=["IL013"]), "IL013") == set()


@pytest.mark.parametrize("share_last", [False, True])
def test_zero_branch_ends_zeroes_a_branch_end_that_only_feeds_its_addition(share_last):
    torch.manual_seed(0)
    model, x = PostNormResidualMLP(share_last=share_last), torch.randn(64, 16)
    options = {"IL012": {"zero-branch-ends": True}}
    flagged = codes(initlint.audit(model, x, select=["IL012"], rule_options=options), "IL012")
    # a shared fc2 has one module path (blocks.2.fc2), reported once
    assert flagged == ({"blocks.1.fc2", "blocks.2.fc2"} if share_last else {"blocks.1.fc2", "blocks.2.fc2", "blocks.3.fc2"})
    result = initlint.fix(model, x, rule_options=options)
    assert not result.after.findings
    zeroed = {c.name for c in result.changes if c.init.startswith("nn.init.zeros_")}
    redrawn = {c.name for c in result.changes if c.init.startswith("nn.init.normal_")}
    if share_last:  # blocks 2 and 3 share fc2: zeroing it would change both, so it gets the depth-aware draw
        assert zeroed == {"blocks.1.fc2.weight", "blocks.1.fc2.bias"}
        assert redrawn == {"blocks.2.fc2.weight"}
    else:
        assert zeroed == {f"blocks.{i}.fc2.{p}" for i in (1, 2, 3) for p in ("weight", "bias")}
        assert not redrawn
        assert all(float(model.blocks[i].fc2.weight.detach().abs().max()) == 0.0 for i in (1, 2, 3))


def test_without_zero_branch_ends_the_branch_end_gets_the_depth_aware_scale():
    torch.manual_seed(0)
    model, x = PostNormResidualMLP(), torch.randn(64, 16)
    result = initlint.fix(model, x)
    assert not result.after.findings
    assert {c.name: c.after_std for c in result.changes} == pytest.approx(
        {f"blocks.{i}.fc2.weight": 1 / math.sqrt(512 * 4) for i in (1, 2, 3)}, rel=0.05)


# ----------------------------------------------------------------------------- length of the probe
def _small_llama():
    config = tf.LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=2, num_attention_heads=8,
                            num_key_value_heads=8, vocab_size=1000, max_position_embeddings=2048)
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(config)


def _il012_values(report):
    return {f.module: f.value for f in report.findings if f.code == "IL012"}


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_a_causal_model_gets_the_same_residual_verdict_at_16_and_2048_tokens(scale):
    """Causal attention averages over the tokens before each query, so its branch shrinks with the sequence;
    IL012 compares the scales over the first 16 positions, which do not depend on what comes after them."""
    model = _small_llama()
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(scale)
    long = ids(1000, 1, 2048)
    short = initlint.audit(model, {"input_ids": long[:, :16]}, select=["IL012"])
    whole = initlint.audit(model, {"input_ids": long}, select=["IL012"])
    assert short.codes() == whole.codes()
    assert bool(short.codes()) == (scale > 1)
    for module, value in _il012_values(short).items():
        assert _il012_values(whole)[module] == pytest.approx(value, rel=1e-4)


def test_the_leading_positions_scale_is_measured_on_flattened_tokens():
    """A block that flattens its tokens to ``(batch * tokens, features)`` (OPT's MLP) is measured over the
    same leading positions of each sequence as a 3-D output."""
    from initlint.probe.rows import LEAD_TOKENS

    config = tf.OPTConfig(hidden_size=256, ffn_dim=1024, num_hidden_layers=1, num_attention_heads=4, vocab_size=1000,
                          word_embed_proj_dim=256, max_position_embeddings=512, dropout=0.0, attention_dropout=0.0,
                          activation_dropout=0.0, layerdrop=0.0)
    torch.manual_seed(0)
    model = tf.OPTForCausalLM(config)
    report = initlint.audit(model, {"input_ids": ids(1000, 2, 64)}, select=["IL012"])
    fc2 = next(op for op in report.graph if op.module == "model.decoder.layers.0.fc2")
    captured = {}
    handle = model.model.decoder.layers[0].fc2.register_forward_hook(lambda m, i, o: captured.setdefault("y", o))
    try:
        with torch.no_grad():
            model(input_ids=ids(1000, 2, 64))
    finally:
        handle.remove()
    lead = captured["y"].reshape(2, 64, -1)[:, :LEAD_TOKENS]
    assert report.probe.ops[fc2.id].lead_rms == pytest.approx(lead.pow(2).mean().sqrt().item(), rel=1e-4)


class QueryDecoder(torch.nn.Module):
    """DETR's design in small (MaskFormer's transformer module): a residual self-attention encoder over the
    input's tokens, then a decoder whose object queries start as ``torch.zeros_like(query_embed)`` and are
    told apart only by the learnt positions added to their queries and keys, attending to each other and
    then to the encoder's output. ``encoder_gain`` multiplies the encoder's value and output projections."""

    def __init__(self, dim=128, queries=32, encoder_gain=1.0):
        super().__init__()
        self.enc = torch.nn.ModuleList(torch.nn.MultiheadAttention(dim, 4, batch_first=True) for _ in range(3))
        self.enc_norms = torch.nn.ModuleList(torch.nn.LayerNorm(dim) for _ in range(3))
        self.query_embed = torch.nn.Embedding(queries, dim)
        self.self_attn = torch.nn.MultiheadAttention(dim, 4, batch_first=True)
        self.cross_attn = torch.nn.MultiheadAttention(dim, 4, batch_first=True)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(dim) for _ in range(2))
        with torch.no_grad():
            for bias in (self.self_attn.in_proj_bias, self.self_attn.out_proj.bias):  # as nn.Linear's (DETR's)
                bias.uniform_(-dim ** -0.5, dim ** -0.5)
            for attn in self.enc:
                attn.in_proj_weight[2 * dim:].mul_(encoder_gain)
                attn.out_proj.weight.mul_(encoder_gain)

    def forward(self, x):
        for attn, norm in zip(self.enc, self.enc_norms):
            h = norm(x)
            x = x + attn(h, h, h, need_weights=False)[0]
        pos = self.query_embed.weight.unsqueeze(0).expand(x.shape[0], -1, -1)
        tgt = torch.zeros_like(pos)
        q = tgt + pos
        tgt = self.norms[0](tgt + self.self_attn(q, q, tgt, need_weights=False)[0])
        return self.norms[1](tgt + self.cross_attn(tgt, x, x, need_weights=False)[0])


def test_object_queries_that_start_as_one_zero_vector_are_not_a_collapse_of_the_encoders_tokens():
    # MaskFormer at its default config: IL013 compared its decoder's queries after their first self-attention
    # (cosine 1: zeros plus the value projection's bias) with the start of its Swin backbone's patches
    # (cosine -0.002), two different sequences; each residual stream is now judged from its own start
    torch.manual_seed(0)
    x = torch.randn(2, 64, 128, generator=torch.Generator().manual_seed(0))
    assert codes(initlint.audit(QueryDecoder(), x, select=["IL013"]), "IL013") == set()
    # the encoder's own stream is still judged: its branches at 30x collapse its tokens
    torch.manual_seed(0)
    assert codes(initlint.audit(QueryDecoder(encoder_gain=30.0), x, select=["IL013"]), "IL013") == {""}


class MergedImageTokens(torch.nn.Module):
    """A vision-language model's first block in small (GOT-OCR2, LLaVA): token embeddings at std 0.02, image
    features from a tower that ends in a LayerNorm written into the image tokens' places with
    ``masked_scatter``, then a pre-norm MLP block whose branch is ``branch_std``'s scale."""

    IMAGE = 7

    def __init__(self, dim=256, branch_std=0.02):
        super().__init__()
        self.embed = torch.nn.Embedding(1000, dim)
        self.tower = torch.nn.Sequential(torch.nn.Linear(48, dim), torch.nn.LayerNorm(dim))
        self.projector = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.up, self.down = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)
        with torch.no_grad():
            self.embed.weight.normal_(0, 0.02)
            self.up.weight.normal_(0, 0.1)
            self.down.weight.normal_(0, branch_std)

    def forward(self, ids, patches):
        x = self.embed(ids)
        image = self.projector(self.tower(patches)).reshape(-1, x.shape[-1])
        x = x.masked_scatter((ids == self.IMAGE).unsqueeze(-1), image)
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def test_image_features_written_into_the_embeddings_leave_the_first_branch_on_the_embedding():
    # GOT-OCR2 at its default config: IL012 warned "adds 0.195 to the residual stream of scale 0.02, 9.71x (limit
    # 4x)" on its language model's first block, the limit of a built-up stream: the norm at the end of the
    # vision tower, reached through masked_scatter's image features, hid that the stream is the embedding
    torch.manual_seed(0)
    ids = torch.randint(8, 1000, (2, 32), generator=torch.Generator().manual_seed(0))
    ids[:, :4] = MergedImageTokens.IMAGE
    patches = torch.randn(2, 4, 48, generator=torch.Generator().manual_seed(1))
    report = initlint.audit(MergedImageTokens(branch_std=0.1), (ids, patches), select=["IL012"])  # 12x the stream
    assert [(f.code, f.module) for f in report.findings] == []
    # the same first branch at 20x that: past the embedding's limit (100x), still reported (as information)
    torch.manual_seed(0)
    [big] = initlint.audit(MergedImageTokens(branch_std=2.0), (ids, patches), select=["IL012"]).findings
    assert (big.code, big.module, big.severity) == ("IL012", "down", "info") and "the embedding" in big.message


def test_sams_prompt_tokens_added_to_its_queries_are_no_residual_stream():
    # SAM's two-way transformer: attn(q=queries + pe, k=keys + key_pe, v=...) with `queries` going on as the
    # stream; read as pe + branch(pe), the prompt tokens (std 0.02) made every block's attention and MLP a
    # branch "50x its stream" (IL012 at SAM's real config)
    config = tf.SamConfig(
        vision_config=dict(hidden_size=64, output_channels=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=256, mlp_dim=128, global_attn_indexes=[0], initializer_range=0.02,
                           num_pos_feats=32),
        prompt_encoder_config=dict(hidden_size=64, image_size=256, image_embedding_size=16),
        mask_decoder_config=dict(hidden_size=64, mlp_dim=128, num_attention_heads=2, iou_head_hidden_dim=64))
    torch.manual_seed(0)
    report = initlint.audit(tf.SamModel(config), batch_size=2, select=["IL012"])
    assert report.error is None and [f for f in report.findings if f.code == "IL012"] == []
    sums = [op for op in report.graph if op.kind == "add" and op.module.startswith("mask_decoder.transformer.layers")]
    residuals = {r.add.id for r in residual_adds(report.graph)}
    assert len(sums) > 4 and {op.id for op in sums} - residuals  # the query sums are found, and not residuals
    assert residuals & {op.id for op in sums}  # while the blocks' own additions still are
