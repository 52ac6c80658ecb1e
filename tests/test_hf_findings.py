"""Findings on transformers models at their default init, checked against the init code that causes them
(transformers 5.24), and a tied weight's declared init read as ``init_weights`` draws it."""
import logging

import pytest
import torch

import initlint

tf = pytest.importorskip("transformers")

tf.logging.set_verbosity_error()
logging.getLogger("transformers").setLevel(logging.ERROR)


def loud(model, **options):
    report = initlint.audit(model, batch_size=2, **options)
    assert report.error is None
    return {(f.code, m) for f in report.findings if f.severity != "info" for m in f.members or [f.module]}


def mt5(width=512):
    return tf.MT5ForConditionalGeneration(tf.MT5Config(vocab_size=1000, d_model=width, d_ff=128, num_layers=1,
                                                       num_decoder_layers=1, num_heads=4, d_kv=16))


def test_mt5_ties_an_n01_lm_head_without_t5s_rescale_and_its_logits_are_one_hot():
    # MT5Config forces tie_word_embeddings=True; MT5PreTrainedModel._init_weights draws shared.weight from
    # N(0, factor * 1.0), and MT5 has no T5's scale_decoder_outputs (d_model ** -0.5 before lm_head).
    torch.manual_seed(0)
    model = mt5()
    assert model.lm_head.weight is model.shared.weight and abs(float(model.shared.weight.detach().std()) - 1) < 0.01
    assert ("IL004", "lm_head") in loud(model)
    # the same model with the tied weight drawn at d_model ** -0.5: no IL004
    torch.manual_seed(0)
    twin = mt5()
    with torch.no_grad():
        twin.shared.weight.normal_(0, 512 ** -0.5)
    assert ("IL004", "lm_head") not in loud(twin)


def test_blip_vision_default_initializer_range_1e_10_is_a_vanishing_qkv():
    # BlipVisionConfig's initializer_range defaults to 1e-10; BlipPreTrainedModel._init_weights draws the
    # Linear weights (qkv among them) from N(0, initializer_range).
    torch.manual_seed(0)
    config = tf.BlipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 image_size=32, patch_size=8)
    assert config.initializer_range == 1e-10
    assert ("IL001", "encoder.layers.0.self_attn.qkv") in loud(tf.BlipVisionModel(config))
    torch.manual_seed(0)
    config.initializer_range = 0.02
    assert ("IL001", "encoder.layers.0.self_attn.qkv") not in loud(tf.BlipVisionModel(config))


def funnel_mlm():
    return tf.FunnelForMaskedLM(tf.FunnelConfig(vocab_size=300, d_model=32, n_head=2, d_head=16, d_inner=64,
                                                block_sizes=[1, 1], max_position_embeddings=64))


def test_funnels_tied_word_embeddings_keep_the_embedding_branchs_draw():
    # FunnelPreTrainedModel._init_weights draws word_embeddings from N(0, 1) (initializer_std None) and an
    # nn.Linear from N(0, 1 / (fan_in + fan_out)); init_weights draws lm_head untied, then ties it to
    # word_embeddings, so the tied weight keeps the embedding's draw.
    torch.manual_seed(0)
    model = funnel_mlm()
    assert model.lm_head.weight is model.funnel.embeddings.word_embeddings.weight
    assert abs(float(model.lm_head.weight.detach().std()) - 1) < 0.02
    assert not {f for f in loud(model, select=["IL014"])}
    # a Linear put back at PyTorch's default after the init is still flagged
    torch.manual_seed(0)
    twin = funnel_mlm()
    twin.funnel.encoder.blocks[0][0].ffn.linear_1.reset_parameters()
    assert loud(twin, select=["IL014"]) == {("IL014", "funnel.encoder.blocks.0.0.ffn.linear_1")}


def longformer(**config):
    return tf.LongformerModel(tf.LongformerConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                                                  num_attention_heads=4, intermediate_size=256, **config))


def test_longformers_own_padding_to_its_window_is_not_token_collapse():
    # LongformerModel pads 16 token ids to its 512-token attention window: 496 copies of one pad vector,
    # masked out of attention. Measured over all 512 positions, the tokens' mean cosine was 0.97 after the
    # first block and IL013 fired; the probe now measures the first 16 positions, the ids' own.
    torch.manual_seed(0)
    model = longformer(attention_window=512)
    ids = torch.randint(2, 1000, (2, 16), generator=torch.Generator().manual_seed(0))
    report = initlint.audit(model, {"input_ids": ids}, select=["IL013"])
    assert [(f.code, f.module) for f in report.findings] == []
    # its twin: the same model with every attention output projection at 30x (as IL013's bad example) collapses
    torch.manual_seed(0)
    twin = longformer(attention_window=512)
    with torch.no_grad():
        for layer in twin.encoder.layer:
            layer.attention.self.value.weight.mul_(30)
            layer.attention.output.dense.weight.mul_(30)
    flagged = initlint.audit(twin, {"input_ids": ids}, select=["IL013"]).findings
    assert [f.code for f in flagged] == ["IL013"]


def lightglue():
    if not hasattr(tf, "LightGlueConfig"):
        pytest.skip(f"transformers {tf.__version__} has no LightGlue")
    torch.manual_seed(0)
    detector = dict(model_type="superpoint", encoder_hidden_sizes=[16, 16, 32, 32], decoder_hidden_size=64,
                    keypoint_decoder_dim=65, descriptor_decoder_dim=64, max_keypoints=64)
    return tf.LightGlueForKeypointMatching(tf.LightGlueConfig(num_hidden_layers=2, descriptor_dim=64,
                                                              num_attention_heads=2, keypoint_detector_config=detector))


def test_lightglues_attention_inside_residual_blocks_is_not_a_stack_without_residuals():
    # LightGlue's layer: descriptors + mlp(cat(descriptors, self_attention(descriptors))), then the same with
    # cross-attention to the other image's keypoints. Its streams are conditioned on the other image, so no
    # stream is judged; its self-attention outputs are not those of a stack without residual connections
    # (IL013 said "no residual connection carries each token's own vector", cosine 1 at
    # transformer_layers.0.self_attention).
    model = lightglue()
    pairs = torch.randn(2, 2, 3, 64, 64)
    report = initlint.audit(model, {"pixel_values": pairs}, select=["IL013"])
    assert report.error is None and report.probe.forward_ran
    assert not [f for f in report.findings if f.code == "IL013"]


def test_a_keypoint_matcher_is_probed_with_pairs_of_images():
    # "Input must be a 5D tensor of shape (batch_size, 2, num_channels, height, width)"
    model = lightglue()
    report = initlint.audit(model, batch_size=2, select=["IL013", "IL006"])
    assert report.error is None and report.probe.forward_ran and report.probe.backward_ran
    assert any(n.endswith("probed with pixel_values as (2, 2, 3, 224, 224)") for n in report.notes), report.notes


def test_oneformers_queries_repeat_one_task_token_and_are_not_token_collapse():
    # OneFormer's query transformer starts every query as the same task token
    # (task_token.repeat(num_queries, 1, 1)), told apart by the positions added to queries and keys; IL013
    # measured its rise from the Swin backbone's patches (cosine 0.00027 -> 1 at its first decoder layer)
    torch.manual_seed(0)
    config = tf.OneFormerConfig()
    config.backbone_config.depths = [1, 1, 1, 1]
    config.encoder_layers, config.text_encoder_num_layers, config.decoder_layers = 1, 1, 2
    report = initlint.audit(tf.OneFormerModel(config), batch_size=2, select=["IL013"])
    assert report.error is None and report.probe.forward_ran
    assert not [f for f in report.findings if f.code == "IL013"]


def test_glm5_next_indexers_gate_of_ones_under_no_grad_is_information():
    # Glm5NextPreTrainedModel._init_weights: init.ones_(module.index_kpool_compress_gate), so its 128 rows are
    # equal; Glm5NextTextIndexer.forward is decorated @torch.no_grad(): the model's loss never reaches it.
    config = tf.Glm5NextTextConfig(vocab_size=1000, pad_token_id=0, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                   kv_lora_rank=32, q_lora_rank=32, v_head_dim=16, qk_nope_head_dim=16,
                                   linear_head_dim=16, mlp_layer_types=["dense", "dense"],
                                   layer_types=["linear_attention", "indexed_attention"])
    torch.manual_seed(0)
    report = initlint.audit(tf.Glm5NextTextModel(config), batch_size=2)
    assert report.error is None
    indexer = {f.code: f for f in report.findings if f.module == "layers.1.self_attn.indexer"}
    assert {"IL008", "IL004"} <= set(indexer)
    assert all(f.severity == "info" and "autograd off" in f.message for f in indexer.values())
    assert not [f for f in report.findings if f.severity != "info"]


def test_rf_detrs_learned_queries_and_box_offsets_are_not_residual_growth_or_signal_drift():
    """RF-DETR's decoder starts from a parameter, its learned queries (``query_feat.weight + self_attn(...)``), and
    adds the box positions to each block's output only as queries of the next attention: that sum is no residual
    branch of the positions. Its proposals' box centres (0.58) get a learned offset of 0.001: what the decoder
    computes from the sum is not a signal exploding from 0.001. Before, IL012 flagged every ``self_attn.o_proj``
    (14.8x at the real width) and IL005 a 708x explosion from the offset."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "RfDetrModel"):
        pytest.skip("this transformers has no RF-DETR")
    torch.manual_seed(0)
    backbone = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, image_size=112, patch_size=14,
                    num_windows=2, out_features=["stage1", "stage2", "stage3", "stage4"], out_indices=[1, 2, 3, 4],
                    model_type="rf_detr_dinov2")
    config = transformers.RfDetrConfig(backbone_config=backbone, d_model=64, decoder_layers=2,
                                       decoder_attention_heads=4, num_queries=30, group_detr=2, intermediate_size=128)
    report = initlint.audit(transformers.RfDetrModel(config), select=["IL005", "IL012"])
    assert not [f.module for f in report.findings if f.code == "IL012" and f.module.endswith("self_attn.o_proj")]
    assert not [f.message for f in report.findings if f.code == "IL005" and "explodes" in f.message]
