"""Streaming audit of models on the meta device: block by block, equal to the materialised model's audit."""
import functools

import pytest
import torch
import torch.nn as nn

import initlint
from initlint.scale.stream import BlockProgress

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def owns_tensors(m: nn.Module) -> bool:
    return any(True for _ in m.parameters(recurse=False)) or any(True for _ in m.buffers(recurse=False))


def materialised(build, init, seed=0) -> nn.Module:
    """The model built normally, then ``init`` applied to every module that owns tensors, in module
    order, after ``torch.manual_seed(seed)``; a tied tensor keeps its first owner's values (as
    Hugging Face's ``tie_weights`` does after initialising both sides)."""
    torch.manual_seed(1234)  # construction draws: overwritten by init, or constant (norms, rotary tables)
    model = build()
    torch.manual_seed(seed)
    done = set()
    for m in model.modules():
        if not owns_tensors(m):
            continue
        tied = {id(p): p.detach().clone() for p in m.parameters(recurse=False) if id(p) in done}
        init(m)
        with torch.no_grad():
            for p in m.parameters(recurse=False):
                if id(p) in tied:
                    p.copy_(tied[id(p)])
        done.update(id(p) for p in m.parameters(recurse=False))
    return model


def on_meta(build) -> nn.Module:
    with torch.device("meta"):
        return build()


# ------------------------------------------------------------------ three architectures
def bad_mlp():
    layers = [nn.Linear(64, 256), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(256, 10))


def init_bad_mlp(m):
    if isinstance(m, nn.Linear):
        # He init, except the hidden 256x256 layers: std 1 where relu needs 0.088
        std = 1.0 if m.in_features == m.out_features == 256 else (2.0 / m.in_features) ** 0.5
        nn.init.normal_(m.weight, std=std)
        nn.init.zeros_(m.bias)


def small_llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, attn_implementation="eager"))


def small_gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=64, n_layer=3, n_head=4, vocab_size=512, n_positions=64, bos_token_id=0, eos_token_id=0,
        attn_implementation="eager"))


def init_loud(m):
    """Every weight matrix drawn with std 1 (50x the usual 0.02): attention saturates."""
    if isinstance(m, (nn.Linear, nn.Embedding)) or type(m).__name__ == "Conv1D":
        nn.init.normal_(m.weight, std=1.0)
        if getattr(m, "bias", None) is not None:
            nn.init.zeros_(m.bias)


IDS = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
CASES = {
    "mlp": (bad_mlp, init_bad_mlp, torch.randn(16, 64, generator=torch.Generator().manual_seed(0))),
    "llama": (small_llama, init_loud, IDS),
    "gpt2": (small_gpt2, init_loud, IDS),  # lm_head tied to the token embedding
}


def assert_same_audit(streamed, reference):
    assert streamed.codes() == reference.codes()
    for a, b in zip(streamed.findings, reference.findings):
        assert (a.message, a.fix, a.location, a.threshold) == (b.message, b.fix, b.location, b.threshold)
        assert a.value == pytest.approx(b.value, rel=1e-5)  # a gradient's figure: see assert_same_gradients
    assert streamed.probe.params == reference.probe.params
    assert streamed.probe.ops == reference.probe.ops
    assert_same_gradients(streamed.probe.grads, reference.probe.grads)


def assert_same_gradients(streamed, reference):
    """The streamed probe forms each weight's gradient block by block; the in-memory probe takes the
    statistics of most weights' gradients from their products' inputs and output gradients, without
    forming them. Equal up to the order of floating-point sums: scale within 1e-5, and the mean, a sum
    that cancels, within 1e-5 of the scale."""
    assert set(streamed) == set(reference)
    for name, a in streamed.items():
        b = reference[name]
        assert a.rms == pytest.approx(b.rms, rel=1e-5) and a.std == pytest.approx(b.std, rel=1e-5), name
        assert abs(a.mean - b.mean) <= 1e-5 * b.rms, name


@pytest.mark.parametrize("case", sorted(CASES))
def test_streamed_audit_equals_the_materialised_models(case):
    build, init, inputs = CASES[case]
    reference = initlint.audit(materialised(build, init), inputs)
    assert reference.findings, "the seeded init is meant to be bad"
    model = on_meta(build)
    streamed = initlint.audit(model, inputs, init=init)
    assert_same_audit(streamed, reference)
    assert streamed.probe.backward_ran and streamed.device == "cpu"
    assert any(note.startswith("the model is on the meta device: audited block by block") for note in streamed.notes)
    assert {t.device.type for t in list(model.parameters()) + list(model.buffers())} == {"meta"}


@pytest.mark.parametrize("build", [small_llama, small_gpt2])
def test_hugging_face_default_init_streams_clean(build):
    model = on_meta(build)
    streamed = initlint.audit(model, IDS)
    assert streamed.codes() == initlint.audit(build(), IDS).codes() == []
    assert any(f"initialised with {type(model).__name__}._init_weights" in n for n in streamed.notes)


def test_default_init_is_each_modules_reset_parameters():
    def deep():
        layers = []
        for _ in range(8):
            layers += [nn.Linear(128, 128), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(128, 10))

    streamed = initlint.audit(on_meta(deep))  # the probe batch is inferred, as for any model
    assert streamed.codes() == initlint.audit(deep()).codes()
    assert ("IL006", "16") in streamed.codes()  # a gradient rule: the backward probe ran


# ------------------------------------------------------------------ how blocks come and go
class OutOfOrder(nn.Module):
    """Defined head first and with a parameter of its own; runs input -> blocks -> head."""

    def __init__(self, width=128, depth=4):
        super().__init__()
        self.head = nn.Linear(width, 10)
        self.scale = nn.Parameter(torch.ones(width))
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth))
        self.inp = nn.Linear(16, width)

    def forward(self, x):
        h = self.inp(x) * self.scale
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def init_out_of_order(m):
    if isinstance(m, OutOfOrder):
        nn.init.normal_(m.scale, 1.0, 0.1)
    elif isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, std=1.0 if m.in_features == m.out_features else 0.1)
        nn.init.normal_(m.bias, std=0.1)


def test_blocks_out_of_module_order_and_a_models_own_parameter():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    reference = initlint.audit(materialised(OutOfOrder, init_out_of_order), x)
    assert reference.findings
    assert_same_audit(initlint.audit(on_meta(OutOfOrder), x, init=init_out_of_order), reference)


LIVE = []


def count_live(owner, module, args):
    """Forward pre-hook: how many elements of the whole (audited copy of the) model hold values now."""
    LIVE.append(sum(p.numel() for p in owner[0].parameters() if p.device.type != "meta"))


def wide_stack(width=256, depth=6):
    layers = [nn.Linear(16, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(width, 10))
    owner = [model]  # deep copies of the hooks point at the copy of the model
    for m in model:
        if isinstance(m, nn.Linear):
            m.register_forward_pre_hook(functools.partial(count_live, owner))
    return model


def test_one_block_holds_values_at_a_time():
    LIVE.clear()
    events = []
    width, depth = 256, 6
    report = initlint.audit(on_meta(wide_stack), torch.randn(8, 16), progress=events.append)
    assert report.probe.backward_ran
    assert LIVE and max(LIVE) > 0
    assert max(LIVE) <= width * width + width  # never more than the largest block
    total = sum(p.numel() for p in wide_stack().parameters())
    assert total > 5 * max(LIVE)
    forward = [e.block for e in events if e.phase == "forward"]
    backward = [e.block for e in events if e.phase == "backward"]
    blocks = [str(i) for i in range(0, 2 * depth + 3, 2)]
    assert forward == blocks and [e.index for e in events if e.phase == "forward"] == list(range(1, len(blocks) + 1))
    assert backward == blocks[::-1][:len(backward)] and len(backward) >= depth + 1  # recomputed in reverse
    assert all(isinstance(e, BlockProgress) and e.total >= e.index for e in events)
    # the estimate of the time left: from the first block on, never negative, nothing left after the last
    assert all(e.remaining is not None and e.remaining >= 0 for e in events)
    assert events[-1].remaining == 0 and events[0].remaining > 0


def test_init_is_called_once_per_tensor_owner_in_module_order():
    calls = []

    def init(m):
        calls.append((type(m).__name__, tuple(m.weight.shape)))
        init_bad_mlp(m)

    # no gradient rule selected: no recomputation, so each block is initialised exactly once
    initlint.audit(on_meta(wide_stack), torch.randn(8, 16), init=init, select=["IL001", "IL003"])
    assert calls == [(type(m).__name__, tuple(m.weight.shape)) for m in wide_stack().modules() if owns_tensors(m)]


def test_the_users_model_and_random_state_are_untouched():
    model = on_meta(small_llama)
    before = {n: (t.shape, t.dtype, t.device) for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    state = torch.get_rng_state()
    grad_mode = torch.is_grad_enabled()
    initlint.audit(model, IDS, init=init_loud)
    after = {n: (t.shape, t.dtype, t.device) for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    assert after == before
    assert torch.equal(torch.get_rng_state(), state) and torch.is_grad_enabled() == grad_mode
    assert all(p.grad is None for p in model.parameters())


# ------------------------------------------------------------------ bad input
def test_a_tensor_nothing_can_fill_is_one_clear_sentence():
    message = r"parameter 'scale' \(OutOfOrder\) is on the meta device and OutOfOrder has no reset_parameters\(\)"
    with pytest.raises(initlint.LoadError, match=message + r" to set it; pass init= to initlint.audit"):
        initlint.audit(on_meta(OutOfOrder), torch.randn(8, 16))

    def partial(m):
        if isinstance(m, nn.Linear):
            init_out_of_order(m)

    with pytest.raises(initlint.LoadError, match=r"'scale' \(OutOfOrder\) is on the meta device, init leaves it unset"):
        initlint.audit(on_meta(OutOfOrder), torch.randn(8, 16), init=partial)


def test_an_init_that_raises_names_the_module():
    def broken(m):
        if isinstance(m, nn.Linear):
            raise ValueError("no such scheme")
        init_out_of_order(m)

    with pytest.raises(initlint.LoadError, match=r"init\(head: Linear\) raised ValueError: no such scheme"):
        initlint.audit(on_meta(OutOfOrder), torch.randn(8, 16), init=broken)


def test_init_for_a_model_that_holds_values_is_refused():
    with pytest.raises(initlint.UsageError, match="init= is for a model on the meta device"):
        initlint.audit(nn.Linear(4, 4), torch.randn(2, 4), init=init_loud)


# ------------------------------------------------------------------ out of memory
def _run_out_of_memory_above(monkeypatch, largest):
    """The streamed probe runs out of memory while the batch is larger than ``largest``."""
    from initlint.scale.stream import StreamProbe

    real = StreamProbe.run
    tried = []

    def run(self, args, kwargs, logits):
        tried.append(args[0].shape[0])
        if args[0].shape[0] > largest:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, args, kwargs, logits)

    monkeypatch.setattr(StreamProbe, "run", run)
    return tried


def test_a_streamed_audit_that_runs_out_of_memory_halves_the_batch_like_the_in_memory_one(monkeypatch):
    tried = _run_out_of_memory_above(monkeypatch, 4)
    report = initlint.audit(on_meta(bad_mlp), torch.randn(16, 64), init=init_bad_mlp)
    assert tried == [16, 8, 4]  # no fallback to the runtime capture on the way: memory, not tracing, failed
    assert "the probe ran out of memory; retried with a batch of 4" in report.notes
    assert not any("fx-traced graph failed" in n for n in report.notes)
    reference = initlint.audit(materialised(bad_mlp, init_bad_mlp), torch.randn(4, 64))
    assert sorted(report.codes()) == sorted(reference.codes()) and ("IL001", "2") in report.codes()


def test_a_streamed_audit_out_of_memory_at_a_batch_of_1_is_one_sentence(monkeypatch):
    _run_out_of_memory_above(monkeypatch, 0)
    with pytest.raises(initlint.LoadError, match=r"^the probe ran out of memory even with a batch of 1 on the CPU"):
        initlint.audit(on_meta(bad_mlp), torch.randn(2, 64), init=init_bad_mlp)


def test_a_seed_queued_for_an_accelerator_not_in_use_yet_survives_a_streamed_audit():
    from test_no_mutation import assert_a_queued_seed_survives

    assert_a_queued_seed_survives("from test_stream import IDS, init_loud, on_meta, small_llama\n"
                                  "model = on_meta(small_llama)",
                                  'initlint.audit(model, IDS, init=init_loud, device="cpu")')


def test_large_fills_are_drawn_by_threads_with_the_declared_distribution_and_replay_alike(monkeypatch):
    """On CPU a streamed block's large random fills are drawn in chunks by several threads, each from a
    generator seeded from one draw of the global stream: the declared distribution, the same values from
    the same global state (the block drawn again for the backward), and the materialised model's findings."""
    from initlint.scale import stream

    monkeypatch.setattr(stream, "_PARALLEL_FILL", 4096)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        drawn = []
        for _ in range(2):
            torch.manual_seed(0)
            with stream._ParallelFills():
                drawn.append(torch.empty(100_000).normal_(0.5, 0.02))
                after = torch.rand(1)  # the global stream moved on by the one draw, alike both times
            drawn.append(after)
        assert torch.equal(drawn[0], drawn[2]) and torch.equal(drawn[1], drawn[3])
        assert drawn[0].std().item() == pytest.approx(0.02, rel=0.02)
        assert drawn[0].mean().item() == pytest.approx(0.5, abs=1e-3)
        assert not torch.equal(drawn[0][:50_000], drawn[0][50_000:])  # each chunk from a generator of its own
        torch.manual_seed(0)
        assert not torch.equal(torch.empty(100_000).normal_(0.5, 0.02), drawn[0])  # not the global stream's fill
        with stream._ParallelFills():
            uniform = torch.empty(100_000).uniform_(-1.0, 1.0)
            small = torch.empty(100).normal_()  # below the size: the global stream's own fill
        assert -1.0 <= uniform.min().item() and uniform.max().item() <= 1.0
        assert uniform.std().item() == pytest.approx(3 ** -0.5, rel=0.02) and small.std().item() > 0.5

        build, init, inputs = CASES["llama"]
        reference = initlint.audit(materialised(build, init), inputs)
        streamed = initlint.audit(on_meta(build), inputs, init=init)
        assert [(f.code, f.module) for f in streamed.findings] == [(f.code, f.module) for f in reference.findings]
        assert streamed.probe.backward_ran
        # the head, held from the start but last in module order, is reached by running the layers' init dry:
        # the random state is the one real draws leave, so every value is the same
        real = stream.Materialiser._materialise
        monkeypatch.setattr(stream.Materialiser, "_materialise", lambda self, group, dry=False: real(self, group))
        undried = initlint.audit(on_meta(build), inputs, init=init)
        assert streamed.probe.params == undried.probe.params and streamed.probe.ops == undried.probe.ops
        assert streamed.probe.drawn.keys() == undried.probe.drawn.keys()
    finally:
        torch.set_num_threads(threads)
