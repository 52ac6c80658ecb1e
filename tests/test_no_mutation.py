"""An audit leaves everything as it found it, on a few hundred generated models and on
every kind of forward that changes state.

Hypothesis draws a model description (front-end, sequential or residual blocks, every
supported activation, norms, dropout, blocks whose forward changes state, pathological
inits, frozen parameters, existing ``.grad`` tensors, the user's own hooks, modules in
eval mode) and the caller's context (grad mode, RNG state). After ``initlint.audit`` the
model's tensors must be bitwise identical and the very same objects, and every flag,
gradient, hook, the global RNG state and the grad mode unchanged; auditing again with the
same seed gives the same findings with the same values.

The hand-written cases of ``stateful_models.CASES`` (buffers updated in place, reassigned
or registered on the first call, parametrized and hook-based spectral norm, QAT
observers, ``Embedding(max_norm=...)``, in-place parameter edits, ``train()`` overrides,
global modes changed in forward) are checked further: every attribute of every module
(by identity, containers by content), every tensor's version counter, the RNGs of torch,
Python and NumPy, and the process-wide modes.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import torch
import torch.nn as nn
try:
    from hypothesis import HealthCheck, event, given, settings
    from hypothesis import strategies as st
except ImportError:  # a dev dependency: without it the property skips, and the tests after it run
    st = None

import initlint
from initlint.compat import set_version_counters
from model_state import bits, deep_state
from stateful_models import BLOCKS, CASES, Interrupted

ACTIVATIONS: Dict[str, Callable[[bool], nn.Module]] = {
    "relu": lambda inplace: nn.ReLU(inplace=inplace),
    "leaky_relu": lambda inplace: nn.LeakyReLU(0.2, inplace=inplace),
    "prelu": lambda inplace: nn.PReLU(),
    "elu": lambda inplace: nn.ELU(inplace=inplace),
    "selu": lambda inplace: nn.SELU(inplace=inplace),
    "gelu": lambda inplace: nn.GELU(),
    "silu": lambda inplace: nn.SiLU(inplace=inplace),
    "tanh": lambda inplace: nn.Tanh(),
    "sigmoid": lambda inplace: nn.Sigmoid(),
    "hardtanh": lambda inplace: nn.Hardtanh(inplace=inplace),
    "softplus": lambda inplace: nn.Softplus(),
    "mish": lambda inplace: nn.Mish(inplace=inplace),
}
NORMS = (None, "batch", "layer", "group")
INITS = ("default", "zeros", "constant", "huge", "tiny", "normal")


@dataclass(frozen=True)
class BlockSpec:
    residual: bool
    data_dependent: bool
    activation: str
    inplace: bool
    norm: Optional[str]
    dropout: bool
    track_running_stats: bool
    stateful: Optional[str] = None


@dataclass(frozen=True)
class ModelSpec:
    front: str  # linear | conv | embedding
    width: int
    in_features: int
    blocks: Tuple[BlockSpec, ...]
    out_features: int
    softmax_head: bool
    seed: int


@dataclass(frozen=True)
class Perturbation:
    """What the user did to the model after building it (indices wrap around the module/param lists)."""

    inits: Tuple[Tuple[str, float], ...]
    frozen: Tuple[int, ...]
    with_grad: Tuple[int, ...]
    eval_modules: Tuple[int, ...]
    forward_hooks: Tuple[int, ...]
    pre_hooks: Tuple[int, ...]
    backward_hook_on_root: bool
    whole_model_eval: bool


# ------------------------------------------------------------------ strategies
def strategies() -> Tuple[Any, Any]:
    """Hypothesis's strategies for a model and for what the user did to it."""
    blocks = st.builds(BlockSpec, residual=st.booleans(), data_dependent=st.integers(0, 5).map(lambda n: n == 0),
                       activation=st.sampled_from(sorted(ACTIVATIONS)),
                       inplace=st.booleans(), norm=st.sampled_from(NORMS), dropout=st.booleans(),
                       track_running_stats=st.booleans(),
                       stateful=st.one_of(st.none(), st.none(), st.sampled_from(sorted(BLOCKS))))
    specs = st.builds(ModelSpec, front=st.sampled_from(("linear", "conv", "embedding")), width=st.integers(2, 16),
                      in_features=st.integers(1, 12), blocks=st.lists(blocks, min_size=0, max_size=6).map(tuple),
                      out_features=st.integers(1, 6), softmax_head=st.booleans(), seed=st.integers(0, 2**16))
    indices = st.lists(st.integers(0, 63), max_size=4).map(tuple)
    perturbations = st.builds(
        Perturbation,
        inits=st.lists(st.tuples(st.sampled_from(INITS), st.floats(-3, 3, allow_nan=False)), max_size=8).map(tuple),
        frozen=indices, with_grad=indices, eval_modules=indices, forward_hooks=indices, pre_hooks=indices,
        backward_hook_on_root=st.booleans(), whole_model_eval=st.booleans(),
    )
    return specs, perturbations


# ------------------------------------------------------------------ building
class Residual(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)


class Gated(nn.Module):
    """Branches on the data, as real models do (``if x.sum() > 0``): torch.fx cannot trace it."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x):
        y = self.body(x)
        return x + y if y.abs().sum() >= 0 else y


def norm_layer(kind: Optional[str], spec: ModelSpec, block: BlockSpec) -> Optional[nn.Module]:
    w = spec.width
    if kind is None:
        return None
    if spec.front == "embedding" or kind == "layer":  # tokens are (batch, seq, width): only LayerNorm fits
        return nn.LayerNorm(w) if spec.front != "conv" else nn.GroupNorm(1, w)
    if kind == "batch":
        cls = nn.BatchNorm2d if spec.front == "conv" else nn.BatchNorm1d
        return cls(w, track_running_stats=block.track_running_stats)
    groups = max(g for g in (1, 2, 4) if w % g == 0)
    return nn.GroupNorm(groups, w)


def build(spec: ModelSpec) -> nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(spec.seed)
        w = spec.width
        if spec.front == "linear":
            layers: List[nn.Module] = [nn.Linear(spec.in_features, w)]
            layer = lambda: nn.Linear(w, w)  # noqa: E731
        elif spec.front == "conv":
            layers = [nn.Conv2d(min(spec.in_features, 3), w, 3, padding=1)]
            layer = lambda: nn.Conv2d(w, w, 3, padding=1)  # noqa: E731
        else:
            layers = [nn.Embedding(spec.in_features + 4, w)]
            layer = lambda: nn.Linear(w, w)  # noqa: E731
        for block in spec.blocks:
            body = [layer()]
            norm = norm_layer(block.norm, spec, block)
            if norm is not None:
                body.append(norm)
            # an in-place activation must not write into the residual input itself
            body.append(ACTIVATIONS[block.activation](block.inplace))
            if block.dropout:
                body.append(nn.Dropout(0.3))
            if block.stateful:
                body.append(BLOCKS[block.stateful]())
            wrap = Gated if block.data_dependent else Residual if block.residual else nn.Sequential
            layers.append(wrap(nn.Sequential(*body)) if wrap is not nn.Sequential else nn.Sequential(*body))
        if spec.front == "conv":
            layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        layers.append(nn.Linear(w, spec.out_features))
        if spec.softmax_head:
            layers.append(nn.Softmax(dim=-1))
        return nn.Sequential(*layers)


def apply_init(p: torch.Tensor, mode: str, value: float) -> None:
    with torch.no_grad():
        if mode == "zeros":
            p.zero_()
        elif mode == "constant":
            p.fill_(value)
        elif mode == "huge":
            p.normal_(0.0, 1e3)
        elif mode == "tiny":
            p.normal_(0.0, 1e-7)
        elif mode == "normal":
            p.normal_(0.0, abs(value) + 1e-3)


class UserHooks:
    """The user's own hooks: they must still be registered, as the same objects, afterwards."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, module, args, output):
        self.calls += 1

    def pre(self, module, args):
        self.calls += 1

    def backward(self, module, grad_input, grad_output):
        self.calls += 1


def perturb(model: nn.Module, spec: ModelSpec, p: Perturbation) -> UserHooks:
    with torch.random.fork_rng():
        torch.manual_seed(spec.seed + 1)
        params = [q for q in model.parameters()]
        modules = [m for m in model.modules()]
        for i, (mode, value) in enumerate(p.inits):
            apply_init(params[(i * 7 + int(abs(value) * 10)) % len(params)], mode, value)
        for i in p.frozen:
            params[i % len(params)].requires_grad_(False)
        for i in p.with_grad:
            q = params[i % len(params)]
            q.grad = torch.randn_like(q)
        hooks = UserHooks()
        for i in p.forward_hooks:
            modules[i % len(modules)].register_forward_hook(hooks.forward)
        for i in p.pre_hooks:
            modules[i % len(modules)].register_forward_pre_hook(hooks.pre)
        if p.backward_hook_on_root:
            model.register_full_backward_hook(hooks.backward)
        if p.whole_model_eval:
            model.eval()
        for i in p.eval_modules:
            modules[i % len(modules)].train(not modules[i % len(modules)].training)
    return hooks


def example_inputs(spec: ModelSpec, batch: int, explicit: bool) -> Any:
    gen = torch.Generator().manual_seed(spec.seed + 2)
    if spec.front == "conv":
        return torch.randn(batch, min(spec.in_features, 3), 5, 5, generator=gen)
    if not explicit:
        return None
    if spec.front == "linear":
        return torch.randn(batch, spec.in_features, generator=gen)
    return torch.randint(0, spec.in_features + 4, (batch, 3), generator=gen)


# ------------------------------------------------------------------ observing
_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
               "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
               "_load_state_dict_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_forward_hooks_always_called")


def snapshot(model: nn.Module) -> Dict[str, Any]:
    import torch.nn.modules.module as module_globals

    return {
        "state": {k: bits(v) for k, v in model.state_dict(keep_vars=True).items()},
        "objects": [(k, id(v)) for k, v in model.state_dict(keep_vars=True).items()],
        "training": [(n, m.training) for n, m in model.named_modules()],
        "requires_grad": [(n, q.requires_grad) for n, q in model.named_parameters()],
        "grads": [(n, bits(q.grad), id(q.grad) if q.grad is not None else None) for n, q in model.named_parameters()],
        "hooks": [(n, name, list(getattr(m, name).items())) for n, m in model.named_modules() for name in _HOOK_DICTS
                  if hasattr(m, name)],
        "global_hooks": [(name, list(getattr(module_globals, name).items())) for name in _GLOBAL_HOOKS
                         if hasattr(module_globals, name)],
        "rng": bits(torch.get_rng_state()),
        "grad_mode": torch.is_grad_enabled(),
        "default_dtype": torch.get_default_dtype(),
    }


def findings_key(report) -> List[Tuple[str, str, Any]]:
    def same(x: Optional[float]) -> Any:
        return "nan" if isinstance(x, float) and math.isnan(x) else x
    return [(f.code, f.module, same(f.value)) for f in report.findings]


# ------------------------------------------------------------------ the property
@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The models are tiny: intra-op threads only contend with each other (and with other jobs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _explored(examples: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The property's search: ``examples`` models from the strategies above, the same ones every run."""
    def decorate(test: Callable[..., None]) -> Callable[..., None]:
        if st is None:
            return pytest.mark.skip(reason="hypothesis is not installed (the dev extra)")(test)
        specs, perturbations = strategies()
        test = given(spec=specs, p=perturbations, batch=st.integers(2, 4), explicit=st.booleans(),
                     caller_grad=st.booleans(), caller_seed=st.integers(0, 2**31 - 1), logits=st.booleans())(test)
        test = settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(test)
        return pytest.mark.filterwarnings("ignore:Full backward hook is firing")(test)  # the user's own hook
    return decorate


@_explored(100)
def test_audit_changes_nothing_and_repeats(spec, p, batch, explicit, caller_grad, caller_seed, logits):
    """The fast tier's search: 100 models."""
    audit_changes_nothing_and_repeats(spec, p, batch, explicit, caller_grad, caller_seed, logits)


@pytest.mark.slow
@_explored(300)
def test_audit_changes_nothing_and_repeats_on_300_models(spec, p, batch, explicit, caller_grad, caller_seed, logits):
    audit_changes_nothing_and_repeats(spec, p, batch, explicit, caller_grad, caller_seed, logits)


def audit_changes_nothing_and_repeats(spec: "ModelSpec", p: Any, batch: int, explicit: bool, caller_grad: bool,
                                      caller_seed: int, logits: bool) -> None:
    model = build(spec)
    perturb(model, spec, p)
    inputs = example_inputs(spec, batch, explicit)
    inputs_before = bits(inputs) if inputs is not None else None
    torch.manual_seed(caller_seed)
    before = snapshot(model)
    with torch.set_grad_enabled(caller_grad):
        grad_mode = torch.is_grad_enabled()
        before["grad_mode"] = grad_mode
        deep_before = deep_state(model, inputs)
        first = initlint.audit(model, inputs, batch_size=batch, logits=logits, seed=spec.seed)
        after_first = snapshot(model), deep_state(model, inputs)
        second = initlint.audit(model, inputs, batch_size=batch, logits=logits, seed=spec.seed)
        after_second = snapshot(model), deep_state(model, inputs)
    assert first.error is None and first.probe.forward_ran
    for after, deep_after in (after_first, after_second):
        for key in before:
            assert after[key] == before[key], key
        for key in deep_before:
            assert deep_after[key] == deep_before[key], key
    assert (bits(inputs) if inputs is not None else None) == inputs_before
    assert findings_key(first) == findings_key(second)
    event(f"{spec.front} front, {first.capture} capture, backward {'ran' if first.probe.backward_ran else 'skipped'}")
    event(f"codes: {','.join(sorted({f.code for f in first.findings})) or 'none'}")
    event(f"stateful blocks: {','.join(sorted({b.stateful for b in spec.blocks if b.stateful})) or 'none'}")


def test_snapshot_notices_each_kind_of_change():
    """The property above would be vacuous if ``snapshot`` missed changes; it does not."""
    spec = ModelSpec("linear", 4, 3, (BlockSpec(False, False, "relu", False, "batch", False, True),), 2, False, 0)
    changes = [
        lambda m: m[1][1].running_mean.add_(1.0),
        lambda m: m[1][1].num_batches_tracked.add_(1),
        lambda m: setattr(m[0], "weight", nn.Parameter(m[0].weight.detach().clone())),
        lambda m: m[1].eval(),
        lambda m: m[0].bias.requires_grad_(False),
        lambda m: setattr(m[0].weight, "grad", torch.zeros_like(m[0].weight)),
        lambda m: m[2].register_forward_hook(lambda *a: None),
        lambda m: torch.rand(1),
        lambda m: torch.set_grad_enabled(not torch.is_grad_enabled()),
    ]
    for change in changes:
        model = build(spec)
        before = snapshot(model)
        grad_mode = torch.is_grad_enabled()
        try:
            change(model)
            assert snapshot(model) != before
        finally:
            torch.set_grad_enabled(grad_mode)


def test_deep_state_notices_each_kind_of_change():
    """``deep_state`` sees what ``snapshot`` does not: versions, attributes, containers, the other RNGs, modes."""
    import random

    try:
        import numpy
    except ImportError:  # not a dependency: its generator is checked where it is installed
        numpy = None

    def bump(t: torch.Tensor) -> None:
        set_version_counters([t], [t._version + 1])

    changes = [
        lambda m: bump(m[0].weight),
        lambda m: setattr(m[1], "steps", 1),
        lambda m: m[1].__dict__.setdefault("history", []).append(1),
        lambda m: m[1].register_buffer("cache", torch.ones(1), persistent=False),
        lambda m: random.random(),
        *([lambda m: numpy.random.random()] if numpy is not None else []),
        lambda m: torch.set_default_dtype(torch.float64),
        lambda m: torch.set_float32_matmul_precision("medium"),
    ]
    for change in changes:
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        before = deep_state(model)
        try:
            change(model)
            assert deep_state(model) != before
        finally:
            torch.set_default_dtype(torch.float32)
            torch.set_float32_matmul_precision("highest")


def _audited(name: str):
    make, inputs = CASES[name]
    model, x = make(), inputs()
    before = deep_state(model, x)
    report = initlint.audit(model, x)
    return model, x, before, report


@pytest.mark.filterwarnings("ignore::UserWarning")  # QAT observers and fx warn about the models, not the audit
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_forward_that_changes_state_changes_nothing(name):
    model, x, before, report = _audited(name)
    assert report.error is None and report.probe.forward_ran
    after = deep_state(model, x)
    for key in before:
        assert after[key] == before[key], key
    again = initlint.audit(model, x)
    assert findings_key(again) == findings_key(report)
    assert deep_state(model, x) == before


def test_the_forward_changed_state_inside_the_audit():
    """The cases are not vacuous: run plainly, each forward changes what the audit must keep."""
    for name, (make, inputs) in CASES.items():
        model, x = make(), inputs()
        before = deep_state(model, x)
        grad_mode, threads = torch.is_grad_enabled(), torch.get_num_threads()
        try:
            model.train()
            with _quiet():
                model(x)
            assert deep_state(model, x) != before, name
        finally:
            torch.set_grad_enabled(grad_mode)
            torch.set_default_dtype(torch.float32)
            torch.use_deterministic_algorithms(False)
            torch.set_float32_matmul_precision("highest")
            torch.set_num_threads(threads)


@contextmanager
def _quiet() -> Iterator[None]:
    """The models' own warnings (QAT observers, fx) are not under test here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), RuntimeError("boom")], ids=["interrupt", "error"])
def test_state_is_restored_when_the_forward_raises(exc):
    model, x = Interrupted(exc), torch.randn(4, 8)
    before = deep_state(model, x)
    with pytest.raises(KeyboardInterrupt if isinstance(exc, KeyboardInterrupt) else initlint.LoadError):
        initlint.audit(model, x)
    assert deep_state(model, x) == before


@pytest.mark.parametrize("name", ["eval_batchnorm", "block_clamp_parameter", "block_running_average",
                                  "spectral_norm_parametrization", "embedding_max_norm", "tied_and_renormalised",
                                  "prepare_qat"])
def test_a_graph_kept_across_the_audit_still_backpropagates(name):
    """``loss = m(x).sum(); audit(m, x); loss.backward()`` gives the gradients it gives without the audit."""
    make, inputs = CASES[name]
    grads = []
    for audit_between in (False, True):
        torch.manual_seed(0)
        model, x = make(), inputs()
        with _quiet():
            loss = model(x).float().sum()
            if audit_between:
                initlint.audit(model, x)
            loss.backward()
        grads.append([(n, bits(p.grad)) for n, p in model.named_parameters()])
    assert grads[0] == grads[1]


class _NoCopyOnWrite(nn.Module):
    """Fails as a kernel that mishandles copy-on-write tensors does (PyTorch's internal assert)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        if torch._C._is_cow_tensor(self.fc.weight):
            raise RuntimeError('ctx != nullptr INTERNAL ASSERT FAILED at "c10/core/impl/COW.cpp":124')
        return self.fc(x)


def test_a_kernel_refusing_copy_on_write_stand_ins_gets_plain_copies():
    model, x = _NoCopyOnWrite(), torch.randn(4, 8)
    before = deep_state(model, x)
    report = initlint.audit(model, x)
    assert report.probe.forward_ran and report.probe.backward_ran
    assert deep_state(model, x) == before


def _transformers(*names: str):
    tf = pytest.importorskip("transformers")
    return [getattr(tf, name) for name in names]


def _gpt2() -> nn.Module:
    GPT2Config, GPT2LMHeadModel = _transformers("GPT2Config", "GPT2LMHeadModel")

    return GPT2LMHeadModel(GPT2Config(n_layer=1))  # real width and vocabulary, tied output layer


def _bert() -> nn.Module:
    BertConfig, BertModel = _transformers("BertConfig", "BertModel")

    return BertModel(BertConfig(num_hidden_layers=1))


@pytest.mark.parametrize("make", [pytest.param(_gpt2, marks=pytest.mark.slow), _bert], ids=["gpt2", "bert"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_transformers_model_is_left_as_it_was_and_keeps_its_graph(make, mode):
    grads = []
    for audit_between in (False, True):
        torch.manual_seed(0)
        model = make().train(mode == "train")
        ids = {"input_ids": torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))}
        loss = model(**ids)[0].float().pow(2).mean()
        if audit_between:
            before = deep_state(model, ids)
            assert initlint.audit(model, ids).probe.forward_ran
            assert deep_state(model, ids) == before
        loss.backward()  # the graph built before the audit is intact
        grads.append([(n, bits(p.grad)) for n, p in model.named_parameters()])
    assert grads[0] == grads[1]


_QUEUED_SEED = """
import torch
import initlint
{prelude}
assert not torch.cuda.is_initialized()  # a fresh process: CUDA, where there is one, is not in use yet
tracker = torch.cuda._lazy_seed_tracker
torch.manual_seed(1234)  # queues the seed for CUDA, applied when it is first used
queued = [c for c in tracker.get_calls() if c]
assert queued
{audit}
assert [c for c in tracker.get_calls() if c] == queued
assert not torch.cuda.is_initialized()
print("ok")
"""


def assert_a_queued_seed_survives(prelude: str, audit: str) -> None:
    """Run ``prelude`` (it builds the model), queue a seed for CUDA, run ``audit`` (on the CPU) and check that
    the seed is still queued, in a process of its own: in this one CUDA may be in use already (on a machine
    with a GPU), and then torch applies a seed at once instead of queueing it."""
    tests = os.path.dirname(os.path.abspath(__file__))
    path = [os.path.dirname(tests), tests, os.environ.get("PYTHONPATH", "")]
    code = _QUEUED_SEED.format(prelude=prelude, audit=audit)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(path)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_seed_queued_for_an_accelerator_not_in_use_yet_survives_the_audit():
    assert_a_queued_seed_survives(
        "from initlint.rules.il014_init_not_applied import model_whose_declared_init_ran\n"
        "model, x = model_whose_declared_init_ran()  # its declared init is run again, on a copy, in a stream of its own",
        'initlint.audit(model, x, device="cpu")')
