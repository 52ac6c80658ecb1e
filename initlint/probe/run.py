"""Stage 3, probe: one forward (and optionally one backward) pass of the probe batch.

Statistics are computed on the fly, op by op, as small device scalars; activations
are never kept. Everything is moved to the host in a single transfer at the end, so
the probe adds no per-layer host-device synchronisation.

The probe runs inside :func:`initlint.probe.guard.guarded`, which leaves the model exactly as
it was found; the backward probe runs the autograd engine as ``torch.autograd.grad`` does
(:func:`~initlint.capture.base.grad_without_dropout`), so no ``.grad`` is touched.

This module holds the per-op observer, the weights' and gradients' summaries and the run itself; the
collector that queues every statistic for the one transfer is :mod:`~initlint.probe.collector`. Three families of statistics live beside it: :mod:`~initlint.probe.rows` (what is read from
sampled rows: attention per head, softmax and logits, token similarity), :mod:`~initlint.probe.products`
(weight gradients from the products that use the weight) and :mod:`~initlint.probe.duplicates` (units
that copy another unit of their layer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

import torch
import torch.nn as nn

from ..capture import ops as O
from ..capture import Capture
from ..capture.base import grad_without_dropout, in_reentrant_checkpoint
from ..capture.nested import tensors as _tensors
from ..capture.graph import Graph, Op
from . import draw
from .collector import _Collector, _derive
from .duplicates import (Units, confirm_duplicates, duplicate_rows_all,
                         queue_candidates)
from .products import _by_products, _product, _product_grads
from .rows import LEAD_TOKENS, logit_rows, put_attention, put_softmax, put_token_cosine, sample_rows
from .stats import OpStats, ParamStats, SoftmaxStats, TensorStats

SATURATION_MARGIN = 0.01
"""An output within 1% of the activation's range from a bound counts as saturated
(|tanh| > 0.98, sigmoid < 0.01 or > 0.99)."""

_NO_STATS = frozenset({"view", "dropout", "identity", "empty"})
"""Ops whose output says nothing about the signal (an ``empty`` tensor holds whatever was in memory)."""
TOKEN_KINDS = O.NORM_KINDS | {"add", "attention", "linear", "embedding", "input"}
"""Ops whose token vectors IL013 may compare: the residual stream (adds), norms, attention and
projections; :func:`put_token_cosine` runs on their 3-D outputs."""


def unusual_kind(t: torch.Tensor) -> Optional[str]:
    """What makes ``t`` a tensor the statistics do not measure (None for a plain dense real tensor).

    Sparse, nested and quantized tensors lack the reductions the statistics use or would be
    measured on their stored values only; complex tensors have no order (no extremes);
    tensors inside ``torch.vmap`` or another ``torch.func`` transform cannot be reduced outside it."""
    if torch._C._functorch.is_functorch_wrapped_tensor(t):
        return "torch.vmap" if torch._C._functorch.is_batchedtensor(t) else "torch.func-transformed"
    if t.is_nested:
        return "nested"
    if t.layout != torch.strided:
        return "sparse" if t.is_sparse or t.layout in _SPARSE_LAYOUTS else str(t.layout).replace("torch.", "")
    if t.is_quantized:
        return "quantized"
    if t.is_complex():
        return "complex"
    return None


_SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


@dataclass
class ProbeResult:
    """Host-side statistics of one probe run: typed records (:mod:`initlint.probe.stats`) once sealed."""

    ops: Dict[int, Any] = field(default_factory=dict)
    """Per op: an :class:`~initlint.probe.stats.OpStats` (scale and extremes of its output; dead units,
    saturation, softmax rows, attention and token statistics where they apply)."""
    params: Dict[str, Any] = field(default_factory=dict)
    """Per weight of a Linear/Conv layer, and per bias: a :class:`~initlint.probe.stats.ParamStats`."""
    grads: Dict[str, Any] = field(default_factory=dict)
    """Per weight parameter: a :class:`~initlint.probe.stats.TensorStats` of its gradient under the backward probe."""
    logits: Optional[Any] = None
    """A :class:`~initlint.probe.stats.SoftmaxStats` of the model output when it is logits (declared, or
    certain from the output: see :func:`logits_output`)."""
    logits_op: Optional[int] = None
    """The op that produced the logits, when the capture knows it."""
    shapes: Dict[int, Tuple[int, ...]] = field(default_factory=dict)
    """Per op: the shape of its (first) output tensor in the probe's forward pass."""
    discrete: Set[int] = field(default_factory=set)
    """Ops whose output holds no floating-point tensor: ids, indices, masks (an argmax, a codebook's codes)."""
    untracked: Set[int] = field(default_factory=set)
    """Ops the model ran with autograd off (a ``torch.no_grad`` block or decorator of its own) in a forward
    that records gradients: the model's loss sends them no gradient, whatever trains them is not probed.
    The fx capture marks the nodes it traced inside such a block and replays them so."""
    forward_ran: bool = False
    backward_ran: bool = False
    notes: List[str] = field(default_factory=list)
    drawn: Dict[str, Any] = field(default_factory=dict)
    """A streamed audit (the tensors are released after it): per parameter, the statistics of the values its
    init gave it, for comparing with the model's declared init (IL014)."""
    on_request: Dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    """Weights measured without their extremes (neither zero nor constant): taken when a rule asks."""

    def seal(self) -> "ProbeResult":
        """Turn the collected dictionaries into typed records (once; a no-op afterwards)."""
        for table, record in ((self.ops, OpStats), (self.params, ParamStats), (self.grads, TensorStats)):
            for key, stats in table.items():
                if isinstance(stats, dict):
                    table[key] = record.from_dict(stats)
        for name, weight in self.on_request.items():
            if name in self.params:
                self.params[name].extremes_from(weight)
        self.on_request = {}
        if isinstance(self.logits, dict):
            self.logits = SoftmaxStats.from_dict(self.logits)
        return self

    def release(self) -> "ProbeResult":
        """Drop the references to the weights whose extremes no rule asked for (the rules have run: a
        report keeps no tensor of the audited model alive)."""
        for stats in self.params.values():
            if isinstance(stats, ParamStats):
                stats.extremes_from(None)
        return self


class StatsObserver:
    """Computes per-op statistics during the forward pass (called by the capture)."""

    def __init__(self, graph_of: Any, collector: _Collector) -> None:
        self.graph_of = graph_of
        self.c = collector

    def __call__(self, op: Op, value: Any) -> None:
        t = value if isinstance(value, torch.Tensor) else next(
            (v for v in _tensors(value) if v.is_floating_point()), None)
        if t is None:
            return
        unusual = unusual_kind(t)
        if unusual is not None:
            if unusual in ("sparse", "quantized", "complex"):
                self.c.shapes[op.id] = tuple(t.shape)
            if op.kind not in _NO_STATS and op.kind != "input":
                self.c.skip(unusual, _op_label(op))
            return
        self.c.shapes[op.id] = tuple(t.shape)
        if self.c.tracking and not torch.is_grad_enabled():
            (self.c.checkpointed if in_reentrant_checkpoint() else self.c.untracked).add(op.id)
        if not t.is_floating_point():
            self.c.discrete.add(op.id)
        if op.kind in _NO_STATS or not t.is_floating_point() or t.numel() == 0:
            return
        y = t.detach()
        # Scale as root mean square: the norm here, divided by sqrt(numel) on the host (an
        # arithmetic op with a Python number costs more than the reduction on small tensors).
        self.c.put("ops", op.id, "norm", torch.linalg.vector_norm(y, dtype=_acc(y)))
        self.c.const("ops", op.id, "numel", float(y.numel()))
        if op.kind in O.DYING_KINDS and y.dim() >= 2:
            self._dead(op, y)  # also measures the largest value
        elif op.kind in O.EXTREMA_KINDS:  # elsewhere a NaN still shows in the norm, and an Inf may be a mask
            # NaN propagates through amin/amax, so non-finite outputs show up here
            low, high = torch.aminmax(y)
            self.c.put("ops", op.id, "low", low)
            self.c.put("ops", op.id, "high", high)
        act = O.ACTIVATIONS.get(op.kind)
        if act is not None and act.bounds is not None:
            self._saturated(op, y, act.bounds)
        if op.kind in ("softmax", "log_softmax"):
            put_softmax(self.c, "ops", op.id, y, op.attrs.get("dim", -1), log=op.kind == "log_softmax")
        if y.dim() in (2, 3):
            self._lead(op, y)
        if y.dim() == 3 and op.kind in TOKEN_KINDS and y.shape[-1] >= 16:
            self._tokens(op, y)

    def weight_product(self, op: Op, x: Any, y: Any, lookup: bool = False, padding: Optional[int] = None,
                       conv: Optional[O.Conv] = None) -> None:
        """Called by the capture after an op that computes ``y = x @ w`` (plus a bias) with its weight ``w``
        or a view holding each of its entries once (:func:`~initlint.capture.ops.product_operands`), that
        looks up the rows ``x`` of ``w`` (``lookup``, :func:`~initlint.capture.ops.lookup_operands`), or that
        convolves ``x`` with ``w`` (``conv``, :func:`~initlint.capture.ops.conv_operands`): keeps ``x`` and
        the gradient edge of ``y``, from which the backward probe measures ``w``'s gradient without
        forming it (:func:`_product_grads`)."""
        name = op.params.get("weight")
        if self.c.products is not None and name is not None:
            product = _product(name, x, y, self.c.named.get(name), lookup, padding, conv)
            if product is not None:
                self.c.products[op.id] = product

    def attention(self, op: Op, call: O.AttentionCall) -> None:
        """Called by the capture with the inputs of an attention op (after the op itself)."""
        put_attention(self.c, op.id, call)

    def _first_input(self) -> Optional[Tuple[int, ...]]:
        graph = self.graph_of()
        return self.c.shapes.get(graph.inputs[0]) if graph.inputs else None

    def _batch_first(self, y: torch.Tensor, first: Optional[Tuple[int, ...]] = None) -> bool:
        """Whether a 3-D output is ``(batch, tokens, features)``: the batch axis is the one whose size is
        the probe batch's (axis 0 when both are); ``first``: the first input's shape, when known."""
        first = first or self._first_input()
        batch = first[0] if first else None
        return not (y.shape[1] == batch and y.shape[0] != batch)

    def _tokens(self, op: Op, y: torch.Tensor) -> None:
        """Token similarity of a ``(batch, tokens, features)`` output. A model fed token ids that pads its
        sequence itself (Longformer to a multiple of its 512-token window) is measured on the first as
        many positions as the ids have: its own padding positions are one vector repeated, masked out of
        attention, and at 16 tokens they were 496 of 512 (mean cosine 0.97 after the first block)."""
        first = self._first_input()
        batch_first = self._batch_first(y, first)
        if first is not None and len(first) == 2 and y.shape[1 if batch_first else 0] > first[1] > 1:
            y = y.narrow(1 if batch_first else 0, 0, first[1])
        put_token_cosine(self.c, op.id, y, batch_first)

    def _lead(self, op: Op, y: torch.Tensor) -> None:
        """The norm over the first :data:`LEAD_TOKENS` positions of a sequence longer than that: a 3-D
        output whose token axis has the length of the first input's second axis (a ``(batch, tokens)``
        or ``(batch, tokens, features)`` input), or a 2-D one whose rows are the ``batch x tokens``
        positions of a ``(batch, tokens)`` input in order (a block that flattens its tokens, as OPT's MLP
        does)."""
        first = self._first_input()
        if first is None or len(first) < 2 or first[1] <= LEAD_TOKENS:
            return  # no (batch, tokens, ...) input, or a sequence no longer than the leading positions
        if y.dim() == 2:
            if len(first) != 2 or y.shape[0] != first[0] * first[1]:
                return
            y = y.view(first[0], first[1], -1) if y.is_contiguous() else y.reshape(first[0], first[1], -1)
        axis = 1 if self._batch_first(y, first) else 0
        if y.shape[axis] == first[1]:  # the input's token axis (not channels, not another length)
            lead = y.narrow(axis, 0, LEAD_TOKENS)
            self.c.put("ops", op.id, "lead_norm", torch.linalg.vector_norm(lead, dtype=_acc(y)))
            self.c.const("ops", op.id, "lead_numel", float(lead.numel()))

    def _dead(self, op: Op, y: torch.Tensor) -> torch.Tensor:
        """ReLU-family outputs are >= 0: a unit is dead when its largest output over the batch is 0.
        Returns the per-unit maxima."""
        axis = self.graph_of().unit_axis(op) % y.dim()
        units = y.shape[axis]
        peaks = y.amax(dim=[d for d in range(y.dim()) if d != axis])  # NaN stays NaN: counted alive
        self.c.const("ops", op.id, "unit_axis", float(axis))
        self.c.put("ops", op.id, "alive", torch.count_nonzero(peaks))
        self.c.const("ops", op.id, "units", float(units))
        self.c.put("ops", op.id, "high", peaks.amax())
        self.c.const("ops", op.id, "low", 0.0)
        return peaks

    def _saturated(self, op: Op, y: torch.Tensor, bounds: Tuple[float, float]) -> None:
        lo, hi = bounds
        centre, reach = (lo + hi) / 2, (hi - lo) / 2 - SATURATION_MARGIN * (hi - lo)
        centred = y if centre == 0 else y - centre
        self.c.put("ops", op.id, "saturated_count", torch.count_nonzero(centred.abs() > reach))


def _op_label(op: Op) -> str:
    return f"{op.target} in '{op.module}'" if op.module else op.target


def primary_output(out: Any) -> Optional[torch.Tensor]:
    """The tensor that stands for the model's prediction: ``logits``, else the first float tensor."""
    if isinstance(out, dict) or hasattr(out, "keys"):
        for key in ("logits", "prediction_logits", "last_hidden_state"):
            try:
                value = out[key]
            except (KeyError, TypeError, IndexError):
                continue
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                return value
    return next((t for t in _tensors(out) if t.is_floating_point()), None)


def _acc(t: torch.Tensor) -> torch.dtype:
    """Accumulate half precision in float32; float32 and float64 in their own type."""
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def summarise(c: _Collector, scope: str, tensors: List[Tuple[str, torch.Tensor]], *, mean: bool,
              rows: bool = False, extremes: bool = True) -> None:
    """Per tensor: ``rms``, ``low`` and ``high`` unless ``extremes`` is False (and ``mean``;
    duplicate-unit candidates for weights).

    Reductions run in place, without copies; the norms of all tensors of one dtype and device
    come from one fused call. std, absmax and spread are derived on the host (:func:`_derive`)."""
    for items in _grouped(tensors, lambda t: (t.dtype, t.device)):
        names = [n for n, _ in items]
        values = [t for _, t in items]
        acc = _acc(values[0])
        norms = torch.stack(torch._foreach_norm(values, 2, dtype=acc))
        c.put_many(scope, names, "norm", norms)
        if scope == "params" and not extremes:
            c.candidates.update((n, zero) for n, zero in zip(names, (norms == 0).unbind()) if n in c.weights)
        for name, t in items:
            c.const(scope, name, "numel", float(t.numel()))
            if mean:
                c.put(scope, name, "mean", t.mean(dtype=acc))
            if extremes:
                low, high = torch.aminmax(t)
                c.put(scope, name, "low", low)
                c.put(scope, name, "high", high)
        if rows:
            duplicate_rows_all(c, scope, [(n, t) for n, t in items if t.dim() >= 2])


def _grouped(tensors: List[Tuple[str, torch.Tensor]], key: Any) -> List[List[Tuple[str, torch.Tensor]]]:
    """``(name, detached tensor)`` pairs in groups of equal ``key(tensor)``, in first-seen order."""
    groups: Dict[Any, List[Tuple[str, torch.Tensor]]] = {}
    for name, t in tensors:
        groups.setdefault(key(t), []).append((name, t.detach()))
    return list(groups.values())


def confirm_extremes(c: _Collector, result: Optional[ProbeResult] = None) -> None:
    """``low`` and ``high``, taken exactly, of the weights measured without extremes that may be zero
    (norm 0) or constant (every unit's keys alike); the others are known to be neither. Two transfers,
    the flags and the candidates' extremes, whatever the depth. Without ``result`` (a streamed block,
    whose weights are freed before the one transfer) the extremes join the collector's values."""
    names = list(c.candidates)
    if result is None:
        flags = torch.stack([c.candidates[n] for n in names]).tolist() if names else []
    else:  # the flags came with the one transfer (:func:`queue_candidates`)
        flags = [result.params.get(n, {}).pop("maybe_flat", 0.0) for n in names]
    weights, c.weights, c.candidates = c.weights, {}, {}
    wanted = [n for n, flag in zip(names, flags) if flag]
    if result is not None:
        result.on_request.update((n, weights[n]) for n, flag in zip(names, flags) if not flag)
    if not wanted:
        return
    with torch.no_grad():
        host = torch.stack([torch.stack(list(torch.aminmax(weights[n]))).double() for n in wanted]).tolist()
    for name, (low, high) in zip(wanted, host):
        if result is None:
            c.const("params", name, "low", low)
            c.const("params", name, "high", high)
        else:
            stats = result.params[name]
            stats["low"], stats["high"] = low, high
            _derive(stats)


def confirm_overflow(c: _Collector, result: ProbeResult) -> None:
    """A gradient from products whose norm or mean is not finite (the signal overflowed) is formed from the
    kept inputs and output gradients, as autograd forms it, and measured as formed gradients are: the Gram
    products of huge or infinite values give NaN (``inf - inf``) where the formed gradient's float32 norm
    is inf, and the reverse. Runs on the host after the one transfer, only for such weights."""
    for name, pairs in c.overflow.items():
        stats = result.grads.get(name, {})
        if all(math.isfinite(stats.get(k, 0.0)) for k in ("rms", "mean")):
            continue
        w = c.named[name]
        fan_in, fan_out = pairs[0][0].fan_in, pairs[0][0].fan_out
        with torch.no_grad():
            grad = torch.zeros(fan_in, fan_out, dtype=w.dtype, device=w.device)  # the gradient, as (fan_in, fan_out)
            for p, g in pairs:
                if p.lookup:
                    ids, rows = p.x.reshape(-1), g.reshape(-1, fan_in).to(w.dtype)
                    if p.padding is not None:
                        ids, rows = ids[ids != p.padding], rows[ids != p.padding]
                    grad.mT.index_add_(0, ids, rows)
                else:
                    x, dy = p.rows_of(g)
                    grad += x.to(w.dtype).mT @ dy.to(w.dtype)
            acc = _acc(grad)
            host = torch.stack([torch.linalg.vector_norm(grad, dtype=acc), grad.mean(dtype=acc)]).tolist()
        fresh = {"norm": host[0], "mean": host[1], "numel": float(w.numel())}
        _derive(fresh)
        result.grads[name] = fresh
    c.overflow = {}


def _param_stats(c: _Collector, params: List[Tuple[str, torch.Tensor]],
                 units: Optional[Dict[str, Units]] = None, extremes: bool = True) -> None:
    """Weights: scale, duplicated units, and extremes (without ``extremes``: only for the weights that
    may be zero or constant, see :func:`confirm_extremes`). Biases: the mean (IL003 names a large
    negative bias) and the rms (an all-zero bias adds nothing: IL001 and IL005 read a layer with one as
    a rescale of its input)."""
    weights = [(n, p) for n, p in params if p.dim() >= 2]
    biases = [(n, p) for n, p in params if p.dim() < 2]
    c.units = units or {}
    c.pending = []
    c.weights = {} if extremes else {n: p for n, p in weights}
    # Two key directions per unit and one entry each for the bias: one vector serves every layer.
    c.longest_row = 2 * (max((p[0].numel() for _, p in weights), default=0) + 1)
    summarise(c, "params", weights, mean=False, rows=True, extremes=extremes)
    for items in _grouped(biases, lambda b: (b.shape, b.dtype, b.device)):
        stack = torch.stack([b for _, b in items]).reshape(len(items), -1)
        c.put_many("params", [n for n, _ in items], "mean", stack.mean(dim=1, dtype=_acc(stack)))
        c.put_many("params", [n for n, _ in items], "rms",
                   torch.linalg.vector_norm(stack, dim=1, dtype=_acc(stack)) / math.sqrt(max(stack.shape[1], 1)))


def weight_units(graph: Graph, model: nn.Module, named: Dict[str, torch.Tensor],
                 shapes: Dict[int, Tuple[int, ...]]) -> Dict[str, Units]:
    """Per weight of a Linear/Conv op: its layout, its bias and its convolution groups."""
    out: Dict[str, Units] = {}
    modules: Optional[Dict[str, nn.Module]] = None
    for op in graph:
        name = op.params.get("weight")
        if op.kind not in O.WEIGHT_KINDS or name not in named or name in out:
            continue
        groups = 1
        if op.kind == "conv":
            modules = dict(model.named_modules()) if modules is None else modules
            groups = _conv_groups(op, modules.get(op.module), named[name], shapes)
        bias = named.get(op.params.get("bias", ""))
        if bias is None and op.kind == "linear":  # a conv's separate bias would broadcast over a spatial axis
            bias = _added_bias(graph, op, named)
        out[name] = Units(op.attrs.get("layout", "out_in"), bias, groups)
    return out


def _added_bias(graph: Graph, op: Op, named: Dict[str, torch.Tensor]) -> Optional[torch.Tensor]:
    """A bias added by a separate op (``x @ W + b``): a 1-D parameter of an ``add`` that consumes ``op``."""
    for user in graph.consumers(op):
        if user.kind == "add":
            for pname in user.params.values():
                p = named.get(pname)
                if p is not None and p.dim() == 1:
                    return p
    return None


def _conv_groups(op: Op, module: Optional[nn.Module], w: torch.Tensor, shapes: Dict[int, Tuple[int, ...]]) -> int:
    """The module's ``groups``, else input channels / the weight's channels per group (a functional conv)."""
    if isinstance(module, nn.modules.conv._ConvNd) and module.weight is w:
        return int(module.groups)
    shape = shapes.get(op.inputs[0]) if op.inputs else None
    if not shape or len(shape) < w.dim() - 1:
        return 1
    channels = shape[1] if len(shape) == w.dim() else shape[0]  # batched (N, C, ...) or unbatched (C, ...)
    return max(int(channels) // int(w.shape[1]), 1)


def used_params(graph: Graph) -> List[str]:
    """Names of the parameters of the weight layers (Linear, Conv): the ones the rules judge."""
    return list(dict.fromkeys(name for op in graph if op.kind in O.WEIGHT_KINDS for name in op.params.values()))


def run_probe(cap: Capture, args: Tuple[Any, ...], kwargs: Dict[str, Any], *, logits: Optional[bool] = False,
              backward: bool = True, forward: bool = True, step: Optional[Any] = None) -> ProbeResult:
    """Run the probe through ``cap`` and return host-side statistics.

    With ``forward=False`` only the static parameter statistics are computed (for models whose
    tensors hold no data, such as models on the ``meta`` device). ``logits``: True, the output
    is logits; False, it is not; None, it is when that is certain (see :func:`logits_output`).
    ``step``: a :class:`~initlint.probe.step.StepRequest`; the backward probe then differentiates the
    training loss with respect to every parameter that requires grad, and leaves the gradients on it.
    """
    result = ProbeResult()
    c = _Collector()
    named = dict(cap.model.named_parameters())
    if forward:
        observer = StatsObserver(lambda: cap.graph, c)
        grad_wanted = backward and any(p.requires_grad for p in named.values())
        c.named = named
        c.tracking = grad_wanted
        c.products = {} if grad_wanted and step is None else None
        with torch.set_grad_enabled(grad_wanted):
            out = cap.run(args, kwargs, observer)
            cap.finish()  # the graph is complete: read-only from here on
            result.forward_ran = True
            main = primary_output(out)
            if main is not None and unusual_kind(main) is not None:
                result.notes.append(f"the model output is a {unusual_kind(main)} tensor: the output statistics "
                                    f"and the backward probe were skipped")
                main, grad_wanted = None, False
            put_logits(c, cap, out, main, logits, result)
            loss = None
            if step is not None and grad_wanted and main is not None:
                from .step import objective

                loss = objective(step, out, main, logits_output(out, main, cap, logits), args, kwargs)
            if grad_wanted:
                _backward(cap, named, main, c, result, step, loss)
                _note_checkpointed(cap, c, result)
            c.products = None  # the products' inputs are not kept past the backward probe
            del loss
            del out, main
    cap.finish()
    params = [(n, named[n]) for n in used_params(cap.graph) if n in named]
    params = [(n, p) for n, p in params if _measurable(c, n, p) and p.numel() > 0 and p.device.type != "meta"]
    _param_stats(c, params, weight_units(cap.graph, cap.model, named, c.shapes), extremes=False)
    queue_candidates(c)
    c.finish(result)
    confirm_duplicates(c, result)
    confirm_extremes(c, result)
    confirm_overflow(c, result)
    result.notes.extend(c.skip_notes())
    return result.seal()


def _measurable(c: _Collector, name: str, t: torch.Tensor) -> bool:
    """A dense real floating-point tensor; other kinds are noted as skipped (integer ones silently)."""
    kind = unusual_kind(t)
    if kind is not None:
        c.skip(kind, f"parameter '{name}'")
        return False
    return t.is_floating_point()


def logits_output(out: Any, main: Optional[torch.Tensor], cap: Capture, logits: Optional[bool]) -> Optional[torch.Tensor]:
    """The output tensor to judge as logits: the primary output when declared; when undeclared,
    the ``logits`` field of a Hugging Face style output, or an output produced by a Linear whose
    weight is also an embedding table (a tied language-model head)."""
    if logits is False or main is None:
        return None
    if logits:
        return main
    if isinstance(out, dict) or hasattr(out, "keys"):
        try:
            value = out["logits"]
        except (KeyError, TypeError, IndexError):
            value = None
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() >= 2 and value.shape[-1] >= 2:
            return value
    op_id = cap.producer_of(main, out)
    if op_id is not None and _tied_head(cap.graph, cap.graph[op_id]):
        return main
    return None


def _tied_head(graph: Graph, op: Op) -> bool:
    """A Linear whose weight is the table of an embedding op and whose output goes nowhere but
    (through reshapes) to the model output."""
    if op.users:
        return False
    while op.kind == "view" and op.attrs.get("shape_only") and len(op.inputs) == 1:
        producer = graph[op.inputs[0]]
        if producer.users != [op.id]:
            return False
        op = producer
    weight = op.params.get("weight")
    if op.kind != "linear" or weight is None:
        return False
    return any(other.kind == "embedding" and other.params.get("weight") == weight for other in graph)


def put_logits(c: _Collector, cap: Capture, out: Any, main: Optional[torch.Tensor], logits: Optional[bool],
                result: ProbeResult) -> None:
    target = logits_output(out, main, cap, logits)
    if target is None:
        return
    rows = sample_rows(target.detach(), -1, logit_rows(target.shape[-1])).float()
    put_softmax(c, "logits", "logits", torch.log_softmax(rows, -1), -1, log=True, cross_entropy=True)
    c.const("logits", "logits", "declared", 1.0 if logits else 0.0)
    result.logits_op = cap.producer_of(target, out)


def backward_possible(main: Optional[torch.Tensor], result: ProbeResult) -> bool:
    """Whether the model's output can carry the backward probe; a note says why not."""
    if main is None:
        result.notes.append("the backward probe was skipped: the model returns no floating-point tensor")
        return False
    if not main.requires_grad:
        result.notes.append("the backward probe was skipped: the model output does not require grad")
        return False
    return True


GRAD_EXTREMES = False
"""Gradients get no extremes pass: the rules ask of a gradient its scale and mean, whether it is zero
(its norm is 0: every entry is 0, or below 4e-23 in float32, where no optimizer step moves the weight)
and whether it is finite (its mean is: a sum of finite float32 entries overflows only when they reach
3.4e38 / numel, 1e30 and more, while the norm's squares overflow from 1.8e19)."""


def _note_checkpointed(cap: Capture, c: _Collector, result: ProbeResult) -> None:
    """Say which weights the backward probe could not follow into reentrant activation checkpointing."""
    weights = {n for op in cap.graph if op.id in c.checkpointed and op.kind in O.WEIGHT_KINDS
               for role, n in op.params.items() if role == "weight"}
    if weights and result.backward_ran:
        result.notes.append(
            f"the backward probe measured no gradient for the {len(weights)} weight(s) the model runs inside "
            f"reentrant activation checkpointing (torch.utils.checkpoint with use_reentrant=True, whose forward runs "
            f"without autograd and whose backward runs only through .backward()), such as '{min(weights)}': the "
            f"gradient rules did not judge them; with use_reentrant=False (PyTorch's recommendation) the probe "
            f"follows them")


def _backward(cap: Capture, named: Dict[str, nn.Parameter], main: Optional[torch.Tensor], c: _Collector,
              result: ProbeResult, step: Optional[Any] = None, loss: Optional[torch.Tensor] = None) -> None:
    if not backward_possible(main, result):
        return
    # Only the weights IL006 judges: embeddings' gradients are sparse and large, and not needed
    # (unless the first step is taken: then every parameter that requires grad).
    weights = [(n, named[n]) for op in cap.graph if op.kind in O.WEIGHT_KINDS
               for role, n in op.params.items() if role == "weight" and n in named and named[n].requires_grad]
    weights = list(dict(weights).items())
    wanted = weights
    if step is not None:
        judged = dict(weights)
        wanted = weights + [(n, p) for n, p in named.items() if p.requires_grad and n not in judged]
    if not wanted:
        if any(op.kind in O.WEIGHT_KINDS for op in cap.graph):
            result.notes.append("the backward probe was skipped: no weight layer's weight is a trainable parameter "
                                "of the model (a parametrization such as weight_norm computes them), so no weight "
                                "gradient was measured (the gradient rules did not run)")
        return
    # without a step, a weight whose every use is a product with few rows gets its gradient's statistics
    # from its products' inputs and output gradients: autograd does not form it
    by_products = _by_products(cap.graph, c, weights) if step is None else {}
    c.products = None
    edges = [p.edge for products in by_products.values() for p in products]
    wanted = [(n, p) for n, p in wanted if n not in by_products]
    if loss is not None:  # the training loss (the first step); IL006 reads the same gradients
        grads = list(grad_without_dropout([loss], [p for _, p in wanted]))
    else:
        cotangent = draw.randn(main.shape, draw.generator(main.device, 0), main.device, main.dtype)
        grads = list(grad_without_dropout([main], edges + [p for _, p in wanted], [cotangent]))
    _product_grads(c, by_products, grads[:len(edges)], named)
    grads = grads[len(edges):]
    formed = dict(zip((n for n, _ in wanted), grads))
    measured = [(name, g) for name, _ in weights if (g := formed.get(name)) is not None and _measurable(c, name, g)]
    summarise(c, "grads", measured, mean=True, extremes=GRAD_EXTREMES)
    del edges, by_products
    if step is not None:
        if loss is None:  # the random direction as a mean-reduced loss, as training losses are
            grads = [None if g is None else g / max(main.numel(), 1) for g in grads]
        step.grads = {name: g for (name, _), g in zip(wanted, grads)}
        step.ran = True
    del grads
    result.backward_ran = True
