"""No per-layer host-device synchronisation: the number of tensor -> host conversions an audit
makes does not grow with the model's depth.

Every way Python code can pull a tensor's value to the host is counted while one audit runs:
``item``, ``tolist``, ``cpu``, ``numpy`` and the ``__bool__``/``__float__``/``__int__``/
``__index__`` conversions (``if t:``, ``float(t)``, ``int(t)``, ``range(t)``). On a GPU each
one waits for all queued kernels, so one per layer would serialise the probe.
"""
from __future__ import annotations

import collections
import contextlib
from typing import Callable, Counter, Iterator

import pytest
import torch
import torch.nn as nn

import initlint

SYNCING = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


@contextlib.contextmanager
def counting_syncs() -> Iterator[Counter[str]]:
    counts: Counter[str] = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in SYNCING}

    def counted(name: str, method: Callable) -> Callable:
        def wrapper(self, *args, **kwargs):
            counts[name] += 1
            return method(self, *args, **kwargs)
        return wrapper

    for name, method in originals.items():
        setattr(torch.Tensor, name, counted(name, method))
    try:
        yield counts
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


def relu_mlp(depth: int, width: int = 16) -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 4))


class Block(nn.Module):
    """Norm, attention-like softmax, a bounded activation and a residual add: every kind of statistic."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.score = nn.Linear(width, width)
        self.fc = nn.Linear(width, width)
        self.act = nn.Tanh()

    def forward(self, x):
        weights = torch.softmax(self.score(self.norm(x)), dim=-1)
        return x + self.act(self.fc(weights * x))


def block_stack(depth: int, width: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), *[Block(width) for _ in range(depth)], nn.GELU(),
                         nn.Linear(width, 4))


def conv_stack(depth: int) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 8, 3, padding=1)]
    for _ in range(depth):
        layers += [nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)]
    return nn.Sequential(*layers)


def syncs(model: nn.Module, **options) -> Counter[str]:
    initlint.audit(model, **options)  # warm-up: one-off work (cached activation gains) is not per layer
    with counting_syncs() as counts:
        report = initlint.audit(model, **options)
    assert report.probe.forward_ran
    return counts


def test_counting_sees_a_host_conversion():
    with counting_syncs() as counts:
        t = torch.ones(3)
        bool(t.sum() > 0), t.tolist(), float(t[0]), t.cpu()
    assert counts["__bool__"] == 1 and counts["tolist"] == 1 and counts["__float__"] == 1 and counts["cpu"] == 1


def test_relu_mlp_syncs_do_not_grow_with_depth():
    shallow, deep = syncs(relu_mlp(5)), syncs(relu_mlp(50))
    assert deep == shallow, (shallow, deep)
    assert sum(deep.values()) <= 4, deep


def test_forward_only_audit_syncs_do_not_grow_with_depth():
    shallow = syncs(relu_mlp(5), select=["IL003"])
    deep = syncs(relu_mlp(50), select=["IL003"])
    assert deep == shallow, (shallow, deep)


def test_blocks_with_norm_softmax_and_tanh_do_not_grow_with_depth():
    shallow, deep = syncs(block_stack(2), logits=True), syncs(block_stack(20), logits=True)
    assert deep == shallow, (shallow, deep)


def test_conv_batchnorm_stack_does_not_grow_with_depth():
    shallow, deep = syncs(conv_stack(2)), syncs(conv_stack(12))
    assert deep == shallow, (shallow, deep)


def test_runtime_capture_does_not_grow_with_depth():
    class Branchy(nn.Module):
        def __init__(self, depth: int) -> None:
            super().__init__()
            self.body = relu_mlp(depth)

        def forward(self, x):
            if x.sum() > 0:  # data-dependent: fx cannot trace it
                x = -x
            return self.body(x)

    shallow, deep = Branchy(5), Branchy(50)
    x = torch.randn(16, 16)
    assert initlint.audit(shallow, x).capture == "runtime"
    # the model's own `if x.sum() > 0` is one __bool__ per forward; none come from initlint per layer
    assert syncs(deep, example_inputs=x) == syncs(shallow, example_inputs=x)


# ---------------------------------------------------------------- every kind of host synchronisation
from host_syncs import HostSyncs  # noqa: E402


def test_host_syncs_counts_reads_data_dependent_ops_and_copies_of_host_tensors():
    device = torch.device("cpu")  # the audit's device, as the probe names it
    on_device = torch.randn(8, device=device)
    with HostSyncs() as syncs:
        on_device.sum().item()
        on_device[on_device > 0]  # a boolean index: its size depends on the values
        torch.nonzero(on_device)
        torch.randn(8).to(device)  # drawn on the host, then copied
        torch.tensor([1.0, 2.0], device=device)  # host data, copied
        on_device[[0, 2]]  # a list index: copied to the device first
        on_device[[1, 3]] = 0.0
        on_device[torch.arange(2)] += 1  # a host tensor as the index, read then written: two copies
    assert syncs.count == 9, syncs.events
    with HostSyncs() as none:
        gen = torch.Generator(device=device).manual_seed(0)
        drawn = torch.randn(8, generator=gen, device=device)
        (drawn * on_device).to(torch.float64)
        torch.zeros(3, device=device)
        on_device[2:5] = 1.0  # slices and integers index without a copy
        on_device[torch.arange(2, device=device)]  # an index made on the device
    assert none.count == 0, none.events


def _own_syncs(model: nn.Module, inputs) -> int:
    """Host synchronisations of one audit less those of the model's own forward and backward."""
    args, kwargs = inputs
    out = model(*args, **kwargs)
    out = out if isinstance(out, torch.Tensor) else out[0]
    cotangent = torch.randn(out.shape)
    initlint.audit(model, kwargs or args[0])  # warm-up
    with HostSyncs() as plain:
        out = model(*args, **kwargs)
        out = out if isinstance(out, torch.Tensor) else out[0]
        torch.autograd.grad([out], [p for p in model.parameters()], [cotangent], allow_unused=True)
    with HostSyncs() as audited:
        initlint.audit(model, kwargs or args[0])
    return audited.count - plain.count


@pytest.mark.slow  # 30 s: each op of a counted audit passes two Python modes
def test_gpt2_audit_makes_as_many_host_syncs_at_12_as_at_32_layers_and_at_most_8():
    transformers = pytest.importorskip("transformers", reason="GPT-2 is built from transformers' config")
    transformers.logging.set_verbosity_error()

    def gpt2(depth: int) -> nn.Module:
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=depth, n_embd=32, n_head=2,
                                                                    vocab_size=300, n_positions=32))

    ids = ((), {"input_ids": torch.randint(0, 300, (2, 8), generator=torch.Generator().manual_seed(0))})
    shallow, deep = _own_syncs(gpt2(12), ids), _own_syncs(gpt2(32), ids)
    assert shallow == deep <= 8, (shallow, deep)


def test_transformer_audit_makes_as_many_host_syncs_at_12_as_at_32_layers():
    def transformer(depth: int) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 16, batch_first=True), depth,
                                                   enable_nested_tensor=False), nn.Linear(16, 4))

    x = ((torch.randn(1, 4, 16),), {})
    shallow, deep = _own_syncs(transformer(12), x), _own_syncs(transformer(32), x)
    assert shallow == deep <= 8, (shallow, deep)
