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


def test_t5_starts_its_decoder_with_the_pad_token():
    torch.manual_seed(0)
    model = t5()
    assert getattr(model.config, "decoder_start_token_id", None) is None  # T5 starts from pad (0)
    _, kwargs = infer_inputs(model, 3, 0)
    assert set(kwargs) == {"input_ids", "decoder_input_ids"}
    assert kwargs["decoder_input_ids"].shape == (3, 16)
    assert (kwargs["decoder_input_ids"][:, 0] == model.config.pad_token_id).all()
    assert int(kwargs["decoder_input_ids"].max()) < 100
    report = initlint.audit(model, batch_size=3)
    assert report.error is None and report.probe.forward_ran and report.probe.backward_ran


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
