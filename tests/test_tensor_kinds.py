"""A model that runs is audited, whatever kinds of tensors it uses.

Complex parameters, sparse weights and sparse inputs, ``torch.vmap`` inside forward,
nested and quantized tensors, ``PackedSequence`` inputs: the audit measures what the
statistics apply to, names in a note what it skipped, audits the rest of the model, and
changes nothing. None of these may end in "this is a bug in initlint".
"""
from __future__ import annotations

import collections
import warnings
from typing import Any, Callable, Dict, Tuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import initlint
from model_state import deep_state


class ComplexWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8, dtype=torch.cfloat) / 8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc((x.to(torch.cfloat) @ self.w).abs())


class SparseWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8).to_sparse())
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(F.linear(x, self.weight))


class VmappedLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(torch.relu(torch.vmap(self.fc)(x)))


class GCN(nn.Module):
    """Two graph convolutions on a sparse adjacency matrix, as the PyTorch GCN example feeds it."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.l2 = nn.Linear(16, 4)

    def forward(self, x, adj):
        h = torch.relu(torch.sparse.mm(adj, self.l1(x)))
        return self.l2(torch.sparse.mm(adj, h))


class PackedLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(8, 16)
        self.fc = nn.Linear(16, 4)

    def forward(self, packed):
        if not isinstance(packed, nn.utils.rnn.PackedSequence):
            raise TypeError(f"expected a PackedSequence, got {type(packed).__name__}")
        _, (h, _) = self.rnn(packed)
        return self.fc(h[-1])


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)


class QuantDequant(nn.Module):
    """Fake-quantises an activation by hand: the quantized tensor sits between two Linears."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        q = torch.quantize_per_tensor(self.fc(x), 0.05, 0, torch.qint8)
        return self.out(torch.relu(q.dequantize()))


Pair = collections.namedtuple("Pair", "x scale")


class NamedTupleInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, pair):
        if not isinstance(pair, Pair):
            raise TypeError(f"expected a Pair, got {type(pair).__name__}")
        return self.fc(pair.x * pair.scale)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _adjacency(layout: str) -> torch.Tensor:
    dense = (torch.rand(6, 6, generator=_gen()) > 0.5).float() + torch.eye(6)
    return dense.to_sparse() if layout == "coo" else dense.to_sparse_csr()


def _packed() -> nn.utils.rnn.PackedSequence:
    return nn.utils.rnn.pack_padded_sequence(torch.randn(5, 3, 8, generator=_gen()), torch.tensor([5, 4, 2]))


def _dynamic_quantized() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        return torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)),
                                                      {nn.Linear}, dtype=torch.qint8)


def _nested(layout: torch.layout) -> torch.Tensor:
    return torch.nested.nested_tensor([torch.randn(3, 8, generator=_gen()), torch.randn(5, 8, generator=_gen())],
                                      layout=layout)


# name -> (model, inputs, parameters that must still be measured, kind a note must name (None: no note))
KINDS: Dict[str, Tuple[Callable[[], nn.Module], Callable[[], Any], Tuple[str, ...], Any]] = {
    "complex_parameter": (ComplexWeight, lambda: torch.randn(4, 8, generator=_gen()), ("fc.weight",), "complex"),
    "complex_model": (lambda: nn.Sequential(nn.Linear(8, 8, dtype=torch.cfloat)),
                      lambda: torch.randn(4, 8, dtype=torch.cfloat, generator=_gen()), (), "complex"),
    "sparse_weight": (SparseWeight, lambda: torch.randn(4, 8, generator=_gen()), ("fc.weight",), "sparse"),
    "vmap_in_forward": (VmappedLayer, lambda: torch.randn(4, 8, generator=_gen()), ("head.weight",), "torch.vmap"),
    "gcn_coo": (GCN, lambda: (torch.randn(6, 8, generator=_gen()), _adjacency("coo")), ("l1.weight", "l2.weight"),
                None),
    "gcn_csr": (GCN, lambda: (torch.randn(6, 8, generator=_gen()), _adjacency("csr")), ("l1.weight", "l2.weight"),
                None),
    "packed_in_tuple": (PackedLSTM, lambda: (_packed(),), ("fc.weight",), None),
    "packed_alone": (PackedLSTM, _packed, ("fc.weight",), None),
    "nested_jagged": (Head, lambda: _nested(torch.jagged), ("fc.weight",), "nested"),
    "nested_strided": (Head, lambda: _nested(torch.strided), ("fc.weight",), "nested"),
    "quantize_dequantize": (QuantDequant, lambda: torch.randn(4, 8, generator=_gen()), ("fc.weight", "out.weight"),
                            "quantized"),
    "dynamic_quantized": (_dynamic_quantized, lambda: torch.randn(4, 8, generator=_gen()), (), None),
    "named_tuple_input": (NamedTupleInput, lambda: Pair(torch.randn(4, 8, generator=_gen()), 2.0), ("fc.weight",),
                          None),
    "mapping_input": (Head, lambda: collections.UserDict(x=torch.randn(4, 8, generator=_gen())), ("fc.weight",), None),
}


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's own notices on quantized and nested tensors
@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_model_that_runs_is_audited(name):
    make, inputs, measured, skipped_kind = KINDS[name]
    model, x = make(), inputs()
    before = deep_state(model, x)
    report = initlint.audit(model, x)
    assert report.probe.forward_ran
    for param in measured:
        assert "rms" in report.probe.params.get(param, {}), (param, report.probe.params)
    skipped = [n for n in report.notes if n.startswith("not measured")]
    if skipped_kind is None:
        assert skipped == [], skipped
    else:
        assert len(skipped) == 1 and skipped_kind in skipped[0], report.notes
    assert not [f for f in report.findings if f.code == "IL000"]
    assert deep_state(model, x) == before


def test_skipped_ops_and_parameters_are_named():
    """The note names the op and the parameter it skipped, so the user knows what was not measured."""
    report = initlint.audit(ComplexWeight(), torch.randn(4, 8))
    note = next(n for n in report.notes if n.startswith("not measured"))
    assert "parameter 'w'" in note and "matmul" in note
    report = initlint.audit(SparseWeight(), torch.randn(4, 8))
    assert any("parameter 'weight'" in n for n in report.notes if n.startswith("not measured"))


def test_the_rest_of_a_model_with_a_skipped_part_is_still_judged():
    """A vanishing layer after a vmapped one is still found."""
    model = VmappedLayer()
    with torch.no_grad():
        model.head.weight.mul_(1e-4)
    codes = {(f.code, f.module) for f in initlint.audit(model, torch.randn(4, 8)).findings}
    assert ("IL001", "head") in codes, codes


def test_a_lazy_first_layer_without_an_input_is_a_clear_load_error():
    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(initlint.LoadError, match=r"LazyLinear at '0'.*--input-shape or example_inputs"):
        initlint.audit(model)
    report = initlint.audit(model, torch.randn(4, 5))
    assert report.probe.forward_ran and "0.weight" in report.probe.params


def test_non_finite_values_in_a_sparse_input_are_refused():
    adj = torch.tensor([[1.0, float("nan")], [0.0, 1.0]]).to_sparse()
    with pytest.raises(initlint.LoadError, match="NaN or Inf"):
        initlint.audit(GCN(), (torch.randn(2, 8), adj))


def test_an_audit_inside_inference_mode_still_runs_the_backward_probe():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with torch.inference_mode():
        report = initlint.audit(model, torch.randn(4, 8))
        assert torch.is_inference_mode_enabled()
    assert report.probe.backward_ran


def test_batch_of_one_on_an_eval_mode_batchnorm_model_says_why():
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2)).eval()
    with pytest.raises(initlint.LoadError) as info:
        initlint.audit(model, torch.randn(1, 8))
    message = str(info.value)
    assert "training mode" in message and "eval mode" in message and "batch of 2 or more" in message
    assert "matching" not in message and "\n" not in message


class _AlwaysOutOfMemory(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes")


def test_out_of_memory_on_the_cpu_does_not_suggest_the_cpu():
    with pytest.raises(initlint.LoadError) as info:
        initlint.audit(_AlwaysOutOfMemory(), torch.randn(2, 8))
    assert "on the CPU" in str(info.value) and "--device cpu" not in str(info.value)


def test_out_of_memory_with_a_packed_sequence_stops_instead_of_looping():
    """A packed batch cannot be halved: the audit says so at once rather than retrying forever."""

    class OutOfMemory(PackedLSTM):
        def forward(self, packed):
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes")

    with pytest.raises(initlint.LoadError, match="out of memory"):
        initlint.audit(OutOfMemory(), (_packed(),))
