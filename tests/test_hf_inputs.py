"""Hugging Face models are audited without example inputs: the probe batch comes from the config,
decoder inputs included for encoder-decoder models."""
import logging
import subprocess
import sys
import textwrap

import pytest
import torch
from cli_server import run_initlint

import initlint
from initlint.inputs.load import LoadError, infer_inputs

tf = pytest.importorskip("transformers")

tf.logging.set_verbosity_error()
logging.getLogger("transformers").setLevel(logging.ERROR)


def t5():
    return tf.T5ForConditionalGeneration(tf.T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16,
                                                     vocab_size=100))


def bart():
    return tf.BartForConditionalGeneration(tf.BartConfig(vocab_size=120, d_model=32, encoder_layers=1,
                                                         decoder_layers=1, encoder_attention_heads=2,
                                                         decoder_attention_heads=2, encoder_ffn_dim=64,
                                                         decoder_ffn_dim=64, max_position_embeddings=64))


def whisper():
    return tf.WhisperForConditionalGeneration(tf.WhisperConfig(
        vocab_size=120, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=30,
        max_target_positions=12, decoder_start_token_id=7, pad_token_id=3, bos_token_id=3, eos_token_id=3))


def assert_probed(model, batch):
    """The audit on the inferred inputs ran the forward and the backward probe."""
    report = initlint.audit(model, batch_size=batch)
    assert report.error is None and report.probe.forward_ran and report.probe.backward_ran
    return report


def test_t5_starts_its_decoder_with_the_pad_token():
    torch.manual_seed(0)
    model = t5()
    assert getattr(model.config, "decoder_start_token_id", None) is None  # T5 starts from pad (0)
    _, kwargs = infer_inputs(model, 3, 0)
    assert set(kwargs) == {"input_ids", "decoder_input_ids"}
    assert kwargs["decoder_input_ids"].shape == (3, 16)
    assert (kwargs["decoder_input_ids"][:, 0] == model.config.pad_token_id).all()
    assert int(kwargs["decoder_input_ids"].max()) < 100
    assert_probed(model, 3)


def test_bart_uses_its_decoder_start_token():
    torch.manual_seed(0)
    model = bart()
    _, kwargs = infer_inputs(model, 2, 0)
    assert (kwargs["decoder_input_ids"][:, 0] == model.config.decoder_start_token_id).all()
    assert initlint.audit(model, batch_size=2).error is None


def test_whisper_gets_a_spectrogram_of_the_length_its_encoder_takes():
    torch.manual_seed(0)
    model = whisper()
    _, kwargs = infer_inputs(model, 2, 0)
    assert kwargs["input_features"].shape == (2, 16, 60)  # mel bins x 2 * max_source_positions
    assert kwargs["decoder_input_ids"].shape == (2, 12)  # no longer than max_target_positions
    assert (kwargs["decoder_input_ids"][:, 0] == 7).all()
    report = initlint.audit(model, batch_size=2)
    assert report.error is None and report.probe.forward_ran


def test_an_encoder_decoder_without_any_start_token_says_what_to_pass():
    model = t5()
    model.config.pad_token_id = None
    try:
        infer_inputs(model, 2, 0)
    except LoadError as exc:
        assert "decoder_input_ids" in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError("expected a LoadError")


def test_the_command_line_audits_an_encoder_decoder_without_inputs(tmp_path):
    source = tmp_path / "seq2seq.py"
    source.write_text(textwrap.dedent("""
        import transformers as tf

        def build():
            config = tf.T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16, vocab_size=100)
            return tf.T5ForConditionalGeneration(config)
    """))
    out = run_initlint(["check", f"{source}:build", "--batch-size", "2", "--format", "concise"])
    assert out.returncode in (0, 1), out.stderr
    assert "decoder" not in out.stderr and "Traceback" not in out.stderr


# ---------------------------------------------------------------- sizes from sub-configs
def small(**extra):
    return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, **extra)


def clip():
    return tf.CLIPModel(tf.CLIPConfig(text_config=small(vocab_size=99, max_position_embeddings=32),
                                      vision_config=small(image_size=48, patch_size=16), projection_dim=16))


def llava(image_token=110):
    text = tf.LlamaConfig(**small(num_key_value_heads=2, vocab_size=120))
    vision = tf.CLIPVisionConfig(**small(image_size=32, patch_size=8))
    return tf.LlavaModel(tf.LlavaConfig(text_config=text, vision_config=vision, image_token_index=image_token,
                                        vision_feature_layer=-1))


def test_clip_gets_token_ids_and_images_at_its_vision_towers_size():
    torch.manual_seed(0)
    model = clip()
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"input_ids", "pixel_values"}
    assert kwargs["pixel_values"].shape == (2, 3, 48, 48)
    assert int(kwargs["input_ids"].max()) < 99
    assert_probed(model, 2)


def test_llava_gets_one_image_token_per_image_feature():
    torch.manual_seed(0)
    model = llava()
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"input_ids", "pixel_values"}
    assert kwargs["pixel_values"].shape == (2, 3, 32, 32)
    # (32 / 8)^2 = 16 patches, the class token dropped ("default" feature strategy): 16 features per image
    assert (kwargs["input_ids"] == 110).sum(dim=1).tolist() == [16, 16]
    assert kwargs["input_ids"].shape == (2, 16 + 16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = initlint.audit(model, batch_size=2)
    assert report.error is None and report.probe.forward_ran
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.training  # counting the features ran in eval mode, and the mode came back


def test_llava_whose_image_token_is_outside_its_vocabulary_runs_on_text():
    model = llava(image_token=120)  # the embedding has rows 0..119: the placeholder cannot be embedded
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"input_ids"}
    assert initlint.audit(model, batch_size=2).error is None


def test_a_composite_encoder_decoder_starts_from_its_decoders_pad_token():
    torch.manual_seed(0)
    bert = tf.BertConfig(**small(vocab_size=90))
    model = tf.EncoderDecoderModel(tf.EncoderDecoderConfig.from_encoder_decoder_configs(bert, bert))
    assert model.config.decoder_start_token_id is None and model.config.decoder.pad_token_id == 0
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"input_ids", "decoder_input_ids"}
    assert kwargs["decoder_input_ids"][:, 0].tolist() == [0, 0]
    assert initlint.audit(model, batch_size=2).error is None


def test_a_speech_encoder_decoder_gets_its_encoders_waveform():
    torch.manual_seed(0)
    encoder = tf.Wav2Vec2Config(**small(conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4),
                                        num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2))
    decoder = tf.BertConfig(**small(vocab_size=90))
    model = tf.SpeechEncoderDecoderModel(tf.SpeechEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder))
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"input_values", "decoder_input_ids"}
    assert kwargs["input_values"].dim() == 2 and kwargs["decoder_input_ids"][:, 0].tolist() == [0, 0]
    assert initlint.audit(model, batch_size=2).error is None


# ---------------------------------------------------------------- inputs a forward needs in training mode
def test_fastspeech2_gets_the_targets_it_needs_in_training_mode():
    torch.manual_seed(0)
    config = tf.FastSpeech2ConformerConfig(hidden_size=32, encoder_layers=1, decoder_layers=1, encoder_linear_units=64,
                                           decoder_linear_units=64, num_mel_bins=20, speech_decoder_postnet_units=32,
                                           duration_predictor_channels=32, energy_predictor_channels=32,
                                           pitch_predictor_channels=32, speech_decoder_postnet_layers=2)
    model = tf.FastSpeech2ConformerModel(config)
    assert config.is_encoder_decoder  # but its forward takes no decoder_input_ids
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"input_ids", "duration_labels", "pitch_labels", "energy_labels", "spectrogram_labels"}
    assert kwargs["spectrogram_labels"].shape == (2, int(kwargs["duration_labels"].sum(dim=1)[0]), 20)
    assert_probed(model, 2)


def test_molmo2_gets_its_token_types():
    if not hasattr(tf, "Molmo2Config"):
        pytest.skip(f"transformers {tf.__version__} has no Molmo2")
    torch.manual_seed(0)
    config = tf.Molmo2Config()
    text = config.get_text_config()
    for key, value in dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                           num_hidden_layers=1, intermediate_size=64, vocab_size=200).items():
        setattr(text, key, value)
    model = tf.Molmo2Model(config)
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"input_ids", "mm_token_type_ids"}
    assert int(kwargs["mm_token_type_ids"].sum()) == 0 and int(kwargs["input_ids"].max()) < 200  # text only
    assert initlint.audit(model, batch_size=2).error is None


def test_a_qwen_vl_vision_tower_gets_flattened_patches_and_their_grid():
    """Its forward takes ``hidden_states`` (patches of 3 x 2 x 16 x 16 values) and ``grid_thw``; its
    ``main_input_name`` is the text default, ``input_ids``."""
    torch.manual_seed(0)
    model = tf.Qwen3VLVisionModel(tf.Qwen3VLVisionConfig(depth=1, hidden_size=32, num_heads=2, intermediate_size=64,
                                                         out_hidden_size=32, deepstack_visual_indexes=[],
                                                         num_position_embeddings=64))
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"hidden_states", "grid_thw"}
    assert kwargs["grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]  # 2 x spatial_merge_size patches a side
    assert kwargs["hidden_states"].shape == (2 * 16, 3 * 2 * 16 * 16)
    assert_probed(model, 2)


def test_a_perceiver_without_a_preprocessor_gets_inputs_of_its_width():
    torch.manual_seed(0)
    model = tf.PerceiverModel(tf.PerceiverConfig(num_latents=8, d_latents=32, d_model=24, num_blocks=1,
                                                 num_self_attends_per_block=1, num_self_attention_heads=2,
                                                 num_cross_attention_heads=2))
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"inputs"} and kwargs["inputs"].shape == (2, 16, 24)
    assert initlint.audit(model, batch_size=2).error is None


def test_an_audio_spectrogram_transformer_gets_frames_by_mel_bins():
    torch.manual_seed(0)
    model = tf.ASTModel(tf.ASTConfig(**small(max_length=64, num_mel_bins=32)))
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"input_values"} and kwargs["input_values"].shape == (2, 64, 32)
    assert initlint.audit(model, batch_size=2).error is None


def test_an_audio_codec_gets_a_waveform_with_its_audio_channels():
    # EnCodec and Mimi take (batch, audio_channels, samples); a (batch, samples) waveform reached their
    # first Conv1d as one example of `batch` channels
    torch.manual_seed(0)
    model = tf.EncodecModel(tf.EncodecConfig(num_filters=8, hidden_size=32, codebook_dim=32, num_lstm_layers=1))
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"input_values"} and kwargs["input_values"].shape[:2] == (2, 1)
    report = initlint.audit(model, batch_size=2)
    assert report.error is None and report.probe.forward_ran
    # its convolutions are weight-normed: the weights are computed, not parameters, and the report says
    # the backward probe could not measure them
    assert not report.probe.backward_ran
    assert any("weight_norm" in note for note in report.notes)


def test_a_backbone_without_an_image_size_gets_imagenet_sized_images():
    # HGNetV2 at its default config: 32 x 32 images (the old default) end its stride-32 stages on 1 x 1 maps,
    # where BatchNorm normalises 2 values per channel (IL006 once flagged a 5.7e6x gradient spread there, from
    # convolutions into BatchNorms, whose scale is free); at 224 x 224, the size it was published at, the last
    # stage's maps are 7 x 7 and the audit is clean
    torch.manual_seed(0)
    model = tf.HGNetV2ForImageClassification(tf.HGNetV2Config())
    _, kwargs = infer_inputs(model, 2, 0)
    assert kwargs["pixel_values"].shape == (2, 3, 224, 224)
    report = initlint.audit(model, batch_size=2)
    assert [(f.code, f.module) for f in report.findings] == []
    last = max(report.probe.shapes.items(), key=lambda item: (len(item[1]) == 4 and item[1][-1] > 1, item[0]))
    assert last[1][-2:] == (7, 7)  # the last stage's maps (after it, the head pools them to 1 x 1)


@pytest.mark.parametrize("build, name, frames", [
    (lambda: tf.VideoMAEModel(tf.VideoMAEConfig(**small(image_size=32, patch_size=16, num_frames=4, tubelet_size=2))),
     "pixel_values", 4),
    (lambda: tf.TimesformerModel(tf.TimesformerConfig(**small(image_size=32, patch_size=16, num_frames=3))),
     "pixel_values", 3),
    (lambda: tf.VJEPA2Model(tf.VJEPA2Config(crop_size=32, patch_size=16, frames_per_clip=4, tubelet_size=2,
                                            hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                            pred_hidden_size=32, pred_num_hidden_layers=1,
                                            pred_num_attention_heads=4, pred_num_mask_tokens=2)),
     "pixel_values_videos", 4),
])
def test_a_video_model_gets_clips_of_the_frames_its_config_names(build, name, frames):
    # VideoMAE, TimeSformer, ViViT, X-CLIP and V-JEPA 2 take (batch, frames, channels, height, width); they
    # got 4-D images (or, where the input is `pixel_values_videos`, a 5-D tensor in Conv3d's order)
    torch.manual_seed(0)
    model = build()
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {name} and kwargs[name].shape == (2, frames, 3, 32, 32)
    report = initlint.audit(model, batch_size=2)
    assert report.error is None and report.probe.forward_ran


def test_a_head_on_a_backbone_gets_images_of_the_backbones_size():
    # ViTPose's config has no image_size of its own; its backbone's is 256 x 192, and at 224 x 224 the
    # forward refused the images ("doesn't match model (256*192)")
    torch.manual_seed(0)
    model = tf.VitPoseForPoseEstimation(tf.VitPoseConfig(backbone_config=dict(
        model_type="vitpose_backbone", hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)))
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"pixel_values"} and kwargs["pixel_values"].shape == (2, 3, 256, 192)
    assert initlint.audit(model, batch_size=2).error is None


def test_time_series_models_get_a_series_of_their_patches():
    # the series came from the first Linear's width: TimesFM got 64 values (two patches), PatchTST (2, 8)
    torch.manual_seed(0)
    timesfm = tf.TimesFmModel(tf.TimesFmConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                               num_attention_heads=2, head_dim=16))
    _, kwargs = infer_inputs(timesfm, 2, 0)
    assert {n: tuple(v.shape) for n, v in kwargs.items()} == {"past_values": (2, 512), "past_values_padding": (2, 512),
                                                            "freq": (2, 1)}
    assert initlint.audit(timesfm, batch_size=2).error is None
    patchtst = tf.PatchTSTModel(tf.PatchTSTConfig(num_input_channels=3, context_length=64, patch_length=8, patch_stride=8,
                                                  d_model=32, num_attention_heads=2, num_hidden_layers=1, ffn_dim=64))
    _, kwargs = infer_inputs(patchtst, 2, 0)
    assert set(kwargs) == {"past_values"} and kwargs["past_values"].shape == (2, 64, 3)
    assert initlint.audit(patchtst, batch_size=2).error is None


def test_the_time_series_transformers_get_their_lags_time_features_and_future():
    # they got a series as wide as their first Linear, and their forward refused it: "missing 2 required
    # positional arguments: 'past_time_features' and 'past_observed_mask'"
    torch.manual_seed(0)
    config = tf.TimeSeriesTransformerConfig(prediction_length=8, context_length=16, lags_sequence=[1, 2, 7],
                                            num_time_features=2, num_static_categorical_features=1, cardinality=[5],
                                            embedding_dimension=[3], num_static_real_features=2, d_model=16,
                                            encoder_layers=1, decoder_layers=1)
    model = tf.TimeSeriesTransformerForPrediction(config)
    _, kwargs = infer_inputs(model, 2, 0)
    assert {n: tuple(v.shape) for n, v in kwargs.items()} == {
        "past_values": (2, 23), "past_time_features": (2, 23, 2), "past_observed_mask": (2, 23),
        "future_values": (2, 8), "future_time_features": (2, 8, 2), "static_categorical_features": (2, 1),
        "static_real_features": (2, 2)}
    assert int(kwargs["static_categorical_features"].max()) < 5
    assert initlint.audit(model, batch_size=2).error is None
    for name in ("Informer", "Autoformer"):
        model = getattr(tf, f"{name}Model")(getattr(tf, f"{name}Config")(prediction_length=8, context_length=16,
                                                                          input_size=3, d_model=16))
        _, kwargs = infer_inputs(model, 2, 0)
        assert kwargs["past_values"].shape == (2, 23, 3) and kwargs["future_values"].shape == (2, 8, 3)
        assert initlint.audit(model, batch_size=2).error is None


def test_an_audio_codec_that_names_no_channels_gets_mono_audio():
    # DAC's config has a codebook but no audio_channels: it got (2, 4000), and its first conv refused it
    torch.manual_seed(0)
    model = tf.DacModel(tf.DacConfig(encoder_hidden_size=8, decoder_hidden_size=32, hidden_size=32, n_codebooks=2))
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"input_values"} and kwargs["input_values"].shape == (2, 1, 4000)
    assert initlint.audit(model, batch_size=2).error is None


def test_a_decision_transformer_gets_a_trajectory():
    # its main input is `states`; nothing was inferred, and a (2, 32) int64 tensor went into its state embedding
    torch.manual_seed(0)
    model = tf.DecisionTransformerModel(tf.DecisionTransformerConfig(state_dim=11, act_dim=3, hidden_size=32, n_layer=1,
                                                                     n_head=2, max_ep_len=1000))
    _, kwargs = infer_inputs(model, 2, 0)
    assert {n: tuple(v.shape) for n, v in kwargs.items()} == {
        "states": (2, 20, 11), "actions": (2, 20, 3), "rewards": (2, 20, 1), "returns_to_go": (2, 20, 1),
        "timesteps": (2, 20), "attention_mask": (2, 20)}
    assert float(kwargs["actions"].abs().max()) <= 1 and int(kwargs["timesteps"].max()) < 1000
    assert (kwargs["timesteps"].diff(dim=1) == 1).all()
    report = initlint.audit(model, batch_size=2)
    assert report.error is None
    # GPT-2's token table is never used: the trajectory comes in as embeddings (true, and only information)
    assert {(f.code, f.severity, f.module) for f in report.findings} == {("IL016", "info", "encoder.wte")}


def test_clap_gets_its_spectrogram_with_a_channel_axis():
    # it got (2, 64, 64), and its audio encoder asked for a fourth axis: "Dimension out of range"
    torch.manual_seed(0)
    config = tf.ClapConfig(
        text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100),
        audio_config=dict(patch_embeds_hidden_size=16, depths=[1, 1], num_attention_heads=[2, 2], hidden_size=32,
                          spec_size=64, window_size=4),
        projection_dim=16)
    model = tf.ClapModel(config)
    _, kwargs = infer_inputs(model, 2, 0)
    # 1 channel x frames x 64 mel bins; a 64 x 64 spectrogram image holds 64 frames of 64 bins
    assert kwargs["input_features"].shape == (2, 1, 64, 64) and kwargs["input_ids"].shape == (2, 16)
    assert initlint.audit(model, batch_size=2).error is None
    # the default config's image holds the feature extractor's 1001 frames
    from initlint.inputs.hf import _feature_shape
    assert _feature_shape(tf.ClapAudioConfig()) == (1, 1001, 64)


def test_bros_gets_a_box_per_token():
    # "You have to specify bbox"
    torch.manual_seed(0)
    model = tf.BrosModel(tf.BrosConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                       vocab_size=100))
    _, kwargs = infer_inputs(model, 2, 0)
    boxes = kwargs["bbox"]
    assert boxes.shape == (2, 16, 4) and float(boxes.min()) >= 0 and float(boxes.max()) <= 1
    assert (boxes[..., 2] >= boxes[..., 0]).all() and (boxes[..., 3] >= boxes[..., 1]).all()
    assert initlint.audit(model, batch_size=2).error is None


def test_siglip2_gets_its_images_as_patches_with_their_grid():
    # a NaFlex vision tower takes flattened patches, their grid and a mask of real patches; it got
    # token ids only ("'NoneType' object has no attribute 'to'"), or, alone, nothing it could run
    torch.manual_seed(0)
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, num_patches=64)
    model = tf.Siglip2Model(tf.Siglip2Config(
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=100),
        vision_config=vision))
    _, kwargs = infer_inputs(model, 2, 0)
    assert kwargs["pixel_values"].shape == (2, 64, 3 * 16 * 16)
    assert kwargs["spatial_shapes"].tolist() == [[8, 8], [8, 8]]
    assert kwargs["pixel_attention_mask"].shape == (2, 64) and bool(kwargs["pixel_attention_mask"].all())
    assert kwargs["input_ids"].shape == (2, 16)
    assert_probed(model, 2)
    tower = tf.Siglip2VisionModel(tf.Siglip2VisionConfig(**vision))
    _, kwargs = infer_inputs(tower, 2, 0)
    assert set(kwargs) == {"pixel_values", "spatial_shapes", "pixel_attention_mask"}
    assert_probed(tower, 2)


def test_a_forward_that_needs_an_input_its_main_input_name_does_not_name_gets_it():
    # GraniteDocling's vision tower names input_ids as its main input and takes only pixel_values
    torch.manual_seed(0)
    model = tf.GraniteDoclingVisionModel(tf.GraniteDoclingVisionConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, image_size=64,
        patch_size=16))
    assert model.main_input_name == "input_ids"
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"pixel_values"} and kwargs["pixel_values"].shape == (2, 3, 64, 64)
    assert_probed(model, 2)


def test_instructblip_gets_the_instructions_tokens_for_its_qformer():
    # "missing 1 required positional argument: 'qformer_input_ids'"
    config = tf.InstructBlipConfig(
        vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=16),
        qformer_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                            vocab_size=50, encoder_hidden_size=64),
        text_config=dict(model_type="opt", hidden_size=64, ffn_dim=128, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=120, word_embed_proj_dim=64),
        num_query_tokens=4, image_token_id=119)
    torch.manual_seed(0)
    model = tf.InstructBlipModel(config)
    _, kwargs = infer_inputs(model, 2, 0)
    assert kwargs["qformer_input_ids"].shape == (2, 16) and int(kwargs["qformer_input_ids"].max()) < 50
    assert_probed(model, 2)


def needs(*names):
    """Skip where this transformers has not the named classes (4.x in the torch 2.4 tier); seed the build."""
    missing = [n for n in names if not hasattr(tf, n)]
    if missing:
        pytest.skip(f"transformers {tf.__version__} has no {', '.join(missing)}")
    torch.manual_seed(0)


AUDIO = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)


@pytest.mark.parametrize("build, probed", [
    # a waveform OmniASR's first convolution reads as is: batch x 1 x samples
    (lambda: tf.OmniASRAudioModel(tf.OmniASRAudioConfig(**AUDIO, conv_dim=[32, 32], conv_stride=[5, 2],
                                                         conv_kernel=[10, 3])), "input_values as (2, 1, 4000)"),
    # a Whisper-style convolution stem: mel bins x frames
    (lambda: tf.GlmAsrEncoder(tf.GlmAsrEncoderConfig(**AUDIO, num_mel_bins=16)), "input_features as (2, 16, 64)"),
    # a front end that stacks 4 frames of 8 mel bins: its first Linear reads 32 values a frame
    (lambda: tf.GraniteSpeech5Encoder(tf.GraniteSpeech5EncoderConfig(**AUDIO, num_mel_bins=8)),
     "input_features as (2, 64, 32)"),
])
def test_an_audio_model_that_refuses_its_inferred_layout_is_probed_with_the_one_it_takes(build, probed):
    needs("OmniASRAudioConfig", "GlmAsrEncoderConfig", "GraniteSpeech5EncoderConfig")
    model = build()
    report = assert_probed(model, 2)
    refused = [n for n in report.notes if n.startswith("the model's forward refused the inferred inputs")]
    assert len(refused) == 1 and refused[0].endswith(f"probed with {probed}"), report.notes
    assert not any("fx-traced graph failed" in n for n in report.notes)  # the refused layout's attempts leave no note


def test_a_model_that_refuses_every_layout_gets_the_first_refusal():
    # a Whisper stem whose convolution reads 16 bins, on 8-bin spectrograms: neither layout runs
    needs("GlmAsrEncoderConfig")
    model = tf.GlmAsrEncoder(tf.GlmAsrEncoderConfig(**AUDIO, num_mel_bins=16))
    model.config.num_mel_bins = 8
    with pytest.raises(LoadError, match=r"on the probe input input_features=\(2, 64, 8\); pass matching"):
        initlint.audit(model, batch_size=2)


@pytest.mark.parametrize("name, build, shapes", [
    # Wav2Vec2-BERT: "missing 1 required positional argument: 'input_features'"; no config key sizes them, its
    # first layer (a Linear) reads feature_projection_input_dim
    ("Wav2Vec2BertConfig",
     lambda: tf.Wav2Vec2BertModel(tf.Wav2Vec2BertConfig(**AUDIO, feature_projection_input_dim=24)),
     {"input_features": (2, 64, 24)}),
    # Qwen3-ASR: "expects `padded_feature_length` to be a multiple of `n_window * 2` (100), but got 128"
    ("Qwen3ASREncoderConfig",
     lambda: tf.Qwen3ASREncoder(tf.Qwen3ASREncoderConfig(d_model=32, encoder_layers=1, encoder_attention_heads=2,
                                                         encoder_ffn_dim=64, downsample_hidden_size=16,
                                                         output_dim=32)),
     {"input_features": (2, 128, 100), "input_features_mask": (2, 100)}),
    # Audio Flamingo 3's encoder: "'NoneType' object has no attribute 'sum'" without its optional frame mask
    ("AudioFlamingo3EncoderConfig",
     lambda: tf.AudioFlamingo3Encoder(tf.AudioFlamingo3EncoderConfig(
         d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=16,
         max_source_positions=20)),
     {"input_features": (2, 16, 40), "input_features_mask": (2, 40)}),
])
def test_a_spectrogram_is_shaped_as_its_model_reads_it(name, build, shapes):
    needs(name)
    model = build()
    _, kwargs = infer_inputs(model, 2, 0)
    assert {k: tuple(v.shape) for k, v in kwargs.items()} == shapes
    assert all(bool(kwargs[k].all()) for k in shapes if k.endswith("_mask"))  # every frame real
    assert_probed(model, 2)


def test_gemma4s_vision_tower_gets_patches_and_their_positions():
    # "Gemma4VisionModel.forward() missing 1 required positional argument: 'pixel_position_ids'"
    needs("Gemma4VisionConfig")
    model = tf.Gemma4VisionModel(tf.Gemma4VisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                                       num_attention_heads=2, num_key_value_heads=2, head_dim=32))
    _, kwargs = infer_inputs(model, 2, 0)
    assert kwargs["pixel_values"].shape == (2, 144, 3 * 16 * 16)  # 12 x 12 patches: 4 pooling kernels of 3 a side
    positions = kwargs["pixel_position_ids"]
    assert positions.shape == (2, 144, 2) and positions[0, 13].tolist() == [1, 1] and int(positions.max()) == 11
    assert_probed(model, 2)


def test_mllama_gets_its_image_as_tiles_with_their_aspect_ratio():
    # "`aspect_ratio_ids` must be provided if `pixel_values` is provided"
    needs("MllamaModel")
    config = tf.MllamaConfig(
        vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_global_layers=1,
                           attention_heads=2, image_size=56, patch_size=14, vision_output_dim=128,
                           intermediate_layers_indices=[0]),
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=300, cross_attention_layers=[1], pad_token_id=0,
                         bos_token_id=1, eos_token_id=2), image_token_index=299)
    model = tf.MllamaModel(config)
    _, kwargs = infer_inputs(model, 2, 0)
    assert kwargs["pixel_values"].shape == (2, 1, 4, 3, 56, 56)  # one image of 4 tiles, the first one real
    assert bool(kwargs["pixel_values"][:, 0, 1:].eq(0).all()) and kwargs["aspect_ratio_ids"].tolist() == [[1], [1]]
    assert kwargs["aspect_ratio_mask"].tolist() == [[[1, 0, 0, 0]]] * 2
    assert kwargs["cross_attention_mask"].shape == (2, 16, 1, 4)
    assert_probed(model, 2)


def test_kosmos2_gets_places_for_its_image_embeddings_before_the_text():
    # "'NoneType' object has no attribute 'to'": Kosmos-2 writes its latent_query_num image embeddings at the
    # positions image_embeds_position_mask marks
    needs("Kosmos2Model")
    config = tf.Kosmos2Config(text_config=dict(embed_dim=64, ffn_dim=128, layers=1, attention_heads=2, vocab_size=300),
                              vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                                 num_attention_heads=2, image_size=56, patch_size=14),
                              latent_query_num=8)
    model = tf.Kosmos2Model(config)
    _, kwargs = infer_inputs(model, 2, 0)
    assert kwargs["input_ids"].shape == (2, 8 + 2 + 16) and int(kwargs["input_ids"].max()) < 300
    assert kwargs["image_embeds_position_mask"][0].tolist() == [0] + [1] * 8 + [0] * 17
    assert_probed(model, 2)


def test_pix2struct_gets_flattened_patches_with_their_rows_and_columns():
    # "You have to specify flattened_patches": each patch is its row, its column (from 1) and its values
    needs("Pix2StructForConditionalGeneration")
    config = tf.Pix2StructConfig(
        vision_config=dict(hidden_size=64, patch_embed_hidden_size=48, d_ff=128, d_kv=16, num_hidden_layers=1,
                           num_attention_heads=4, seq_len=64),
        text_config=dict(hidden_size=64, d_ff=128, d_kv=16, num_layers=1, num_heads=4, vocab_size=300))
    model = tf.Pix2StructForConditionalGeneration(config)
    _, kwargs = infer_inputs(model, 2, 0)
    patches = kwargs["flattened_patches"]
    assert patches.shape == (2, 64, 2 + 48)  # an 8 x 8 grid: the most that seq_len 64 holds
    assert patches[0, :9, :2].tolist() == [[1, c] for c in range(1, 9)] + [[2, 1]]
    assert_probed(model, 2)


def test_idefics_is_probed_with_an_axis_of_images_that_every_token_sees():
    # IdeficsModel flattens pixel_values (batch, images, channels, H, W) and reads image_attention_mask
    # (batch, tokens, images); the inferred (batch, channels, H, W) cannot unpack there
    needs("IdeficsConfig")
    config = tf.IdeficsConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, vision_config=dict(embed_dim=32, image_size=32, patch_size=8,
                                                                        num_hidden_layers=1, num_attention_heads=2,
                                                                        intermediate_size=64),
                              perceiver_config=dict(resampler_n_latents=4, resampler_depth=1, resampler_n_heads=2,
                                                    resampler_head_dim=8))
    report = assert_probed(tf.IdeficsModel(config), 2)
    refused = [n for n in report.notes if n.startswith("the model's forward refused the inferred inputs")]
    assert len(refused) == 1 and refused[0].endswith("probed with pixel_values as (2, 1, 3, 32, 32)"), report.notes


def test_an_audio_encoder_of_strided_patches_gets_a_waveform_of_whole_patches():
    # Muse Spark's audio encoder: one embedding per 16 * 6 * 5 * 4 = 1920 samples, and a forward that refuses others
    needs("MuseSparkAudioConfig")
    model = tf.MuseSparkAudioModel(tf.MuseSparkAudioConfig(hidden_sizes=[16, 32, 32, 32], depths=[1, 1, 1, 1],
                                                           out_hidden_size=32))
    _, kwargs = infer_inputs(model, 2, 0)
    assert kwargs["input_values"].shape == (2, 5760)
    report = assert_probed(model, 2)
    assert not report.notes


def test_depth_pro_gets_images_whose_smallest_scale_holds_one_patch():
    # "Image size 224x224 is too small to be scaled with scaled_images_ratios=(0.25, 0.5, 1) when patch_size=384"
    needs("DepthProConfig")
    sub = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=64, patch_size=16)
    model = tf.DepthProModel(tf.DepthProConfig(patch_size=64, fusion_hidden_size=32, image_model_config=sub,
                                               patch_model_config=sub, fov_model_config=sub))
    _, kwargs = infer_inputs(model, 2, 0)
    assert kwargs["pixel_values"].shape == (2, 3, 256, 256)  # 64 / 0.25


def test_a_vision_tower_naming_its_temporal_patch_and_merge_otherwise_gets_whole_patches():
    # Muse Glimmer's vision config: patch_temporal 2 and merge_size 2 (Qwen2-VL's temporal_patch_size,
    # spatial_merge_size): patches of 3 x 2 x 14 x 14 = 1176 values, images of 4 x 4 patches
    needs("MuseGlimmerVisionConfig")
    layers = ["window_attention", "full_attention"]
    model = tf.MuseGlimmerVisionModel(tf.MuseGlimmerVisionConfig(hidden_size=64, intermediate_size=128,
                                                                 num_hidden_layers=2, num_attention_heads=4,
                                                                 layer_types=layers))
    _, kwargs = infer_inputs(model, 2, 0)
    assert kwargs["pixel_values"].shape == (32, 1176) and kwargs["grid_thw"].tolist() == [[1, 4, 4]] * 2
    assert_probed(model, 2)


def test_a_vision_tower_whose_stem_reads_each_patch_as_an_image_gets_them_so():
    # Kimi K2.5's vision tower: a Conv2d patch embedding over (patches, channels, 14, 14)
    needs("Kimi_K25VisionConfig")
    model = tf.Kimi_K25VisionModel(tf.Kimi_K25VisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                           num_attention_heads=4))
    report = assert_probed(model, 2)
    refused = [n for n in report.notes if n.startswith("the model's forward refused the inferred inputs")]
    assert len(refused) == 1 and refused[0].endswith("probed with pixel_values as (8, 3, 14, 14)"), report.notes


def test_an_audio_model_whose_encoder_config_is_a_sub_config_of_another_name_gets_its_spectrogram():
    # Nemotron 3.5 Transcribe's audio model sizes its spectrogram in asr_config: "The size of tensor a (1024) must
    # match the size of tensor b (64)" on 1024-wide features (its first Linear reads 8 stacked frames)
    needs("Nemotron3_5TranscribeAudioConfig")
    audio = dict(AUDIO, num_key_value_heads=2, num_mel_bins=16, subsampling_factor=8)
    model = tf.Nemotron3_5TranscribeAudioModel(tf.Nemotron3_5TranscribeAudioConfig(
        asr_config=audio, diarization_config=dict(audio_config=audio, head_config=dict(
            hidden_size=32, audio_hidden_size=32, subsampling_factor=8))))
    _, kwargs = infer_inputs(model, 2, 0)
    assert {k: tuple(v.shape) for k, v in kwargs.items()} == {"input_features": (2, 64, 16),
                                                               "input_features_mask": (2, 64)}
    assert_probed(model, 2)


def test_a_model_fed_another_models_states_gets_them_at_its_width():
    # Nemotron 3.5 Transcribe's word timestamp model: "missing 1 required positional argument: 'inputs_embeds'"
    needs("Nemotron3_5TranscribeWordTimestampConfig")
    model = tf.Nemotron3_5TranscribeWordTimestampModel(tf.Nemotron3_5TranscribeWordTimestampConfig(
        **AUDIO, num_key_value_heads=2))
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"inputs_embeds"} and kwargs["inputs_embeds"].shape == (2, 16, 32)
    assert_probed(model, 2)


def test_a_forward_that_names_its_input_otherwise_gets_it_under_that_name():
    # VibeVoice's acoustic tokenizer inherits main_input_name input_values; its encoder and decoder take
    # hidden_states: "missing 1 required positional argument: 'hidden_states'"
    needs("VibeVoiceAcousticTokenizerEncoderConfig", "VibeVoiceAcousticTokenizerDecoderConfig")
    sizes = dict(hidden_size=16, num_filters=8, depths=[1, 1, 1], downsampling_ratios=[4, 5])
    encoder = tf.VibeVoiceAcousticTokenizerEncoderModel(tf.VibeVoiceAcousticTokenizerEncoderConfig(**sizes))
    _, kwargs = infer_inputs(encoder, 2, 0)
    assert set(kwargs) == {"hidden_states"} and kwargs["hidden_states"].shape == (2, 1, 4000)  # mono, 200 hops of 20
    assert_probed(encoder, 2)
    decoder = tf.VibeVoiceAcousticTokenizerDecoderModel(tf.VibeVoiceAcousticTokenizerDecoderConfig(**sizes))
    args, kwargs = infer_inputs(decoder, 2, 0)
    assert not kwargs and [tuple(a.shape) for a in args] == [(2, 16, 32)]  # latents, as its first convolution reads
    assert_probed(decoder, 2)


@pytest.mark.parametrize("name, build", [
    # Voxtral's default audio_token_id is None: "'bool' object has no attribute 'sum'"
    ("VoxtralConfig", lambda: tf.VoxtralModel(tf.VoxtralConfig(
        audio_config=dict(AUDIO, num_mel_bins=16, max_source_positions=20, num_key_value_heads=2),
        text_config=dict(AUDIO, num_key_value_heads=2, head_dim=16, vocab_size=120)))),
])
def test_a_speech_llm_that_cannot_place_its_audio_runs_on_the_text(name, build):
    needs(name)
    model = build()
    _, kwargs = infer_inputs(model, 2, 0)
    assert set(kwargs) == {"input_ids"}
    assert_probed(model, 2)


def test_an_audio_encoder_naming_its_spectrogram_and_mask_otherwise_gets_them():
    # Gemma 3n's audio encoder: "missing 2 required positional arguments: 'audio_mel' and 'audio_mel_mask'"; its
    # boolean mask marks padding with True (its conformer reads ~audio_mel_mask as the valid frames)
    needs("Gemma3nAudioEncoder")
    model = tf.Gemma3nAudioEncoder(tf.Gemma3nAudioConfig(hidden_size=32, conf_num_hidden_layers=1,
                                                         conf_num_attention_heads=2, input_feat_size=16,
                                                         sscp_conv_channel_size=(8, 8)))
    _, kwargs = infer_inputs(model, 2, 0)
    assert {k: tuple(v.shape) for k, v in kwargs.items()} == {"audio_mel": (2, 64, 16), "audio_mel_mask": (2, 64)}
    assert kwargs["audio_mel_mask"].dtype == torch.bool and not kwargs["audio_mel_mask"].any()
    assert_probed(model, 2)


def test_a_speech_llm_that_expands_one_audio_token_itself_gets_one_and_an_attention_mask():
    # Qwen2-Audio has no get_audio_features; without an audio token its legacy merge reads attention_mask:
    # "'NoneType' object is not subscriptable"
    needs("Qwen2AudioConfig")
    model = tf.Qwen2AudioModel(tf.Qwen2AudioConfig(
        audio_config=dict(d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=16,
                          max_source_positions=20),
        text_config=dict(AUDIO, num_key_value_heads=2, vocab_size=120), audio_token_index=100))
    _, kwargs = infer_inputs(model, 2, 0)
    assert (kwargs["input_ids"] == 100).sum(dim=1).tolist() == [1, 1]
    assert kwargs["attention_mask"].shape == kwargs["input_ids"].shape and bool(kwargs["attention_mask"].all())
    assert_probed(model, 2)


def test_a_model_of_text_and_audio_codes_gets_a_column_for_each():
    # Kyutai's speech-to-text: ids of (batch, steps, 1 + num_codebooks); "The size of tensor a (16) must match the
    # size of tensor b (33)" on plain (batch, steps) ids
    needs("KyutaiSpeechToTextConfig")
    model = tf.KyutaiSpeechToTextModel(tf.KyutaiSpeechToTextConfig(
        **AUDIO, num_key_value_heads=2, head_dim=16, vocab_size=100, codebook_vocab_size=20, num_codebooks=3,
        audio_pad_token_id=160, audio_bos_token_id=19, pad_token_id=3))
    _, kwargs = infer_inputs(model, 2, 0)
    ids = kwargs["input_ids"]
    assert ids.shape == (2, 16, 4) and int(ids[..., 0].max()) < 100 and int(ids[..., 1:].max()) < 20
    assert_probed(model, 2)


def test_a_codec_joining_waveform_and_spectrogram_frames_gets_them_aligned():
    # XCodec2: a waveform of whole hops (2 x 5 samples) for each of its features' 64 frames, and the mask over
    # those frames: "The size of tensor a (160) must match the size of tensor b (64)"
    needs("Xcodec2Config")
    model = tf.Xcodec2Model(tf.Xcodec2Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=16, head_dim=2,
        encoder_hidden_size=4, downsampling_ratios=[2, 5], quantization_dim=64,
        semantic_model_config=dict(model_type="wav2vec2-bert", **AUDIO, output_hidden_size=32)))
    _, kwargs = infer_inputs(model, 2, 0)
    assert {k: tuple(v.shape) for k, v in kwargs.items()} == {
        "input_values": (2, 640), "input_features": (2, 64, 160), "input_features_mask": (2, 64)}
    assert_probed(model, 2)


def test_a_model_adding_audio_to_text_token_by_token_gets_frames_for_each_token():
    # Voxtral Realtime adds 8 frames' embedding to each token's: "The size of tensor a (128) must match the size
    # of tensor b (64)"
    needs("VoxtralRealtimeConfig")
    model = tf.VoxtralRealtimeModel(tf.VoxtralRealtimeConfig(
        audio_config=dict(AUDIO, num_mel_bins=16, num_key_value_heads=2, head_dim=16),
        text_config=dict(AUDIO, num_key_value_heads=2, head_dim=16, vocab_size=120)))
    _, kwargs = infer_inputs(model, 2, 0)
    assert {k: tuple(v.shape) for k, v in kwargs.items()} == {"input_ids": (2, 16), "input_features": (2, 16, 128)}
    assert_probed(model, 2)


def test_a_speech_model_without_prenets_gets_hidden_states():
    # SpeechT5Model's default encoder and decoder have no pre-nets: "Given normalized_shape=[32], expected input
    # with shape [*, 32], but got input of size[2, 4000]"
    needs("SpeechT5Config")
    model = tf.SpeechT5Model(tf.SpeechT5Config(hidden_size=32, encoder_layers=1, decoder_layers=1,
                                               encoder_attention_heads=2, decoder_attention_heads=2,
                                               encoder_ffn_dim=64, decoder_ffn_dim=64))
    _, kwargs = infer_inputs(model, 2, 0)
    assert {k: tuple(v.shape) for k, v in kwargs.items()} == {"input_values": (2, 16, 32),
                                                               "decoder_input_values": (2, 16, 32)}
    assert_probed(model, 2)


def test_sam2_gets_images_of_the_size_its_vision_towers_backbone_names():
    # SAM 2's image size lives in its vision config's backbone config: "shape '[2, -1, 256, 256]' is invalid" at 224
    needs("Sam2Config")
    backbone = dict(model_type="sam2_hiera_det_model", hidden_size=8, embed_dim_per_stage=[8, 16, 32, 64],
                    num_attention_heads_per_stage=[1, 1, 1, 1], blocks_per_stage=[1, 1, 2, 1], image_size=[128, 128],
                    global_attention_blocks=[3], window_size_per_stage=[4, 2, 2, 1])
    model = tf.Sam2Model(tf.Sam2Config(
        vision_config=dict(backbone_config=backbone, backbone_channel_list=[64, 32, 16, 8], fpn_hidden_size=32,
                           backbone_feature_sizes=[[32, 32], [16, 16], [8, 8]]),
        prompt_encoder_config=dict(hidden_size=32, image_size=128), mask_decoder_config=dict(hidden_size=32)))
    _, kwargs = infer_inputs(model, 2, 0)
    assert {k: tuple(v.shape) for k, v in kwargs.items()} == {"pixel_values": (2, 3, 128, 128)}
    assert_probed(model, 2)


def test_a_windowed_backbone_gets_images_of_whole_windows():
    # RF-DETR's DINOv2 cuts its patch grid into num_windows a side: at 518 (37 patches of 14) "shape
    # '[2, 4, 9, 4, 9, -1]' is invalid"; here 70 (5 patches) -> 84, 2 windows of 3 patches
    needs("RfDetrConfig", "RfDetrDinov2Config")
    backbone = tf.RfDetrDinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=70,
                                     patch_size=14, num_windows=2, out_features=["stage1", "stage2"],
                                     window_block_indices=[0])
    model = tf.RfDetrModel(tf.RfDetrConfig(backbone_config=backbone, d_model=32, decoder_layers=1, decoder_ffn_dim=64,
                                           decoder_self_attention_heads=2, decoder_cross_attention_heads=2,
                                           num_queries=10, group_detr=1))
    _, kwargs = infer_inputs(model, 2, 0)
    assert kwargs["pixel_values"].shape == (2, 3, 84, 84)
    assert_probed(model, 2)


def test_a_vision_tower_of_packed_images_gets_them_in_one_row_with_their_grids():
    # MiniCPM-V's vision tower: "'NoneType' object has no attribute 'device'" without target_sizes
    needs("MiniCPMOcrVisionConfig")
    model = tf.MiniCPMOcrVisionModel(tf.MiniCPMOcrVisionConfig(hidden_size=32, intermediate_size=64,
                                                               num_hidden_layers=2, num_attention_heads=2,
                                                               patch_size=4, insert_layer_id=0))
    _, kwargs = infer_inputs(model, 2, 0)
    assert kwargs["pixel_values"].shape == (1, 3, 4, 2 * 8 * 8 * 4) and kwargs["target_sizes"].tolist() == [[8, 8]] * 2
    assert_probed(model, 2)


def test_a_vision_tower_counting_its_grid_in_merged_tokens_gets_each_tokens_pixels():
    # Inkling 2: "missing 1 required positional argument: 'image_grid_thw'"; it takes a channels-last image of
    # merge x merge patches per token
    needs("Inkling2VisionConfig")
    model = tf.Inkling2VisionModel(tf.Inkling2VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                           num_attention_heads=2, projection_hidden_dim=64,
                                                           text_hidden_size=32, patch_size=4, posemb_grid_size=8))
    report = assert_probed(model, 2)
    refused = [n for n in report.notes if n.startswith("the model's forward refused the inferred inputs")]
    assert len(refused) == 1 and refused[0].endswith("probed with pixel_values as (8, 8, 8, 3)"), report.notes


def test_a_video_model_padding_its_frames_to_a_maximum_size_gets_frames_of_that_size():
    # TVP pads its frames to max_img_size: without pixel_values "'NoneType' object has no attribute 'dtype'";
    # batch 1, as its 2-D position embeddings are viewed with the batch size (a batch of 2 fails in transformers)
    needs("TvpConfig")
    model = tf.TvpModel(tf.TvpConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                     vocab_size=100, num_frames=2, max_img_size=64, visual_prompt_size=8,
                                     backbone_config=dict(model_type="resnet", hidden_sizes=[8, 8, 8, 8],
                                                          depths=[1, 1, 1, 1], embedding_size=8,
                                                          out_features=["stage4"])))
    _, kwargs = infer_inputs(model, 1, 0)
    assert {k: tuple(v.shape) for k, v in kwargs.items()} == {"input_ids": (1, 16), "pixel_values": (1, 2, 3, 64, 64)}
    assert_probed(model, 1)


def test_udop_gets_a_box_per_token_on_its_page():
    # UDOP places each token on its image's patch grid by its box: "'NoneType' object is not subscriptable"
    needs("UdopConfig")
    model = tf.UdopModel(tf.UdopConfig(d_model=32, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2, d_kv=16,
                                       vocab_size=100, image_size=64, patch_size=16, max_2d_position_embeddings=64))
    _, kwargs = infer_inputs(model, 2, 0)
    assert kwargs["bbox"].shape == (2, 16, 4) and 0 <= float(kwargs["bbox"].min()) and float(kwargs["bbox"].max()) <= 1
    assert_probed(model, 2)
