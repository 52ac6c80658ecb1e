"""IL014 init-not-applied on the failures it exists for, each built from code, and their intact twins.

Each case removes the line that applies a model's declared init (or undoes what it did); the rule
must name the modules and what was declared, and must stay silent on the same model built as its
authors wrote it.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import initlint
from declared_models import NanoGPT, TitanLlama, gpt2, ids, tiny_hf, titan_llama, undo_c_proj_scaling
from initlint.probe.declared import draw_of
from initlint.rules.il014_init_not_applied import InitNotApplied, judge
from model_state import deep_state


def il014(model: nn.Module, inputs, **options) -> dict:
    """Module -> its IL014 finding (a run of identical layers reported once: each member maps to it)."""
    report = initlint.audit(model, inputs, select=["IL014"], **options)
    assert report.error is None
    return {module: f for f in report.findings if f.code == "IL014" for module in f.members or [f.module]}


def test_hf_model_without_post_init_is_flagged_and_its_twin_is_clean():
    torch.manual_seed(0)
    found = il014(tiny_hf(post_init=False), {"input_ids": ids(256)})
    assert set(found) == {"embed", "blocks.0.up", "blocks.0.down", "blocks.1.up", "blocks.1.down", "head"}
    assert "TinyHF._init_weights declares std" in found["embed"].message and abs(found["embed"].threshold / 0.02 - 1) < 0.05
    assert "PyTorch's default for Embedding" in found["embed"].message
    assert found["head"].fix == "help: model.head.apply(model._init_weights)"
    torch.manual_seed(0)
    assert il014(tiny_hf(post_init=True), {"input_ids": ids(256)}) == {}


def test_module_replaced_after_post_init_is_flagged():
    torch.manual_seed(0)
    model = tiny_hf()
    model.head = nn.Linear(128, 256)  # added after post_init: PyTorch's default, not the declared init
    assert set(il014(model, {"input_ids": ids(256)})) == {"head"}


def test_deliberate_reinit_after_post_init_is_not_flagged():
    torch.manual_seed(0)
    model = tiny_hf()
    nn.init.orthogonal_(model.blocks[0].up.weight)
    nn.init.constant_(model.head.bias, 0.1)
    assert il014(model, {"input_ids": ids(256)}) == {}


def test_gpt2_without_its_c_proj_scaling_is_flagged_and_its_twin_is_clean():
    torch.manual_seed(0)
    model = gpt2()
    assert il014(model, {"input_ids": ids(1000)}) == {}
    undo_c_proj_scaling(model)
    found = il014(model, {"input_ids": ids(1000)})
    projections = {f"transformer.h.{i}.{part}.c_proj" for i in range(2) for part in ("attn", "mlp")}
    assert set(found) == projections
    attn = found["transformer.h.0.attn.c_proj"]
    assert "without the scaling GPT2Attention applies" in attn.message
    assert abs(attn.threshold / (0.02 / 2) - 1) < 0.05 and abs(attn.value / 0.02 - 1) < 0.05
    assert attn.fix == "help: model.transformer.h[0].attn.apply(model.transformer._init_weights)"


def test_nanogpt_without_apply_init_weights_is_flagged_and_its_twin_is_clean():
    torch.manual_seed(0)
    found = il014(NanoGPT(apply_init=False), ids(512))
    layers = [f"transformer.h.{i}" for i in range(4)]
    expected = {"transformer.wte", "transformer.wpe"} | {f"{h}.attn.c_attn" for h in layers} | \
        {f"{h}.attn.c_proj" for h in layers} | {f"{h}.mlp.c_fc" for h in layers} | {f"{h}.mlp.c_proj" for h in layers}
    assert set(found) == expected
    assert "NanoGPT._init_weights declares std" in found["transformer.wpe"].message
    assert abs(found["transformer.wpe"].threshold / 0.02 - 1) < 0.05 and abs(found["transformer.wpe"].value - 1) < 0.05
    # c_proj weights were rescaled to 0.00707 either way: only their default biases are flagged
    assert "bias (" in found["transformer.h.0.mlp.c_proj"].message
    assert "weight (" not in found["transformer.h.0.mlp.c_proj"].message
    torch.manual_seed(0)
    assert il014(NanoGPT(), ids(512)) == {}  # c_proj at 0.02/sqrt(2 n_layer) differs from _init_weights, on purpose


def test_titan_llama_to_empty_with_init_weights_is_clean():
    torch.manual_seed(0)
    assert il014(titan_llama(init=True), ids(1024)) == {}


def test_titan_llama_to_empty_holding_zeros_is_flagged():
    model = titan_llama(init=False)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # what fresh pages of to_empty() memory hold
    found = il014(model, ids(1024))
    fed = {f"layers.{i}.{m}" for i in range(4) for m in ("attention.wq", "attention.wk", "attention.wv",
                                                          "feed_forward.w1", "feed_forward.w3")}
    # wo, w2 and the output head end a residual branch or the model: zeros there are a deliberate pattern
    assert set(found) == {"tok_embeddings"} | fed
    assert "exactly zero" in found["tok_embeddings"].message
    assert "TitanLlama.init_weights() draws it at random" in found["layers.0.attention.wq"].message
    assert found["layers.0.attention.wq"].fix == "help: model.init_weights()"


def test_titan_llama_to_empty_holding_stale_memory_is_flagged():
    model = titan_llama(init=False)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():  # arbitrary bits, as reused memory holds: denormals, 1e38, NaN
            p.view(torch.int32).copy_(torch.randint(-2**31, 2**31 - 1, p.shape, generator=gen, dtype=torch.int32))
    found = il014(model, ids(1024))
    weights = {path for path, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))}
    assert weights <= set(found)
    assert "never initialised" in found["output"].message


def test_stale_memory_is_flagged_without_a_declared_init():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    with torch.no_grad():
        model[0].weight[0, :3] = torch.tensor([1e-40, 3e38, 2e-39])
    found = il014(model, torch.randn(4, 64))
    assert set(found) == {"0"}
    assert "2 denormal value(s) and values up to 3e+38" in found["0"].message
    assert found["0"].fix == "help: model[0].reset_parameters()"


def test_audit_changes_nothing_of_the_model_nor_the_random_state():
    torch.manual_seed(0)
    model = gpt2()
    undo_c_proj_scaling(model)
    inputs = {"input_ids": ids(1000)}
    before = deep_state(model, inputs)
    rng = torch.get_rng_state()
    assert il014(model, inputs)
    assert torch.equal(torch.get_rng_state(), rng)
    assert deep_state(model, inputs) == before
    assert not any(hasattr(p, "_is_hf_initialized") for p in model.parameters())


def test_one_block_at_a_time_gives_the_same_verdicts():
    torch.manual_seed(0)
    model = gpt2(layers=3)
    undo_c_proj_scaling(model)
    nn.init.normal_(model.transformer.wpe.weight)  # PyTorch's Embedding default
    whole = {(v.name, v.kind) for v in judge(model, 0.05)}
    blocks = {(v.name, v.kind) for v in judge(model, 0.05, budget=200_000)}
    assert blocks == whole and ("transformer.wpe.weight", "default") in whole


def test_a_split_module_whose_init_redraws_its_children_is_replayed_with_them():
    # Mamba2's _init_weights draws every Linear and Conv1d at N(0, 0.1), then, on the mixer (visited after its
    # children), redraws conv1d and out_proj with kaiming_uniform_: at hidden 4096 the mixer is larger than the
    # replay's budget, and judged apart its children were "still at PyTorch's default" against N(0, 0.1)
    tf = pytest.importorskip("transformers")
    config = tf.Mamba2Config(hidden_size=256, num_heads=8, head_dim=64, n_groups=1, state_size=16,
                             num_hidden_layers=1, vocab_size=100)
    torch.manual_seed(0)
    model = tf.Mamba2Model(config)
    mixer = model.layers[0].mixer
    budget = sum(p.numel() for p in mixer.parameters()) - 1  # the mixer is split, its children are not
    assert {(v.name, v.kind) for v in judge(model, 0.05, budget=budget)} == set()
    assert {(v.name, v.kind) for v in judge(model, 0.05)} == set()
    # its twin, with in_proj back at PyTorch's default (declared: N(0, 0.1)), is flagged either way
    mixer.in_proj.reset_parameters()
    flagged = {(v.name, v.kind) for v in judge(model, 0.05, budget=budget)}
    assert flagged == {(v.name, v.kind) for v in judge(model, 0.05)} == {("layers.0.mixer.in_proj.weight", "default")}


class _ZeroedValues(nn.Module):
    """A root without tensors of its own whose init, applied after its children's, zeroes one of them (as
    NeoMMEModel._init_weights zeroes value_embeddings)."""

    def __init__(self):
        super().__init__()
        self.words = nn.Embedding(1000, 64)
        self.values = nn.Embedding(1000, 64)
        self.apply(self._init_weights)

    def _init_weights(self, m):
        if isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, _ZeroedValues):
            nn.init.zeros_(m.values.weight)


def test_a_split_root_without_tensors_whose_init_reaches_into_its_children_is_replayed_with_them():
    torch.manual_seed(0)
    model = _ZeroedValues()
    assert {(v.name, v.kind) for v in judge(model, 0.05, budget=100_000)} == set()  # the root split
    assert {(v.name, v.kind) for v in judge(model, 0.05)} == set()
    with torch.no_grad():
        model.values.weight.normal_(0, 0.02)  # the twin: the root's zeroing undone
    expected = {("values.weight", "unscaled")}
    assert {(v.name, v.kind) for v in judge(model, 0.05, budget=100_000)} == expected
    assert {(v.name, v.kind) for v in judge(model, 0.05)} == expected


def test_family_tells_pytorch_default_from_declared_normal_at_equal_std():
    torch.manual_seed(0)
    uniform = nn.Linear(768, 768).weight  # std 1/sqrt(3 * 768) = 0.0208
    normal = torch.randn(768, 768) * 0.0208
    a, b = draw_of(uniform), draw_of(normal)
    assert abs(a.std / b.std - 1) < 0.02
    assert a.family() == "uniform" and b.family() == "normal"


def _per_module_gpt2_init(module: nn.Module) -> None:
    """GPT-2's per-module init (std 0.02), without the c_proj scaling its blocks apply."""
    if type(module).__name__ == "Conv1D":
        nn.init.normal_(module.weight, std=0.02)
        nn.init.zeros_(module.bias)


def test_streamed_audit_checks_the_declared_init():
    with torch.device("meta"):
        model = gpt2()
    inputs = {"input_ids": ids(1000)}
    assert il014(model, inputs) == {}  # streamed with GPT-2's own _init_weights, block scalings included
    report = initlint.audit(model, inputs, select=["IL014"], init=_per_module_gpt2_init)
    assert set(report.codes()) == {("IL014", f"transformer.h.{i}.{part}.c_proj") for i in range(2)
                                   for part in ("attn", "mlp")}
    assert any("init= leaves 2 weight(s) unset (transformer.wte.weight, transformer.wpe.weight)" in note
               for note in report.notes)
    assert model.transformer.wte.weight.device.type == "meta"


def test_streamed_model_declaring_a_whole_model_init_says_so():
    with torch.device("meta"):
        model = TitanLlama()
    report = initlint.audit(model, ids(1024), select=["IL014"])
    assert any("declares its init in TitanLlama.init_weights()" in note for note in report.notes)


def _repaired(model: nn.Module, inputs) -> nn.Module:
    """The fix applied to every flagged module; the re-audit must be clean."""
    found = il014(model, inputs)
    assert found
    code = InitNotApplied().repair_model(model, found)
    assert code and all("torch.manual_seed(0)" in c for c in code)
    assert il014(model, inputs) == {}
    return model


def test_fix_calls_the_models_own_init_and_restores_the_gpt2_scaling():
    torch.manual_seed(0)
    model = gpt2()
    undo_c_proj_scaling(model)
    rng = torch.get_rng_state()
    code = InitNotApplied().repair_model(model, ["transformer.h.0.attn.c_proj"])
    assert code == ["with torch.random.fork_rng():\n    torch.manual_seed(0)\n    with torch.no_grad():\n"
                    "        model.transformer.h[0].attn.apply(model.transformer._init_weights)"]
    assert torch.equal(torch.get_rng_state(), rng)
    assert abs(model.transformer.h[0].attn.c_proj.weight.std().item() / (0.02 / 2) - 1) < 0.05
    _repaired(model, {"input_ids": ids(1000)})


def test_fix_gives_a_clean_reaudit_on_every_flagged_case():
    torch.manual_seed(0)
    _repaired(tiny_hf(post_init=False), {"input_ids": ids(256)})
    torch.manual_seed(0)
    nano = _repaired(NanoGPT(apply_init=False), ids(512))
    assert abs(nano.transformer.wpe.weight.std().item() / 0.02 - 1) < 0.05
    titan = titan_llama(init=False)
    with torch.no_grad():
        for p in titan.parameters():
            p.zero_()
    titan = _repaired(titan, ids(1024))
    assert abs(titan.layers["0"].attention.wq.weight.std().item() / 0.02 - 1) < 0.1


def test_fix_applies_the_declared_init_and_its_code_calls_it():
    """GPT-2 without its c_proj scaling: fix calls the model's own _init_weights on the flagged blocks, the
    c_proj weights come back at 0.02 / sqrt(2 n_layer), the re-audit is clean, and code() reproduces it."""
    import math

    from declared_models import gpt2, ids, undo_c_proj_scaling

    torch.manual_seed(1)
    model = gpt2()
    undo_c_proj_scaling(model)
    torch.manual_seed(1)
    twin = gpt2()
    undo_c_proj_scaling(twin)
    report = initlint.fix(model, ids(1000))
    assert {f.code for f in report.before.findings} == {"IL014"}
    assert [f for f in report.after.findings if f.severity != "info"] == []
    for block in model.transformer.h:
        for proj in (block.attn.c_proj, block.mlp.c_proj):
            assert abs(proj.weight.std().item() / (0.02 / math.sqrt(2 * 2)) - 1) < 0.05
    code = report.code()
    assert ".apply(model.transformer._init_weights)" in code and "nn.init.normal_" not in code
    namespace: dict = {}
    exec(code, namespace)
    namespace["apply_initlint_fixes"](twin)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))


def test_fix_runs_post_init_work_on_a_model_that_skipped_it():
    from declared_models import ids, tiny_hf

    model = tiny_hf(post_init=False)
    report = initlint.fix(model, ids(model.config.vocab_size))
    assert "IL014" in {f.code for f in report.before.findings}
    assert "IL014" not in {f.code for f in report.after.findings}


def test_fix_repairs_nanogpt_and_a_zeroed_titan_llama_through_their_own_init():
    torch.manual_seed(0)
    nano = NanoGPT(apply_init=False)
    titan = titan_llama(init=False)
    with torch.no_grad():
        for p in titan.parameters():
            p.zero_()
    for model, inputs in ((nano, ids(512)), (titan, ids(1024))):
        report = initlint.fix(model, inputs)
        assert "IL014" in {f.code for f in report.before.findings}
        assert [f for f in report.after.findings if f.severity != "info"] == []
        assert "init_weights" in report.code()


class _PartlyApplied(nn.Module):
    """``_init_weights`` applied to the encoder only; the head keeps PyTorch's default on purpose."""

    def __init__(self, apply: bool = True) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 10)
        if apply:
            self.encoder.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def test_a_declared_init_applied_to_part_of_the_model_leaves_the_rest_alone():
    torch.manual_seed(0)
    report = initlint.audit(_PartlyApplied(), torch.randn(16, 64), select=["IL014"])
    assert report.findings == []
    torch.manual_seed(0)
    missing = initlint.audit(_PartlyApplied(apply=False), torch.randn(16, 64), select=["IL014"])
    assert {f.module for f in missing.findings} >= {"encoder.0", "encoder.2"}


# ----------------------------------------------------------------------------- private copies
def _declared_on_private(init, shape=(1024, 768)):
    """The draw ``init`` gives on a private parameter (tile, patches, copies in on a read) and the private
    state left behind."""
    from initlint.probe import declared as il

    original = nn.Parameter(torch.randn(*shape))
    lazy = il._Private()
    private = lazy.parameter(original)
    with torch.no_grad(), lazy.drawing([private]):
        init(private)
    return lazy.draws([private])[0], lazy, private, original


def _written_out(lazy, private):
    from initlint.probe import declared as il

    lazy._materialise(il._storage(private))
    return private


@pytest.mark.parametrize("init", [
    lambda t: nn.init.normal_(t, std=0.02),
    lambda t: nn.init.trunc_normal_(t, std=0.02),
    lambda t: nn.init.trunc_normal_(t, std=1.0, a=-0.5, b=0.5),
    lambda t: nn.init.kaiming_uniform_(t, a=5 ** 0.5),
    lambda t: nn.init.xavier_uniform_(t),
    lambda t: nn.init.orthogonal_(t),
    lambda t: (nn.init.normal_(t), t[3].zero_(), t[100:110].fill_(1.0)),
    lambda t: (nn.init.normal_(t, std=0.02), t.mul_(1 / 24 ** 0.5)),
    lambda t: t.mul_(0.5),
], ids=["normal", "trunc_normal", "trunc_normal_rejection", "kaiming_uniform", "xavier", "orthogonal",
        "padding_rows", "rescaled", "rescale_only"])
@pytest.mark.parametrize("shape", [(1024, 768), (192, 128)], ids=["tiled", "small"])
def test_a_private_parameter_draws_what_the_init_draws_on_a_real_tensor(init, shape):
    from initlint.probe.declared import same

    drawn, lazy, private, original = _declared_on_private(init, shape)
    real = original.detach().clone()
    with torch.no_grad():
        init(real)
    assert same(drawn, draw_of(real), 0.05), (drawn, draw_of(real))
    # what the sample was read from is what the tensor holds once written out: a tile nothing was written
    # over is its own sample (the tensor's first values), anything else is read at the sampled places
    from initlint.probe.declared import _storage, _sampled

    sample = lazy.sample(private, 4096)
    key = _storage(private)
    whole_tile = key in lazy.tiled and key not in lazy.patches
    written = _written_out(lazy, private)
    expected = written.detach().reshape(-1)[:4096] if whole_tile else _sampled(written, 4096)
    assert torch.equal(sample, expected)


def test_an_init_that_only_rescales_reads_the_original_values():
    drawn, lazy, private, original = _declared_on_private(lambda t: t.mul_(0.5))
    assert torch.equal(_written_out(lazy, private), original.detach() * 0.5)


def test_a_fill_draws_one_tile_and_leaves_the_memory_unwritten():
    from initlint.probe import declared as il

    drawn, lazy, private, original = _declared_on_private(lambda t: nn.init.trunc_normal_(t, std=0.02))
    assert il._storage(private) in lazy.tiled and not lazy.original
    assert isinstance(lazy.tiled[il._storage(private)][1], torch.Tensor)  # its bounds were checked on the tile


def test_a_fill_nothing_reads_again_has_the_exact_draw_of_its_distribution():
    from initlint.probe import declared as il

    for init, std, kurt in ((lambda t: nn.init.normal_(t, std=0.02), 0.02, 3.0),
                            (lambda t: nn.init.uniform_(t, -0.1, 0.1), 0.2 / 12 ** 0.5, 1.8)):
        drawn, lazy, private, original = _declared_on_private(init)
        assert isinstance(lazy.tiled[il._storage(private)][1], il._Fill)  # no value drawn
        assert (drawn.std, drawn.mean, drawn.kurt, drawn.zeros, drawn.n) == (std, 0.0, kurt, 0.0, il.SAMPLE)


@pytest.mark.parametrize("n", [10, 65536, 65537, 70000, 130000, 786432, 2883584])
def test_a_sample_is_runs_spread_over_the_whole_tensor(n):
    from initlint.probe.declared import RUN, SAMPLE, _sampled, _sampled_positions

    t = torch.arange(n, dtype=torch.float64)  # each value is its own position
    sample = _sampled(t)
    assert torch.equal(sample, _sampled_positions(n, SAMPLE, t.device).double())
    assert sample.numel() == min(n, SAMPLE) and torch.unique(sample).numel() == sample.numel()
    if n > SAMPLE:
        runs = sample.view(-1, RUN)
        assert torch.equal(runs - runs[:, :1], torch.arange(RUN, dtype=torch.float64).expand_as(runs))  # contiguous
        gaps = runs[1:, 0] - runs[:-1, 0]
        assert sample[0] == 0 and n - 1 - sample[-1] < gaps.max()  # from the first element to the last run
        assert gaps.max() - gaps.min() == 0  # evenly spaced
    # a non-contiguous tensor is sampled as its values in order
    m = torch.arange(n, dtype=torch.float64).view(-1, 2) if n % 2 == 0 else None
    if m is not None:
        assert torch.equal(_sampled(m.t()), _sampled(m.t().contiguous()))


def _counted_fill_draws(monkeypatch):
    """The list each random fill of a private tensor is appended to when its values are drawn."""
    from initlint.probe import declared as il

    drawn_fills = []
    real_draw = il._Fill.draw
    monkeypatch.setattr(il._Fill, "draw", lambda self, into=None: drawn_fills.append(self) or real_draw(self, into))
    return drawn_fills


def _filled_twice(t):
    """A Hugging Face conv's init: the base class's ``normal_``, then its own ``kaiming_normal_``."""
    nn.init.normal_(t, std=0.02)
    nn.init.kaiming_normal_(t, mode="fan_out", nonlinearity="relu")


def test_a_small_fill_is_drawn_only_when_read_and_never_when_overwritten(monkeypatch):
    """A random fill of a tensor too small to tile waits: a second fill over it (``kaiming_normal_`` after
    ``normal_``) means the first is never drawn; a fill nothing reads has its distribution's exact draw;
    an op that reads it (``mul_``) first writes the fill out in full."""
    from initlint.probe import declared as il

    drawn_fills = _counted_fill_draws(monkeypatch)

    drawn, lazy, private, original = _declared_on_private(_filled_twice, (256, 64))
    assert drawn_fills == [] and isinstance(lazy.pending[il._storage(private)][1], il._Fill)
    assert (drawn.std, drawn.mean, drawn.kurt, drawn.n) == ((2 / 256) ** 0.5, 0.0, 3.0, 256 * 64)

    drawn, lazy, private, original = _declared_on_private(lambda t: (nn.init.normal_(t), t.mul_(0.02)), (256, 64))
    assert len(drawn_fills) == 1 and not lazy.pending and not lazy.original
    assert private.abs().max() < 0.2 and abs(private.std().item() / 0.02 - 1) < 0.05  # the fill, written out, then scaled
    assert (drawn.std, drawn.kurt) != (0.02, 3.0)  # sampled from the values, not the exact draw


def test_a_tiled_fill_overwritten_by_another_fill_is_never_drawn(monkeypatch):
    """A large parameter's first fill stands as a tile not drawn yet; a second fill over the whole of it (a
    Hugging Face conv's ``normal_`` then its ``kaiming_normal_``) replaces it without drawing it, and the
    parameter keeps the second fill's exact draw. An op that reads the tile (``mul_``) draws it once."""
    from initlint.probe import declared as il

    drawn_fills = _counted_fill_draws(monkeypatch)

    drawn, lazy, private, original = _declared_on_private(_filled_twice, (1024, 768))
    assert drawn_fills == [] and isinstance(lazy.tiled[il._storage(private)][1], il._Fill)
    assert (drawn.std, drawn.mean, drawn.kurt, drawn.n) == ((2 / 1024) ** 0.5, 0.0, 3.0, il.SAMPLE)

    drawn, lazy, private, original = _declared_on_private(lambda t: (nn.init.normal_(t), t.mul_(0.02)), (1024, 768))
    assert len(drawn_fills) == 1 and isinstance(lazy.tiled[il._storage(private)][1], torch.Tensor)
    assert abs(drawn.std / 0.02 - 1) < 0.05 and (drawn.std, drawn.kurt) != (0.02, 3.0)  # sampled from the tile


@pytest.mark.parametrize("shape", [(768,), (1024, 768)])
def test_a_constant_fill_nothing_reads_again_has_its_exact_draw(monkeypatch, shape):
    """``zero_()`` and ``fill_(v)`` over a whole private tensor (a norm's ones, a bias's zeros) wait as random
    fills do: nothing reads them again, so their draw is the constant's, as the dtype holds it, and never
    sampled; a read writes the constant out first, and a constant written over part of it is sampled."""
    from initlint.probe import declared as il

    drawn_fills = _counted_fill_draws(monkeypatch)
    for init, value in ((lambda t: t.zero_(), 0.0), (lambda t: t.fill_(1.0), 1.0),
                        (lambda t: nn.init.constant_(t, 0.02), float(torch.tensor(0.02)))):
        drawn, lazy, private, original = _declared_on_private(init, shape)
        held = lazy.tiled if len(shape) > 1 else lazy.pending
        assert drawn_fills == [] and isinstance(held[il._storage(private)][1], il._Fill)
        assert (drawn.std, drawn.mean, drawn.kurt, drawn.family()) == (0.0, value, None, "constant")
        assert (drawn.zeros, drawn.ones, drawn.n) == (float(value == 0), float(value == 1), min(private.numel(), il.SAMPLE))
        assert torch.equal(_written_out(lazy, private), torch.full(shape, value))
        assert len(drawn_fills) == 1  # written out once, when read
        drawn_fills.clear()
    drawn, lazy, private, original = _declared_on_private(lambda t: (t.fill_(1.0), t.add_(0.5)), shape)
    assert (drawn.std, drawn.mean) == (0.0, 1.5) and not lazy.pending  # read: written out, then sampled
    drawn, lazy, private, original = _declared_on_private(lambda t: (t.zero_(), t[:3].fill_(2.0)), shape)
    assert drawn.std > 0 and torch.equal(_written_out(lazy, private).reshape(-1)[:3], torch.full((3,), 2.0))


def test_a_small_half_precision_fill_is_sampled_from_its_values():
    """Half precision has no exact draw (a small std rounds values to zero): the fill is written out and read."""
    from initlint.probe import declared as il

    lazy = il._Private()
    private = lazy.parameter(nn.Parameter(torch.randn(256, 64, dtype=torch.float16)))
    with torch.no_grad(), lazy.drawing([private]):
        nn.init.normal_(private, std=0.02)
    drawn = lazy.draws([private])[0]
    assert not lazy.pending and torch.isfinite(private).all()
    assert abs(drawn.std / 0.02 - 1) < 0.05 and drawn.n == 256 * 64


class _HiddenLayers(nn.Module):
    """A declared init that writes a layer the module keeps in a plain list (not a registered submodule)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.hidden = [nn.Linear(64, 64)]
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            for layer in self.hidden:
                nn.init.zeros_(layer.weight)

    def forward(self, x):
        return self.fc(x) + self.hidden[0](x)


def test_an_init_writing_a_tensor_outside_the_copy_is_stopped_before_the_write():
    torch.manual_seed(0)
    model = _HiddenLayers()
    nn.init.normal_(model.hidden[0].weight)  # what the model's own init would zero
    before = model.hidden[0].weight.detach().clone()
    x = torch.randn(4, 64)
    state = deep_state(model)
    assert il014(model, x) == {}
    assert torch.equal(model.hidden[0].weight, before)
    assert deep_state(model) == state


def test_a_unit_whose_replay_runs_out_of_memory_is_named_not_a_rule_error(monkeypatch):
    # Gemma 4 at its real width under a 6 GiB limit: the replay of its declared init asked for one more copy
    # of its embedding (2.4 GB), and the whole rule failed (IL000)
    import initlint.rules.il014_init_not_applied as il014

    def short_of_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 2415919104 bytes")

    torch.manual_seed(0)
    model = gpt2()
    undo_c_proj_scaling(model)  # flagged when the replay runs (test above); one unit: the whole model
    monkeypatch.setattr(il014, "declare_applied", short_of_memory)
    report = initlint.audit(model, {"input_ids": ids(1000)}, select=["IL014"])
    assert [(f.code, f.module, f.severity) for f in report.findings] == [("IL014", "", "info")]
    assert "ran out of memory on its private copy: its parameters are not judged" in report.findings[0].message

    def broken(*args, **kwargs):
        raise RuntimeError("not a memory error")

    monkeypatch.setattr(il014, "declare_applied", broken)
    assert [f.code for f in initlint.audit(model, {"input_ids": ids(1000)}, select=["IL014"]).findings] == ["IL000"]


def test_samples_are_reduced_a_few_at_a_time_on_the_cpu_and_together_on_an_accelerator():
    """On the CPU a batch of samples stays in the cache; on an accelerator a batch costs its launches, so the
    224 large samples of a 32-layer Llama go in one batch there (no accelerator is needed to ask for the runs)."""
    from initlint.probe.declared import SAMPLE, _in_cache

    items = list(range(224))
    assert [len(part) for part in _in_cache(items, SAMPLE, torch.device("cpu"))] == [16] * 14
    assert [len(part) for part in _in_cache(items, SAMPLE, torch.device("cuda"))] == [224]
    assert sum(_in_cache(items, 7, torch.device("cuda")), []) == items


class _ScaledByBuffer(nn.Module):
    """A declared init that reads a buffer of the model (the std scaled by ``gain``); not applied."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(256, 256)
        self.out = nn.Linear(256, 10)
        self.register_buffer("gain", torch.tensor(0.5))
        self.register_buffer("unread", torch.randn(64))

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02 * float(self.gain))
            nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.out(torch.tanh(self.fc(x)))


def test_a_buffer_the_declared_init_reads_holds_the_models_values_on_the_private_copy():
    """A private copy's buffers stand for the model's, written out only when an op reads them: the init that
    scales by ``gain`` declares std 0.01, from the model's 0.5."""
    torch.manual_seed(0)
    report = initlint.audit(_ScaledByBuffer(), torch.randn(8, 256), select=["IL014"])
    assert {(f.code, f.module) for f in report.findings} == {("IL014", "fc"), ("IL014", "out")}
    assert all("_ScaledByBuffer._init_weights declares std 0.01, normal" in f.message for f in report.findings)


def test_a_private_buffer_is_written_out_from_the_models_only_when_read():
    from initlint.probe import declared as il

    lazy = il._Private()
    model_buffer = torch.full((64,), 0.5)
    private = lazy.buffer(model_buffer)
    assert il._storage(private) in lazy.original and il._storage(private) in lazy.owned  # no copy made yet
    with torch.no_grad():
        il._alias(private).fill_(-7.0)  # what fresh memory might hold
    with torch.no_grad(), lazy.drawing([]):
        read = float(private.sum())
    assert read == 32.0 and torch.equal(private, model_buffer) and not lazy.original
    assert lazy.buffer(torch.zeros(0)).numel() == 0 and lazy.buffer(None) is None
