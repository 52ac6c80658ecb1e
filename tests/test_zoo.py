"""Real architectures built from configs at tiny sizes (no network, no weights).

Each one is audited without error with its default init and reports no warning, and the
graph rules demonstrably see its layers: a layer the test knows is corrupted and the
finding appears at exactly that module path.
"""
import logging

import pytest
import torch
import torch.nn as nn

import initlint

tf = pytest.importorskip("transformers")

tf.logging.set_verbosity_error()
logging.getLogger("transformers").setLevel(logging.ERROR)


def _ids(vocab, batch=4, length=16):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


def gpt2():
    return tf.GPT2Model(tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                      bos_token_id=0, eos_token_id=0)), None


def bert():
    return tf.BertModel(tf.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=128, vocab_size=128)), None


def vit():
    return tf.ViTModel(tf.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=128, image_size=32, patch_size=8)), None


def llama():
    return tf.LlamaModel(tf.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=128, vocab_size=128)), None


def t5():
    model = tf.T5Model(tf.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=128))
    return model, {"input_ids": _ids(128), "decoder_input_ids": _ids(128)}


def resnet():
    return tf.ResNetModel(tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                          layer_type="basic")), None


def wav2vec2():
    config = tf.Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                               conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                               num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    return tf.Wav2Vec2Model(config), None


class WithHead(nn.Module):
    """A torch building block followed by a Linear head (so IL001 has a layer to judge)."""

    def __init__(self, body, width):
        super().__init__()
        self.body = body
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        out = self.body(x, x, x)[0] if isinstance(self.body, nn.MultiheadAttention) else self.body(x)
        out = out[0] if isinstance(out, tuple) else out
        return self.head(out)


def encoder():
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2,
                                 enable_nested_tensor=False), None


def lstm():
    return nn.LSTM(16, 32, batch_first=True), None


def gru():
    return nn.GRU(16, 32, num_layers=2), None


def mha():
    return nn.MultiheadAttention(64, 4, batch_first=True), None


# name -> (builder, module whose weight is corrupted, rule that must then fire there)
ZOO = {
    "gpt2": (gpt2, "h.0.mlp.c_fc", "IL001"),
    "bert": (bert, "encoder.layer.0.intermediate.dense", "IL001"),
    "vit": (vit, "layers.1.mlp.fc1", "IL001"),
    "llama": (llama, "layers.0.mlp.gate_proj", "IL001"),
    "t5": (t5, "encoder.block.0.layer.1.DenseReluDense.wi", "IL001"),
    "resnet": (resnet, "embedder.embedder.convolution", "IL002"),
    "wav2vec2": (wav2vec2, "encoder.layers.0.feed_forward.intermediate_dense", "IL001"),
    "encoder": (encoder, "layers.0.linear1", "IL001"),
    "lstm": (lstm, None, None),
    "gru": (gru, None, None),
    "mha": (mha, None, None),
}


def build(name):
    torch.manual_seed(0)
    return ZOO[name][0]()


@pytest.mark.parametrize("name", list(ZOO))
def test_default_init_is_audited_and_clean(name):
    model, inputs = build(name)
    report = initlint.audit(model, inputs)
    assert report.error is None
    assert report.capture in ("fx", "runtime")
    assert report.clean, [(f.code, f.module, f.message) for f in report.findings]
    weight_ops = [op for op in report.graph if op.params]
    assert weight_ops, "the graph must contain the model's parameterised layers"


@pytest.mark.parametrize("name", [n for n, v in ZOO.items() if v[1]])
def test_graph_rules_see_a_known_layer(name):
    model, inputs = build(name)
    path, code = ZOO[name][1], ZOO[name][2]
    layer = model.get_submodule(path)
    if code == "IL002":
        conv = layer
        replacement = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                                bias=True)
        parent, _, attr = path.rpartition(".")
        setattr(model.get_submodule(parent), attr, replacement)
    else:
        with torch.no_grad():
            layer.weight.mul_(1e4)
    report = initlint.audit(model, inputs)
    assert (code, path) in report.codes(), [(f.code, f.module) for f in report.findings]


def test_transformers_models_need_the_runtime_capture_and_say_so():
    model, _ = build("gpt2")
    report = initlint.audit(model)
    assert report.capture == "runtime"
    linear_modules = {op.module for op in report.graph if op.kind == "linear"}
    assert {"h.0.attn.c_attn", "h.0.mlp.c_fc", "h.1.mlp.c_proj"} <= linear_modules
    # GPT-2's Conv1D keeps its weight as (in, out): the fan-in is read from the right axis
    c_fc = next(op for op in report.graph if op.module == "h.0.mlp.c_fc" and op.kind == "linear")
    assert c_fc.attrs["layout"] == "in_out"


@pytest.mark.parametrize("name", ["lstm", "gru", "mha"])
def test_recurrent_and_attention_blocks_are_captured_with_their_weights(name):
    model, _ = build(name)
    width = 32 if name in ("lstm", "gru") else 64
    wrapped = WithHead(model, width)
    report = initlint.audit(wrapped, torch.randn(4, 8, 16 if name != "mha" else 64))
    block = [op for op in report.graph if op.module == "body" and op.kind in ("rnn", "attention")]
    assert block and any(name.startswith("body.") for name in block[0].params.values())
    with torch.no_grad():
        wrapped.head.weight.mul_(1e4)
    assert ("IL001", "head") in initlint.audit(wrapped, torch.randn(4, 8, 16 if name != "mha" else 64)).codes()


def test_encoder_decoder_without_decoder_inputs_is_audited_from_its_config():
    model, _ = build("t5")
    report = initlint.audit(model)  # decoder_input_ids start with T5's pad token
    assert report.error is None and report.clean
    model.config.pad_token_id = None  # no start token left to build them from: a clear error
    with pytest.raises(initlint.LoadError, match="decoder_input_ids"):
        initlint.audit(model)


def test_logits_are_found_in_a_model_output_dataclass():
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                             bos_token_id=0, eos_token_id=0))
    report = initlint.audit(model, logits=True)
    assert report.probe.logits is not None and report.probe.logits["classes"] == 128
    assert report.clean
