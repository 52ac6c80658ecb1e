"""Published architectures at their real widths and vocabularies, built offline from configs.

Each entry of :data:`ZOO` builds a model at its default init together with a short probe
batch (batch 2 x 16 tokens, small images, one second of audio), and names a corruption of
one layer and the ``(code, module)`` finding that corruption must produce. Depth is cut
where it does not matter to the rules; width and vocabulary never are. GPT-2 keeps its 12
layers and one Llama-style model its 32, because depth matters to the drift rules.

Nothing is downloaded: every model comes from a config (``transformers.XConfig(...)``,
diffusers' and x-transformers' constructors, torch's own modules).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 2
TOKENS = 16


def _quiet() -> Any:
    pytest.importorskip("transformers")
    import transformers as tf

    tf.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return tf


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def ids(vocab: int, length: int = TOKENS) -> torch.Tensor:
    """Token ids, ``(BATCH, length)``."""
    return torch.randint(0, vocab, (BATCH, length), generator=_gen())


def image(channels: int = 3, size: int = 224) -> torch.Tensor:
    return torch.randn(BATCH, channels, size, size, generator=_gen())


def per_example(*values: int) -> torch.Tensor:
    """One value per example of the batch: ``values`` repeated to ``BATCH`` entries."""
    return torch.tensor([values[i % len(values)] for i in range(BATCH)])


Built = Tuple[nn.Module, Any]
"""A model and its probe batch (``None``: initlint infers it, with ``batch_size=BATCH``)."""


# ----------------------------------------------------------------------------- decoder LMs
def gpt2() -> Built:
    """GPT-2 124M: 12 layers x 768, vocabulary 50257."""
    tf = _quiet()
    model = tf.GPT2LMHeadModel(tf.GPT2Config())
    return model, {"input_ids": ids(50257)}


def llama32() -> Built:
    """A Llama-style model at full depth: 32 layers x 1024, vocabulary 32000 (MLP 2816, as 8/3 x 1024
    rounded up to a multiple of 256)."""
    tf = _quiet()
    config = tf.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=32, num_attention_heads=16,
                            num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)
    return tf.LlamaForCausalLM(config), {"input_ids": ids(32000)}


def tinyllama() -> Built:
    """TinyLlama-1.1B's widths (2048, MLP 5632, 32 heads, 4 KV heads, vocabulary 32000), 2 of 22 layers."""
    tf = _quiet()
    config = tf.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=2, num_attention_heads=32,
                            num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
    return tf.LlamaForCausalLM(config), {"input_ids": ids(32000)}


def qwen3() -> Built:
    """Qwen3-0.6B's widths (1024, MLP 3072, 16 heads of 128, 8 KV heads, vocabulary 151936), 2 of 28 layers."""
    tf = _quiet()
    config = tf.Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=16,
                            num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                            max_position_embeddings=4096)
    return tf.Qwen3ForCausalLM(config), {"input_ids": ids(151936)}


def gemma3() -> Built:
    """Gemma 3 270M's text model (640, MLP 2048, 4 heads of 256, 1 KV head, vocabulary 262144), 4 of 18 layers."""
    tf = _quiet()
    config = tf.Gemma3TextConfig(hidden_size=640, intermediate_size=2048, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                                 sliding_window=512, max_position_embeddings=4096)
    return tf.Gemma3ForCausalLM(config), {"input_ids": ids(262144)}


def mixtral() -> Built:
    """A Mixtral-style sparse MoE at granite-3.0-1b-a400m's widths (1024, 32 experts of 512, top-8,
    vocabulary 49155), 2 of 24 layers."""
    tf = _quiet()
    config = tf.MixtralConfig(hidden_size=1024, intermediate_size=512, num_hidden_layers=2, num_attention_heads=16,
                              num_key_value_heads=8, num_local_experts=32, num_experts_per_tok=8, vocab_size=49155,
                              max_position_embeddings=4096)
    return tf.MixtralForCausalLM(config), {"input_ids": ids(49155)}


def opt() -> Built:
    """OPT-125m: 768 wide, vocabulary 50272, 2 of 12 layers."""
    tf = _quiet()
    config = tf.OPTConfig(hidden_size=768, ffn_dim=3072, num_hidden_layers=2, num_attention_heads=12,
                          vocab_size=50272, word_embed_proj_dim=768)
    return tf.OPTForCausalLM(config), {"input_ids": ids(50272)}


def pythia() -> Built:
    """Pythia-160m (GPT-NeoX): 768 wide, vocabulary 50304, 2 of 12 layers."""
    tf = _quiet()
    config = tf.GPTNeoXConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=12,
                              vocab_size=50304, rotary_pct=0.25)
    return tf.GPTNeoXForCausalLM(config), {"input_ids": ids(50304)}


def mamba() -> Built:
    """Mamba-130m: 768 wide, vocabulary 50280, 4 of 24 layers."""
    tf = _quiet()
    config = tf.MambaConfig(hidden_size=768, num_hidden_layers=4, vocab_size=50280, state_size=16, expand=2)
    return tf.MambaForCausalLM(config), {"input_ids": ids(50280)}


# ----------------------------------------------------------------------------- encoders
def bert() -> Built:
    """BERT-base for masked LM: 768 wide, vocabulary 30522, 2 of 12 layers."""
    tf = _quiet()
    model = tf.BertForMaskedLM(tf.BertConfig(num_hidden_layers=2))
    return model, {"input_ids": ids(30522)}


def roberta() -> Built:
    """RoBERTa-base for masked LM: 768 wide, vocabulary 50265, 2 of 12 layers."""
    tf = _quiet()
    config = tf.RobertaConfig(vocab_size=50265, max_position_embeddings=514, num_hidden_layers=2,
                              type_vocab_size=1, pad_token_id=1)
    return tf.RobertaForMaskedLM(config), {"input_ids": ids(50265) + 2}


def distilbert() -> Built:
    """DistilBERT-base for masked LM: 768 wide, vocabulary 30522, all 6 layers."""
    tf = _quiet()
    return tf.DistilBertForMaskedLM(tf.DistilBertConfig()), {"input_ids": ids(30522)}


def albert() -> Built:
    """ALBERT-base for masked LM: embedding 128, 768 wide, vocabulary 30000, all 12 layers sharing one set of
    weights."""
    tf = _quiet()
    config = tf.AlbertConfig(embedding_size=128, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                             intermediate_size=3072, vocab_size=30000)
    return tf.AlbertForMaskedLM(config), {"input_ids": ids(30000)}


def clip() -> Built:
    """CLIP ViT-B/32: text 512 wide over a 49408 vocabulary, vision 768 wide on 224x224 images, 2 of 12 layers
    each."""
    tf = _quiet()
    config = tf.CLIPConfig(text_config={"num_hidden_layers": 2}, vision_config={"num_hidden_layers": 2,
                                                                                "patch_size": 32})
    return tf.CLIPModel(config), {"input_ids": ids(49408), "pixel_values": image()}


# ----------------------------------------------------------------------------- encoder-decoders
def t5() -> Built:
    """T5-small: 512 wide, vocabulary 32128, 2 of 6 layers each side; inputs inferred from the config."""
    tf = _quiet()
    config = tf.T5Config(d_model=512, d_ff=2048, num_layers=2, num_decoder_layers=2, num_heads=8, d_kv=64,
                         vocab_size=32128)
    return tf.T5ForConditionalGeneration(config), None


def bart() -> Built:
    """BART-base: 768 wide, vocabulary 50265, 2 of 6 layers each side; inputs inferred from the config."""
    tf = _quiet()
    config = tf.BartConfig(vocab_size=50265, d_model=768, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
                           decoder_ffn_dim=3072)
    return tf.BartForConditionalGeneration(config), None


def whisper() -> Built:
    """Whisper-tiny: 384 wide, vocabulary 51865, 80 mel bins over 30 s (3000 frames), 2 of 4 layers each side;
    inputs inferred from the config."""
    tf = _quiet()
    config = tf.WhisperConfig(vocab_size=51865, d_model=384, encoder_layers=2, decoder_layers=2,
                              encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536,
                              decoder_ffn_dim=1536, num_mel_bins=80, max_source_positions=1500)
    return tf.WhisperForConditionalGeneration(config), None


# ----------------------------------------------------------------------------- vision and audio
def vit() -> Built:
    """ViT-B/16 classifier: 768 wide, 224x224 images, 1000 classes, 2 of 12 layers."""
    tf = _quiet()
    config = tf.ViTConfig(num_hidden_layers=2, num_labels=1000)
    return tf.ViTForImageClassification(config), {"pixel_values": image()}


def swin() -> Built:
    """Swin-T classifier: embedding 96, 224x224 images, 1000 classes, one block per stage (of 2, 2, 6, 2)."""
    tf = _quiet()
    config = tf.SwinConfig(embed_dim=96, depths=[1, 1, 1, 1], num_heads=[3, 6, 12, 24], window_size=7,
                           num_labels=1000)
    return tf.SwinForImageClassification(config), {"pixel_values": image()}


def convnext() -> Built:
    """ConvNeXt-T classifier: widths 96..768, LayerScale 1e-6, 1000 classes, 2 blocks per stage, 64x64 images."""
    tf = _quiet()
    config = tf.ConvNextConfig(depths=[2, 2, 2, 2], hidden_sizes=[96, 192, 384, 768], num_labels=1000)
    return tf.ConvNextForImageClassification(config), {"pixel_values": image(size=64)}


def dinov2() -> Built:
    """DINOv2 ViT-B/14: 768 wide, LayerScale 1.0, 2 of 12 layers, 112x112 images."""
    tf = _quiet()
    config = tf.Dinov2Config(num_hidden_layers=2, image_size=518, patch_size=14)
    return tf.Dinov2Model(config), {"pixel_values": image(size=112)}


def resnet50() -> Built:
    """ResNet-50 classifier: widths 256..2048, 1000 classes, one bottleneck per stage (of 3, 4, 6, 3), 64x64 images."""
    tf = _quiet()
    config = tf.ResNetConfig(depths=[1, 1, 1, 1], num_labels=1000)
    return tf.ResNetForImageClassification(config), {"pixel_values": image(size=64)}


def wav2vec2() -> Built:
    """Wav2Vec2-base for CTC: 768 wide, 7-layer conv feature encoder at 512 channels, 2 of 12 layers, 1 s of audio."""
    tf = _quiet()
    config = tf.Wav2Vec2Config(num_hidden_layers=2, vocab_size=32)
    return tf.Wav2Vec2ForCTC(config), {"input_values": torch.randn(BATCH, 16000, generator=_gen())}


# ----------------------------------------------------------------------------- diffusers
def ddpm_unet() -> Built:
    """google/ddpm-cifar10-32's UNet2DModel (channels 128, 256, 256, 256, attention at 16x16), 1 layer per block."""
    pytest.importorskip("diffusers")
    from diffusers import UNet2DModel

    model = UNet2DModel(sample_size=32, in_channels=3, out_channels=3, layers_per_block=1,
                        block_out_channels=(128, 256, 256, 256),
                        down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
                        up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"))
    return model, {"sample": image(size=32), "timestep": per_example(10, 500)}


def sd_vae() -> Built:
    """Stable Diffusion's AutoencoderKL (channels 128, 256, 512, 512, 4 latent channels), 1 layer per block, 64x64."""
    pytest.importorskip("diffusers")
    from diffusers import AutoencoderKL

    blocks = 4
    model = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
                          block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * blocks,
                          up_block_types=("UpDecoderBlock2D",) * blocks, sample_size=512)
    return model, {"sample": image(size=64)}


def dit() -> Built:
    """DiT-XL/2's transformer (1152 wide, 16 heads of 72, patch 2, 4x32x32 latents, 1000 classes), 2 of 28 layers."""
    pytest.importorskip("diffusers")
    from diffusers import DiTTransformer2DModel

    model = DiTTransformer2DModel(num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8,
                                  num_layers=2, sample_size=32, patch_size=2, num_embeds_ada_norm=1000)
    return model, {"hidden_states": torch.randn(BATCH, 4, 32, 32, generator=_gen()),
                   "timestep": per_example(10, 500), "class_labels": per_example(1, 7)}


# ----------------------------------------------------------------------------- x-transformers and torch
def x_decoder() -> Built:
    """x-transformers TransformerWrapper + Decoder: 1024 wide, 16 heads, vocabulary 50257, 4 layers."""
    pytest.importorskip("x_transformers")
    from x_transformers import Decoder, TransformerWrapper

    model = TransformerWrapper(num_tokens=50257, max_seq_len=1024, attn_layers=Decoder(dim=1024, depth=4, heads=16))
    return model, ids(50257)


def torch_transformer() -> Built:
    """``nn.Transformer()``: the base model of "Attention is all you need" (512 wide, 6 + 6 layers)."""
    model = nn.Transformer(dropout=0.1, batch_first=True)
    src = torch.randn(BATCH, TOKENS, 512, generator=_gen())
    tgt = torch.randn(BATCH, TOKENS, 512, generator=torch.Generator().manual_seed(1))
    return model, (src, tgt)


class LSTMLanguageModel(nn.Module):
    """PyTorch's word-level language model example at its large size: embedding 1500, two LSTM layers of 1500,
    a decoder over WikiText-2's 33278 words, ``log_softmax`` output, uniform(-0.1, 0.1) init."""

    def __init__(self, vocab: int = 33278, width: int = 1500, layers: int = 2) -> None:
        super().__init__()
        self.encoder = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width, layers, batch_first=True)
        self.decoder = nn.Linear(width, vocab)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.encoder(tokens))
        return F.log_softmax(self.decoder(out), dim=-1)


def lstm_lm() -> Built:
    return LSTMLanguageModel(), ids(33278)


# ----------------------------------------------------------------------------- corruptions
@dataclass(frozen=True)
class Corruption:
    """A change to the weight of the module at ``path``: ``scale`` it, fill it with a ``constant``,
    or put one NaN in it (``nan``)."""

    kind: str
    path: str
    value: float = 0.0

    def __call__(self, model: nn.Module) -> None:
        weight = model.get_submodule(self.path).weight
        with torch.no_grad():
            if self.kind == "scale":
                weight.mul_(self.value)
            elif self.kind == "constant":
                weight.fill_(self.value)
            else:
                weight.view(-1)[0] = math.nan

    def __str__(self) -> str:
        what = {"scale": f"x{self.value:g}", "constant": f"constant {self.value:g}", "nan": "with one NaN"}
        return f"{self.path}.weight {what[self.kind]}"


def scale(path: str, factor: float) -> Corruption:
    return Corruption("scale", path, factor)


def constant(path: str, value: float = 0.02) -> Corruption:
    return Corruption("constant", path, value)


def nan_at(path: str) -> Corruption:
    return Corruption("nan", path)


@dataclass(frozen=True)
class Entry:
    """A published architecture, a corruption of one of its layers and the finding it must give."""

    build: Callable[[], Built]
    corrupt: Corruption
    expect: Tuple[str, str]
    """``(code, module)`` the corrupted twin must report."""


ZOO: Dict[str, Entry] = {
    "gpt2": Entry(gpt2, scale("transformer.h.11.mlp.c_fc", 1000.0), ("IL001", "transformer.h.11.mlp.c_fc")),
    "llama32": Entry(llama32, constant("model.layers.17.mlp.up_proj"), ("IL008", "model.layers.17.mlp.up_proj")),
    "tinyllama": Entry(tinyllama, scale("model.layers.1.mlp.gate_proj", 1000.0),
                       ("IL001", "model.layers.1.mlp.gate_proj")),
    "qwen3": Entry(qwen3, constant("model.layers.0.mlp.gate_proj"), ("IL008", "model.layers.0.mlp.gate_proj")),
    "gemma3": Entry(gemma3, scale("model.layers.2.mlp.gate_proj", 1000.0), ("IL001", "model.layers.2.mlp.gate_proj")),
    "mixtral": Entry(mixtral, constant("model.layers.1.self_attn.q_proj"), ("IL008", "model.layers.1.self_attn.q_proj")),
    "opt": Entry(opt, scale("model.decoder.layers.1.fc1", 1000.0), ("IL001", "model.decoder.layers.1.fc1")),
    "pythia": Entry(pythia, scale("gpt_neox.layers.0.mlp.dense_h_to_4h", 1000.0),
                    ("IL001", "gpt_neox.layers.0.mlp.dense_h_to_4h")),
    "mamba": Entry(mamba, constant("backbone.layers.1.mixer.in_proj"), ("IL008", "backbone.layers.1.mixer.in_proj")),
    "bert": Entry(bert, scale("bert.encoder.layer.1.intermediate.dense", 1000.0),
                  ("IL001", "bert.encoder.layer.1.intermediate.dense")),
    "roberta": Entry(roberta, constant("roberta.encoder.layer.0.attention.self.key"),
                     ("IL008", "roberta.encoder.layer.0.attention.self.key")),
    "distilbert": Entry(distilbert, scale("distilbert.transformer.layer.3.ffn.lin1", 1000.0),
                        ("IL001", "distilbert.transformer.layer.3.ffn.lin1")),
    "albert": Entry(albert, constant("albert.encoder.albert_layer_groups.0.albert_layers.0.ffn"),
                    ("IL008", "albert.encoder.albert_layer_groups.0.albert_layers.0.ffn")),
    "clip": Entry(clip, scale("vision_model.encoder.layers.1.mlp.fc1", 1000.0),
                  ("IL001", "vision_model.encoder.layers.1.mlp.fc1")),
    "t5": Entry(t5, scale("decoder.block.1.layer.2.DenseReluDense.wi", 1000.0),
                ("IL001", "decoder.block.1.layer.2.DenseReluDense.wi")),
    "bart": Entry(bart, scale("model.encoder.layers.0.fc1", 1000.0), ("IL001", "model.encoder.layers.0.fc1")),
    "whisper": Entry(whisper, constant("model.encoder.layers.1.fc1"), ("IL008", "model.encoder.layers.1.fc1")),
    "vit": Entry(vit, scale("vit.layers.0.mlp.fc1", 1000.0), ("IL001", "vit.layers.0.mlp.fc1")),
    "swin": Entry(swin, constant("swin.encoder.layers.2.blocks.0.mlp.fc1"),
                  ("IL008", "swin.encoder.layers.2.blocks.0.mlp.fc1")),
    "convnext": Entry(convnext, constant("convnext.encoder.stages.1.layers.0.pwconv1"),
                      ("IL008", "convnext.encoder.stages.1.layers.0.pwconv1")),
    "dinov2": Entry(dinov2, scale("encoder.layer.1.mlp.fc1", 1000.0), ("IL001", "encoder.layer.1.mlp.fc1")),
    "resnet50": Entry(resnet50, nan_at("resnet.encoder.stages.2.layers.0.layer.1.convolution"),
                      ("IL009", "resnet.encoder.stages.2.layers.0.layer.1.convolution")),
    "wav2vec2": Entry(wav2vec2, scale("wav2vec2.encoder.layers.0.feed_forward.intermediate_dense", 1000.0),
                      ("IL001", "wav2vec2.encoder.layers.0.feed_forward.intermediate_dense")),
    "ddpm_unet": Entry(ddpm_unet, constant("down_blocks.1.resnets.0.conv1"), ("IL008", "down_blocks.1.resnets.0.conv1")),
    "sd_vae": Entry(sd_vae, constant("encoder.down_blocks.2.resnets.0.conv1"),
                    ("IL008", "encoder.down_blocks.2.resnets.0.conv1")),
    "dit": Entry(dit, nan_at("transformer_blocks.1.attn1.to_v"), ("IL009", "transformer_blocks.1.attn1.to_v")),
    "x_decoder": Entry(x_decoder, constant("attn_layers.layers.1.1.ff.0.0"), ("IL008", "attn_layers.layers.1.1.ff.0.0")),
    "torch_transformer": Entry(torch_transformer, scale("encoder.layers.2.linear1", 1000.0),
                               ("IL001", "encoder.layers.2.linear1")),
    "lstm_lm": Entry(lstm_lm, nan_at("decoder"), ("IL009", "decoder")),
}


# ----------------------------------------------------------------------------- training-size batches
TRAINING_TOKENS = 512
"""Tokens per sequence of a training-size batch (one sequence: what a long-context run feeds per device)."""
LONG_TOKENS = 2048
"""The longer sequence, for the models whose positions allow it and whose depth keeps the probe small."""
TRAINING_IMAGES = 8
"""Images per training-size batch, at 224 x 224 (the published resolution of every image model here)."""


def _ids(vocab: int, batch: int, length: int, offset: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=_gen()) + offset


def _images(batch: int, size: int, channels: int = 3) -> torch.Tensor:
    return torch.randn(batch, channels, size, size, generator=_gen())


def training_batch(name: str, model: nn.Module, tokens: int = TRAINING_TOKENS) -> Any:
    """The probe batch a user's first training step would feed ``ZOO[name]``'s model: one sequence of
    ``tokens`` tokens (capped at what its positions allow), ``TRAINING_IMAGES`` images at 224 x 224,
    5 s of audio; DDPM's UNet and DiT at their own resolution, ``TRAINING_IMAGES`` examples; Stable
    Diffusion's autoencoder on one 256 x 256 crop (what it trains on)."""
    config = getattr(model, "config", None)
    positions = getattr(config, "max_position_embeddings", None) or tokens
    length = min(tokens, positions)
    vocab = getattr(config, "vocab_size", None)
    n = TRAINING_IMAGES
    if name in ("roberta",):
        return {"input_ids": _ids(vocab, 1, min(length, 512), offset=2)}
    if name in ("t5", "bart"):
        length = min(tokens, 1024 if name == "bart" else tokens)
        return {"input_ids": _ids(vocab, 1, length), "decoder_input_ids": _ids(vocab, 1, length)}
    if name == "whisper":
        return {"input_features": torch.randn(1, 80, 3000, generator=_gen()),
                "decoder_input_ids": _ids(vocab, 1, min(tokens, config.max_target_positions))}
    if name == "clip":
        text = config.text_config
        return {"input_ids": _ids(text.vocab_size, n, text.max_position_embeddings),
                "pixel_values": _images(n, 224)}
    if name in ("vit", "swin", "convnext", "dinov2", "resnet50"):
        return {"pixel_values": _images(n, 224)}
    if name == "wav2vec2":
        return {"input_values": torch.randn(1, 80000, generator=_gen())}
    if name == "ddpm_unet":
        return {"sample": _images(n, 32), "timestep": torch.randint(0, 1000, (n,), generator=_gen())}
    if name == "sd_vae":
        return {"sample": _images(1, 256)}
    if name == "dit":
        return {"hidden_states": torch.randn(n, 4, 32, 32, generator=_gen()),
                "timestep": torch.randint(0, 1000, (n,), generator=_gen()),
                "class_labels": torch.randint(0, 1000, (n,), generator=_gen())}
    if name == "x_decoder":
        return _ids(50257, 1, min(tokens, 1024))
    if name == "torch_transformer":
        return (torch.randn(1, tokens, 512, generator=_gen()),
                torch.randn(1, tokens, 512, generator=torch.Generator().manual_seed(1)))
    if name == "lstm_lm":
        return _ids(33278, 1, tokens)
    return {"input_ids": _ids(vocab, 1, length)}


# ----------------------------------------------------------------------------- published recipes
def _adamw(lr: float, betas: Tuple[float, float] = (0.9, 0.999), wd: float = 0.01, eps: float = 1e-8) -> Any:
    return lambda m: torch.optim.AdamW(m.parameters(), lr=lr, betas=betas, weight_decay=wd, eps=eps)


def _adam(lr: float, betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> Any:
    return lambda m: torch.optim.Adam(m.parameters(), lr=lr, betas=betas, eps=eps)


def _sgd(lr: float, momentum: float = 0.9, wd: float = 0.0) -> Any:
    return lambda m: torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum, weight_decay=wd)


def _adafactor(lr: float) -> Any:
    return lambda m: torch.optim.Adafactor(m.parameters(), lr=lr)


RECIPES: Dict[str, Tuple[str, Any]] = {
    "gpt2": ("GPT-2/nanoGPT: AdamW 6e-4, betas (0.9, 0.95), wd 0.1", _adamw(6e-4, (0.9, 0.95), 0.1)),
    "llama32": ("Llama: AdamW 3e-4, betas (0.9, 0.95), wd 0.1", _adamw(3e-4, (0.9, 0.95), 0.1)),
    "tinyllama": ("TinyLlama: AdamW 4e-4, betas (0.9, 0.95), wd 0.1", _adamw(4e-4, (0.9, 0.95), 0.1)),
    "qwen3": ("AdamW 3e-4, betas (0.9, 0.95), wd 0.1", _adamw(3e-4, (0.9, 0.95), 0.1)),
    "gemma3": ("AdamW 3e-4, betas (0.9, 0.95), wd 0.1", _adamw(3e-4, (0.9, 0.95), 0.1)),
    "mixtral": ("AdamW 3e-4, betas (0.9, 0.95), wd 0.1", _adamw(3e-4, (0.9, 0.95), 0.1)),
    "opt": ("OPT-125m: AdamW 6e-4, betas (0.9, 0.95), wd 0.1", _adamw(6e-4, (0.9, 0.95), 0.1)),
    "pythia": ("Pythia-160m: AdamW 6e-4, betas (0.9, 0.95), wd 0.01", _adamw(6e-4, (0.9, 0.95), 0.01)),
    "mamba": ("Mamba-130m: AdamW 3e-3 (GPT-3's recipe x5), betas (0.9, 0.95), wd 0.1", _adamw(3e-3, (0.9, 0.95), 0.1)),
    "bert": ("BERT: Adam 1e-4, wd 0.01", _adamw(1e-4, (0.9, 0.999), 0.01)),
    "roberta": ("RoBERTa-base: AdamW 6e-4, betas (0.9, 0.98), eps 1e-6, wd 0.01", _adamw(6e-4, (0.9, 0.98), 0.01, 1e-6)),
    "distilbert": ("DistilBERT: AdamW 5e-4, wd 0.01", _adamw(5e-4, (0.9, 0.98), 0.01, 1e-6)),
    "albert": ("ALBERT: LAMB 1.76e-3, here AdamW at the same lr", _adamw(1.76e-3, (0.9, 0.999), 0.01, 1e-6)),
    "clip": ("CLIP: AdamW 5e-4, betas (0.9, 0.98), eps 1e-6, wd 0.2", _adamw(5e-4, (0.9, 0.98), 0.2, 1e-6)),
    "t5": ("T5: Adafactor 1e-2", _adafactor(1e-2)),
    "bart": ("BART: AdamW 4e-4 (RoBERTa's large batch), betas (0.9, 0.98), eps 1e-6, wd 0.01",
             _adamw(4e-4, (0.9, 0.98), 0.01, 1e-6)),
    "whisper": ("Whisper-tiny: AdamW 1.5e-3, betas (0.9, 0.98), eps 1e-6, wd 0.1", _adamw(1.5e-3, (0.9, 0.98), 0.1, 1e-6)),
    "vit": ("ViT (DeiT): AdamW 1e-3, wd 0.05", _adamw(1e-3, (0.9, 0.999), 0.05)),
    "swin": ("Swin-T: AdamW 1e-3, wd 0.05", _adamw(1e-3, (0.9, 0.999), 0.05)),
    "convnext": ("ConvNeXt-T: AdamW 4e-3, wd 0.05", _adamw(4e-3, (0.9, 0.999), 0.05)),
    "dinov2": ("DINOv2 ViT-B/14: AdamW 1e-3, wd 0.04", _adamw(1e-3, (0.9, 0.999), 0.04)),
    "resnet50": ("ResNet-50 (He et al. 2016): SGD 0.1, momentum 0.9, wd 1e-4", _sgd(0.1, 0.9, 1e-4)),
    "wav2vec2": ("wav2vec 2.0 base: Adam 5e-4", _adam(5e-4, (0.9, 0.98), 1e-6)),
    "ddpm_unet": ("DDPM CIFAR-10: Adam 2e-4", _adam(2e-4)),
    "sd_vae": ("Stable Diffusion's autoencoder: Adam 4.5e-6 x its batch of 96 = 4.3e-4, betas (0.5, 0.9)",
               _adam(4.3e-4, (0.5, 0.9))),
    "dit": ("DiT: AdamW 1e-4, no weight decay", _adamw(1e-4, (0.9, 0.999), 0.0)),
    "x_decoder": ("AdamW 3e-4, betas (0.9, 0.95), wd 0.1", _adamw(3e-4, (0.9, 0.95), 0.1)),
    "torch_transformer": ("Attention is all you need: Adam, betas (0.9, 0.98), eps 1e-9, at its peak 7e-4",
                          _adam(7e-4, (0.9, 0.98), 1e-9)),
    "lstm_lm": ("PyTorch's word-level language model: SGD 20, no momentum, gradient norm clipped to 0.25",
                _sgd(20.0, 0.0)),
}
"""The optimizer each zoo model was published with, at its peak learning rate, for ``optimizer=``."""

CLIPPING: Dict[str, float] = {"gpt2": 1.0, "llama32": 1.0, "tinyllama": 1.0, "opt": 1.0, "pythia": 1.0,
                              "mamba": 1.0, "bert": 1.0, "whisper": 1.0, "swin": 5.0, "lstm_lm": 0.25}
"""The gradient-norm clipping of the recipes that publish one (``clip_grad_norm=``): nanoGPT's, Llama's, OPT's,
Pythia's, Mamba's, BERT's and Whisper's 1.0, Swin's 5.0, the LSTM example's 0.25."""


def audit(model: nn.Module, inputs: Any, **settings: Any) -> Any:
    """``initlint.audit`` as the zoo runs it: inferred probe batches are ``BATCH`` examples too."""
    import initlint

    return initlint.audit(model, inputs, batch_size=BATCH, **settings)


def build(name: str, seed: int = 0) -> Built:
    """The model of ``ZOO[name]`` at its default init (seeded) and its probe batch."""
    torch.manual_seed(seed)
    return ZOO[name].build()
