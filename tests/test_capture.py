"""Capture backends: fx first, runtime for the rest; both feed the same graph model."""
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import initlint
from initlint.capture import FxCapture, RuntimeCapture, capture
from models import FunctionalNet, Untraceable, he_head, mlp


def test_fx_is_used_when_it_traces_and_runtime_otherwise():
    assert initlint.audit(mlp(2)).capture == "fx"
    report = initlint.audit(Untraceable())
    assert report.capture == "runtime"


def test_a_transformers_model_goes_to_the_runtime_capture_without_a_trace_attempt(monkeypatch):
    """fx cannot trace a ``PreTrainedModel`` (``**kwargs: Unpack[...]``, shape branches): no trace is tried, and
    no state guard is taken for one; a plain module and a module holding a transformers model still try fx."""
    pytest.importorskip("transformers")
    from transformers import BertConfig, BertModel

    from initlint.capture import fx as fx_capture
    from initlint.probe import guard

    torch.manual_seed(0)
    bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                vocab_size=50))
    traced, guards = [], []
    real_trace, real_enter = fx_capture._Tracer.trace, guard._Saved.__init__
    monkeypatch.setattr(fx_capture._Tracer, "trace", lambda self, root, *a, **k: traced.append(root) or real_trace(
        self, root, *a, **k))
    monkeypatch.setattr(guard._Saved, "__init__", lambda self, *a, **k: guards.append(1) or real_enter(self, *a, **k))
    ids = torch.randint(0, 50, (2, 8))
    report = initlint.audit(bert, {"input_ids": ids})
    assert report.capture == "runtime" and traced == [] and len(guards) == 1
    assert "PreTrainedModel" in fx_capture.untraceable(bert)
    with pytest.raises(initlint.capture.CaptureError, match="PreTrainedModel"):
        FxCapture(bert)

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids):
            return self.bert(input_ids).last_hidden_state

    assert fx_capture.untraceable(Wrapper()) is None and fx_capture.untraceable(mlp(2)) is None
    traced.clear()
    assert initlint.audit(Wrapper(), ids).capture == "runtime" and len(traced) == 1  # tried, and failed
    assert initlint.audit(mlp(2)).capture == "fx"


def test_both_backends_give_the_same_kinds_for_a_traceable_model():
    torch.manual_seed(0)
    model = FunctionalNet()
    x = torch.randn(8, 64)
    kinds = {}
    for backend in (FxCapture, RuntimeCapture):
        cap = backend(model)
        cap.run((x,), {}, lambda op, value: None)
        kinds[backend.name] = [(op.kind, op.module) for op in cap.graph if op.kind in ("linear", "relu")]
    assert kinds["fx"] == kinds["runtime"]
    assert [k for k, _ in kinds["fx"]] == ["linear", "relu"] * 3 + ["linear"]


def test_runtime_capture_links_inplace_ops_views_and_shared_modules():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            h = self.fc(x)
            h.relu_()
            h = h.view(h.shape[0], 4, 4).flatten(1)
            return self.fc(h)  # the same module twice

    cap = RuntimeCapture(Shared())
    cap.run((torch.randn(4, 16),), {}, lambda op, value: None)
    g = cap.graph
    linears = g.of_kind("linear")
    assert [op.module for op in linears] == ["fc", "fc"]
    relu = g.of_kind("relu")[0]
    assert g.producers(relu) == [linears[0]]
    # the second call reads the relu's output through the view and flatten
    path, current = [], linears[1]
    while current.inputs:
        current = g[current.inputs[0]]
        path.append(current.kind)
    assert path[:3] == ["view", "view", "relu"]


def test_weight_ops_are_recognised_by_what_they_compute():
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 16) * 0.1)
            self.wt = nn.Parameter(torch.randn(16, 8) * 0.1)
            self.k = nn.Parameter(torch.randn(4, 3, 3, 3) * 0.1)
            self.emb = nn.Parameter(torch.randn(10, 8))
            self.g = nn.Parameter(torch.ones(8))

        def forward(self, x, ids, img):
            a = F.linear(x, self.w)
            b = x @ self.wt
            c = F.conv2d(img, self.k)
            d = F.embedding(ids, self.emb)
            e = F.layer_norm(a + b, (8,), self.g)
            return e.sum() + c.sum() + d.sum()

    cap = RuntimeCapture(Functional())
    cap.run((torch.randn(2, 16), torch.randint(0, 10, (2, 3)), torch.randn(2, 3, 8, 8)), {}, lambda op, v: None)
    kinds = {(op.kind, op.params.get("weight")) for op in cap.graph if op.params}
    assert {("linear", "w"), ("linear", "wt"), ("conv", "k"), ("embedding", "emb"), ("layer_norm", "g")} <= kinds
    layouts = {op.params["weight"]: op.attrs["layout"] for op in cap.graph.of_kind("linear")}
    assert layouts == {"w": "out_in", "wt": "in_out"}


def test_handwritten_rmsnorm_counts_as_normalisation():
    class MyRMSNorm(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    layers = []
    for _ in range(12):
        lin = nn.Linear(32, 32)
        nn.init.normal_(lin.weight, std=0.001)  # the norm restores the scale (with zero bias,
        nn.init.zeros_(lin.bias)               # which would otherwise dominate the tiny product)
        layers += [lin, MyRMSNorm(32), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(32, 2))
    for backend in ("fx", "runtime"):
        cap = capture(model, order=(backend,))
        cap.run((torch.randn(4, 32),), {}, lambda op, v: None)
        assert len(cap.graph.of_kind("rms_norm")) == 12
    assert initlint.audit(model).clean


class FunctionalNorms(nn.Module):
    """Normalisations written as small functional ops inside one module (Qwen3-Next's gated RMSNorm and its
    gated delta rule's L2 normalisation of queries and keys are written so), and two that are not ones."""

    def __init__(self, width=32):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        h = self.proj(x)
        rms = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)  # RMS
        l2 = h.float() * torch.rsqrt((h * h).sum(dim=-1, keepdim=True) + 1e-6)  # L2, through a cast
        by_norm = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-6)  # L2, as a division
        normalize = F.normalize(h, dim=-1)
        by_power = h / torch.pow(torch.sum(torch.pow(h, 2), dim=-1, keepdim=True), 0.5)  # L2, as AIMv2 writes it
        by_other = h * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # another tensor's statistic
        by_mean = h * h.mean(-1, keepdim=True)  # a mean, not an inverse norm
        return rms + l2 + by_norm + normalize + by_power + by_other + by_mean


def test_normalisations_written_as_functional_ops_are_normalisations_in_both_backends():
    for backend, division in (("fx", "operator.truediv"), ("runtime", "Tensor.div")):
        cap = capture(FunctionalNorms(), order=(backend,))
        cap.run((torch.randn(4, 32),), {}, lambda op, v: None)
        multiply = "operator.mul" if backend == "fx" else "Tensor.mul"
        assert [op.target for op in cap.graph.of_kind("rms_norm")] == [multiply, multiply, division, "F.normalize",
                                                                                   division]
        statistic = [op for op in cap.graph if op.attrs.get("norm_statistic")]
        # pow, mean, add, rsqrt; mul, sum, add, rsqrt; norm, clamp_min; pow, sum, pow
        assert len(statistic) == 13, (backend, [op.target for op in statistic])


def test_wrappers_are_unwrapped_and_paths_are_the_users():
    torch.manual_seed(0)
    model = mlp(8)
    compiled = torch.compile(model)
    parallel = nn.DataParallel(model)
    for wrapped in (compiled, parallel):
        report = initlint.audit(wrapped)
        assert ("IL001", "0") in report.codes()
        assert report.model == "Sequential"


def test_inputs_as_tuple_dict_and_integer_ids():
    class KW(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            self.fc = nn.Linear(16, 4)

        def forward(self, input_ids, scale=None):
            h = self.emb(input_ids)
            return {"logits": self.fc(h if scale is None else h * scale)}

    model = KW()
    ids = torch.randint(0, 50, (4, 7))
    for inputs in ((ids,), {"input_ids": ids}, {"input_ids": ids, "scale": torch.tensor(2.0)}):
        report = initlint.audit(model, inputs, logits=True)
        assert report.error is None and report.probe.logits["classes"] == 4
    inferred = initlint.audit(model)  # probe inferred from the Embedding
    assert inferred.error is None


def test_inferred_probes_for_linear_conv_and_recurrent_models():
    for model in (mlp(1), nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), nn.Sequential(nn.Conv1d(2, 4, 3)),
                  nn.GRU(8, 8, batch_first=True)):
        assert initlint.audit(model).error is None
    with pytest.raises(initlint.LoadError, match="input-shape"):
        initlint.audit(nn.Sequential(nn.ReLU()))


def test_a_model_fx_traces_but_cannot_run_falls_back_to_runtime():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, *rest):
            return self.fc(x)

    report = initlint.audit(Odd(), torch.randn(3, 4))
    assert report.error is None and report.capture in ("fx", "runtime")


def test_untraceable_model_still_gets_graph_rules_and_inplace_relu_is_measured():
    healthy = initlint.audit(Untraceable())
    assert healthy.capture == "runtime"
    assert {(c, m) for c, m in healthy.codes()} == {("IL002", "conv")}
    dead = initlint.audit(Untraceable(dead_bias=-10.0))
    assert ("IL003", "") in dead.codes()  # the z.relu_() call in the model's own forward
    relu = next(op for op in dead.graph if op.kind == "relu" and op.target == "Tensor.relu_")
    assert dead.probe.ops[relu.id]["dead"] == dead.probe.ops[relu.id]["units"] == 64


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes(dtype):
    torch.manual_seed(0)
    healthy = he_head(mlp(4, width=64, init="he")).to(dtype)
    assert initlint.audit(healthy).clean
    bad = nn.Sequential(*[nn.Linear(64, 64) for _ in range(10)]).to(dtype)
    for layer in bad:
        nn.init.normal_(layer.weight)
    assert "IL001" in {c for c, _ in initlint.audit(bad).codes()}


def test_outputs_without_a_float_tensor_skip_the_backward_probe_with_a_note():
    class Argmax(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return {"label": self.fc(x).argmax(-1), "name": "text", "nothing": None}

    report = initlint.audit(Argmax(), torch.randn(3, 4))
    assert report.error is None and any("no floating-point tensor" in n for n in report.notes)


def test_lazy_modules_are_audited_on_a_copy_and_torchscript_gets_a_note():
    lazy = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 2))
    report = initlint.audit(lazy, torch.randn(4, 5))
    assert report.error is None and type(lazy[0]).__name__ == "LazyLinear"  # still lazy: not materialised
    scripted = torch.jit.script(nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
    report = initlint.audit(scripted, torch.randn(4, 8))
    assert report.error is None and any("TorchScript" in n for n in report.notes)


class _PositionalDropoutAttention(nn.Module):
    """Attention as transformers 4.x's ViT calls it: ``dropout_p`` given by position."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, 8)).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, None, 0.5 if self.training else 0.0)
        return self.out(attended.transpose(1, 2).flatten(-2))


def test_attention_dropout_given_by_position_is_turned_off_once():
    from initlint.capture.base import without_dropout

    q = torch.randn(1, 2, 4, 8)
    _, args, kwargs = without_dropout("scaled_dot_product_attention", (q, q, q, None, 0.5), {})
    assert args[4] == 0.0 and "dropout_p" not in kwargs
    _, args, kwargs = without_dropout("scaled_dot_product_attention", (q, q, q), {"dropout_p": 0.5})
    assert kwargs["dropout_p"] == 0.0
    torch.manual_seed(0)
    model = _PositionalDropoutAttention().train()
    report = initlint.audit(model, torch.randn(2, 5, 16))
    assert report.error is None and report.probe.forward_ran


def test_a_tensor_made_with_tensor_new_is_uninitialised_memory_not_a_signal():
    # torch 2.4's nn.init.orthogonal_ draws into `tensor.new(rows, cols)`: a model that initialised itself in
    # its forward got IL009 "first NaN ... in Tensor.new" whenever that garbage held a NaN (3-5 in 150 audits)
    class DrawsInForward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 64)

        def forward(self, x):
            w = x.new(64, 64)
            w.normal_(0, 64 ** -0.5)
            return self.fc(x @ w)

    report = initlint.audit(DrawsInForward(), torch.randn(4, 64))
    made = [op for op in report.graph if str(op.target).endswith(".new")]
    assert [op.kind for op in made] == ["empty"]
    assert all("norm" not in report.probe.ops.get(op.id, {}) for op in made)
    assert "IL009" not in {f.code for f in report.findings}


def test_a_plain_sequential_gets_the_graph_a_trace_would_give_without_tracing():
    from initlint.capture.fx import _sequential_graph, _Tracer

    plain = [nn.Sequential(*[nn.Linear(8, 8) if i % 2 == 0 else nn.ReLU() for i in range(10)]),
             nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2)),
             nn.Sequential(OrderedDict(stem=nn.Linear(4, 8), act=nn.GELU(), head=nn.Linear(8, 2)))]
    for model in plain:
        built = _sequential_graph(model, _Tracer())
        assert built is not None
        assert str(built) == str(_Tracer().trace(model))
        assert built.python_code("self").src == _Tracer().trace(model).python_code("self").src

    class Block(nn.Module):  # not a leaf: its forward is traced through
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return x + self.fc(x)

    class Subclass(nn.Sequential):
        def forward(self, x):
            return super().forward(x) * 2

    assert _sequential_graph(nn.Sequential(nn.Linear(8, 8), Block()), _Tracer()) is None
    assert _sequential_graph(Subclass(nn.Linear(8, 8)), _Tracer()) is None
    assert _sequential_graph(nn.Sequential(), _Tracer()) is None
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Block(), nn.ReLU())
    cap = capture(model)
    assert cap.name == "fx" and [op.module for op in cap.graph if op.kind == "linear"] == ["0", "1.fc"]


def test_a_plain_sequential_runs_its_children_in_turn_with_the_traced_graphs_ops_and_statistics(monkeypatch):
    """The graph and every statistic of a plain ``nn.Sequential`` run child by child (no fx graph, no
    interpreter) equal those of its symbolic trace run through the interpreter."""
    import dataclasses

    import initlint.capture.fx as fx_capture

    torch.manual_seed(0)
    cases = [(nn.Sequential(*[nn.Linear(16, 16) if i % 2 == 0 else nn.ReLU() for i in range(10)]), torch.randn(32, 16)),
             (nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(),
                            nn.Linear(8 * 6 * 6, 10)), torch.randn(4, 3, 8, 8)),
             (nn.Sequential(nn.Embedding(50, 16), nn.Tanh(), nn.Linear(16, 4)), torch.randint(0, 50, (4, 6)))]

    def described(report):
        ops = [(op.id, op.kind, op.target, op.module, op.inputs, op.params, op.attrs) for op in report.graph]
        figures = {(scope, key): dataclasses.asdict(stats) for scope in ("ops", "params", "grads")
                   for key, stats in getattr(report.probe, scope).items()}
        return ops, figures, [(f.code, f.module, f.message) for f in report.findings]

    for model, x in cases:
        direct = initlint.audit(model, x)
        assert FxCapture(model).steps is not None and FxCapture(model).fx_graph is None
        with monkeypatch.context() as patched:
            patched.setattr(fx_capture, "_plain_sequence", lambda model, tracer: None)  # traced instead
            assert FxCapture(model).steps is None
            traced = initlint.audit(model, x)
        assert direct.capture == traced.capture == "fx"
        assert described(direct) == described(traced)
