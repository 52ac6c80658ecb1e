"""Stage 3, probe: one forward (and optionally one backward) pass of the probe batch.

Statistics are computed on the fly, op by op, as small device scalars; activations
are never kept. Everything is moved to the host in a single transfer at the end, so
the probe adds no per-layer host-device synchronisation.

The probe runs inside :func:`initlint.probe.guard.guarded`, which leaves the model exactly as
it was found; the backward probe uses ``torch.autograd.grad``, so no ``.grad`` is touched.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..capture import ops as O
from ..capture import Capture
from ..capture.nested import tensors as _tensors
from ..capture.graph import Graph, Op
from . import draw
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


class _Collector:
    """Queues device scalars; :meth:`finish` moves them to the host in one transfer."""

    def __init__(self) -> None:
        self.keys: List[Tuple[str, Any, str]] = []
        self.values: List[torch.Tensor] = []
        self.many_keys: List[Tuple[str, Any, str]] = []
        self.many: List[torch.Tensor] = []
        self.consts: List[Tuple[str, Any, str, float]] = []
        self.device: Optional[torch.device] = None
        self._directions: Dict[Tuple[str, torch.dtype], torch.Tensor] = {}
        self.longest_row = 0
        self.skipped: Dict[str, List[str]] = {}
        """Kind of tensor -> the ops and parameters not measured because of it (for one note per kind)."""

        self.shapes: Dict[int, Tuple[int, ...]] = {}
        """Op id -> shape of its (first) output tensor."""
        self.units: Dict[str, "Units"] = {}
        self.pending: List["_Pending"] = []
        self.confirmed: Set[str] = set()
        """Weights whose duplicate units were confirmed early (:func:`confirm_duplicates_now`)."""
        self.weights: Dict[str, torch.Tensor] = {}
        """Weights measured without extremes: those that may be zero or constant get them on the host
        (:func:`confirm_extremes`)."""
        self.candidates: Dict[str, torch.Tensor] = {}
        """Per weight of :attr:`weights`: a device flag, its norm is 0 or its units' keys are all alike."""
        self.products: Optional[Dict[int, "_Product"]] = None
        """Op id -> the weight product it computed (:meth:`StatsObserver.weight_product`); None: not kept."""
        self.named: Dict[str, torch.Tensor] = {}
        self.overflow: Dict[str, List[Tuple["_Product", torch.Tensor]]] = {}
        """Per weight measured from products: its products and their output gradients, kept until the
        transfer shows whether its gradient overflowed (:func:`confirm_overflow`)."""

    def skip(self, kind: str, what: str) -> None:
        names = self.skipped.setdefault(kind, [])
        if what not in names:
            names.append(what)

    def skip_notes(self) -> List[str]:
        notes = []
        for kind, names in self.skipped.items():
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            if kind.startswith("torch."):
                notes.append(f"not measured, inside a {kind} transform (the statistics cannot be taken there): {shown}")
            else:
                notes.append(f"not measured, {kind} tensors (the statistics take dense real tensors): {shown}")
        return notes

    def put(self, scope: str, key: Any, name: str, value: torch.Tensor) -> None:
        """A 0-d device tensor; nothing is computed or moved until :meth:`finish`."""
        if self.device is None:
            self._start(value.device)
        self.keys.append((scope, key, name))
        self.values.append(value)

    def put_many(self, scope: str, keys: List[Any], name: str, values: torch.Tensor) -> None:
        """One statistic for several keys at once: ``values[i]`` (float32 or wider) belongs to ``keys[i]``."""
        if self.device is None:
            self._start(values.device)
        self.many_keys.extend((scope, key, name) for key in keys)
        self.many.append(values)

    def _start(self, device: torch.device) -> None:
        # A float32 zero leads the scalars, so stacking never narrows them to a half type
        # (type promotion of an integer count with a float16 value gives float16).
        self.device = device
        self.keys.append(("", None, ""))
        self.values.append(torch.zeros((), device=device))

    def const(self, scope: str, key: Any, name: str, value: float) -> None:
        """A value already on the host (a shape, a count)."""
        self.consts.append((scope, key, name, value))

    def direction(self, size: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """A fixed random vector in [0.5, 1.5) of length ``size``: a slice of one vector made once
        per device and dtype, so summarising many layers costs one host-to-device copy."""
        key = (str(device), dtype)
        current = self._directions.get(key)
        if current is None or current.numel() < size:
            length = max(size, self.longest_row)
            uniform = draw.rand((length,), draw.generator(device, 0), device)
            current = self._directions[key] = (uniform + 0.5).to(device, dtype)
        return current[:size]

    def finish(self, result: ProbeResult) -> None:
        result.shapes.update(self.shapes)
        tables = {"ops": result.ops, "params": result.params, "grads": result.grads}
        for scope, key, name, value in self.consts:
            if scope == "logits":
                result.logits = result.logits or {}
                result.logits[name] = value
            else:
                tables[scope].setdefault(key, {})[name] = value
        if not self.values:
            return
        with torch.no_grad():
            values = [v if v.device == self.device else v.to(self.device) for v in self.values]
            many = [v if v.device == self.device else v.to(self.device) for v in self.many]
            flat = torch.cat([torch.stack(values).detach()] + [v.detach().reshape(-1) for v in many])
        host = flat.tolist()  # the one device -> host transfer
        for (scope, key, name), value in zip(self.keys + self.many_keys, host):
            if not scope:
                continue
            if scope == "logits":
                result.logits = result.logits or {}
                result.logits[name] = value
            else:
                tables[scope].setdefault(key, {})[name] = value
        for table in (result.ops, result.params, result.grads):
            for stats in table.values():
                _derive(stats)


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


def put_softmax(c: _Collector, scope: str, key: Any, y: torch.Tensor, dim: int, log: bool,
                cross_entropy: bool = False) -> None:
    """Mean max-probability and entropy / ln(C) of a (log-)probability tensor, on at most
    :data:`SOFTMAX_ROWS` rows (see :func:`sample_rows`); with ``cross_entropy``, also ``xent``: the
    expected cross-entropy of a uniformly drawn label, ``-mean(log p)`` over the classes."""
    classes = y.shape[dim]
    if classes < 2:
        return
    y = sample_rows(y, dim).float()
    logp = y if log else y.clamp_min(1e-30).log()
    p = logp.exp() if log else y
    # An entry with probability exactly 0 is masked (causal attention, padding: -inf, finfo.min,
    # -1e4 and -9e15 all underflow to 0) or underflowed. Entropy is taken over the admissible
    # entries of each row, normalised by ln(count); rows with a single admissible entry are
    # counted apart as one-hot rows: a few of them are masks (the first position of causal
    # attention), most of them mean saturation.
    # (int32 sums of a mask and entr(p) = -xlogy(p, p) give the same bits at about half the cost)
    admissible = ((logp > -1e20) if log else (y > 0)).sum(-1, dtype=torch.int32)
    rows = (admissible >= 2).float()
    count = rows.sum().clamp_min(1.0)
    entropy = torch.special.entr(p).sum(-1) / admissible.clamp_min(2).float().log()
    c.put(scope, key, "maxprob", p.amax(-1).mean())
    c.put(scope, key, "entropy", (entropy * rows).sum() / count)
    c.put(scope, key, "onehot_rows", 1.0 - rows.mean())
    if cross_entropy:
        c.put(scope, key, "xent", -logp.clamp_min(-1e30).mean())
    c.const(scope, key, "classes", float(classes))


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
        norms = torch._foreach_norm(values, 2, dtype=acc)
        c.put_many(scope, names, "norm", torch.stack(norms))
        if scope == "params" and not extremes:
            c.candidates.update((n, norm == 0) for n, norm in zip(names, norms) if n in c.weights)
        for name, t in items:
            c.const(scope, name, "numel", float(t.numel()))
            if mean:
                c.put(scope, name, "mean", t.mean(dtype=acc))
            if extremes:
                low, high = torch.aminmax(t)
                c.put(scope, name, "low", low)
                c.put(scope, name, "high", high)
        if rows:
            for alike in _grouped_alike(c, [(n, t) for n, t in items if t.dim() >= 2]):
                if len(alike) > 1:
                    _duplicate_rows_stacked(c, scope, alike)
                else:
                    _duplicate_rows(c, scope, *alike[0])


def _grouped(tensors: List[Tuple[str, torch.Tensor]], key: Any) -> List[List[Tuple[str, torch.Tensor]]]:
    """``(name, detached tensor)`` pairs in groups of equal ``key(tensor)``, in first-seen order."""
    groups: Dict[Any, List[Tuple[str, torch.Tensor]]] = {}
    for name, t in tensors:
        groups.setdefault(key(t), []).append((name, t.detach()))
    return list(groups.values())


@dataclass
class Units:
    """How a weight's entries map to units (output features or channels) of its layer."""

    layout: str = "out_in"
    """``out_in``: a unit is a row of the weight (``F.linear``, conv); ``in_out``: a column (``x @ W``)."""
    bias: Optional[torch.Tensor] = None
    groups: int = 1
    """Grouped convolution: units of different groups read different inputs, so only units of one
    group can be copies of each other."""


@dataclass
class _Pending:
    """A weight whose duplicate-unit candidates are confirmed on the host once their count is known."""

    name: str
    matrix: torch.Tensor
    bias: Optional[torch.Tensor]
    order: torch.Tensor
    same: torch.Tensor
    groups: int = 1

    @property
    def whole(self) -> bool:
        """Whether the keys read whole units (their fan is at most :data:`KEYED`)."""
        return self.matrix.shape[1] <= KEYED


def unit_matrix(w: torch.Tensor, layout: str) -> torch.Tensor:
    """The weight as ``(units, fan)``: one row per unit, without a copy."""
    return w.t() if layout == "in_out" and w.dim() == 2 else w.reshape(w.shape[0], -1)


KEYED = 32
"""Weights of each unit its duplicate-unit keys read (128 bytes in float32)."""


def _duplicate_rows(c: _Collector, scope: str, name: str, w: torch.Tensor) -> None:
    """Candidates for units that are exact copies of another unit, on the device and without a sync.

    Each unit is hashed to two float32 keys: the projections of its first :data:`KEYED` weights (and
    its bias) on two fixed random directions. Equal units have keys equal up to the product's
    rounding; sorting by the keys puts them side by side, and neighbours whose two keys are each
    within a few units in the last place are the candidates. Units that differ only past their first
    :data:`KEYED` weights are candidates too, and so are distinct units whose keys come that close by
    chance (on one key: 35661 neighbour pairs in a 150k x 1024 head at N(0, 0.02); on both, none
    there, nor in a 262144 x 640 or a 50257 x 768 head): a candidate is not a proof, the candidates are
    compared in full (:func:`confirm_duplicates`), and only then counted. The keys read one or two
    cache lines of each unit instead of all of it (GPT-2's 50257 x 768 head: 1.3 ms against 26 ms for
    keys of whole rows)."""
    units = c.units.get(name, Units())
    matrix = unit_matrix(w, units.layout)
    rows, fan = matrix.shape
    c.const(scope, name, "rows", float(rows))
    if units.groups > 1:
        c.const(scope, name, "groups", float(units.groups))
    if rows < 2 or rows // max(units.groups, 1) < 2:
        c.const(scope, name, "dup_rows", 0.0)
        return
    keyed = min(fan, KEYED)
    head = matrix[:, :keyed].contiguous()  # (units, keyed): one or two cache lines of each unit
    work = head.float() if head.dtype in (torch.float16, torch.bfloat16) else head  # half keys would collide
    dirs = (c.direction(2 * (keyed + 1), work.device, work.dtype) - 1.0).view(2, keyed + 1)  # zero mean
    keys = dirs[:, :keyed] @ work.t()  # (2, units)
    if name in c.candidates:  # every unit's first weights alike: a candidate for a constant weight
        # alike within the product's rounding: equal columns need not give equal bits (a kernel's tail
        # columns round differently), and a weight wrongly taken as a candidate only costs its extremes
        tolerance = keyed * torch.finfo(keys.dtype).eps * keys.abs().amax(dim=1)
        c.candidates[name] = c.candidates[name] | (keys.amax(dim=1) - keys.amin(dim=1) <= tolerance).all()
    bias = units.bias.detach() if units.bias is not None and units.bias.numel() == rows else None
    if bias is not None:
        keys = keys + dirs[:, keyed:] * bias.to(keys.dtype)[None, :]
        c.const(scope, name, "biased", 1.0)
    # The two float32 keys' bits as one 64-bit integer: a single sort puts units with equal or nearly
    # equal keys next to each other. Equal units get keys equal up to the product's rounding, not always
    # bit for bit (a kernel's tail columns sum in another order: 3-11 units in the last place seen at
    # fan 300-768), so neighbours whose keys are both within ``ulps`` of each other are the candidates.
    ulps = 4 * math.isqrt(keyed) + 8
    group = _group_of(torch.arange(rows, device=keys.device), rows, units.groups) if units.groups > 1 else None
    bits, order = _key_order(keys, group)
    ranked = bits[:, order]
    same = ((ranked[:, 1:] - ranked[:, :-1]).abs() <= ulps).all(dim=0)
    if group is not None:
        ranked_group = group[order]
        same &= ranked_group[1:] == ranked_group[:-1]
    c.put(scope, name, "dup_candidates", torch.count_nonzero(same))
    c.pending.append(_Pending(name, matrix, bias, order, same, max(units.groups, 1)))


def _grouped_alike(c: _Collector, weights: List[Tuple[str, torch.Tensor]]) -> List[List[Tuple[str, torch.Tensor]]]:
    """Weights whose duplicate-unit keys can be taken in one batch: the same units and fan, no convolution
    groups, a bias each or none, and all or none of them candidates for a constant weight."""
    def key(name: str, w: torch.Tensor) -> Any:
        units = c.units.get(name, Units())
        matrix = unit_matrix(w, units.layout)
        bias = units.bias is not None and units.bias.numel() == matrix.shape[0]
        if units.groups > 1 or matrix.shape[0] < 2:
            return ("alone", name)
        return (tuple(matrix.shape), w.dtype, w.device, bias, bias and units.bias.dtype, name in c.candidates)

    groups: Dict[Any, List[Tuple[str, torch.Tensor]]] = {}
    for name, w in weights:
        groups.setdefault(key(name, w), []).append((name, w))
    return list(groups.values())


def _duplicate_rows_stacked(c: _Collector, scope: str, items: List[Tuple[str, torch.Tensor]]) -> None:
    """:func:`_duplicate_rows` for weights alike (:func:`_grouped_alike`), their keys taken in one batch:
    the per-layer ops of a deep stack of equal layers cost their Python dispatch once, not once per layer.
    The candidates are confirmed in full as :func:`_duplicate_rows`'s are, so the counts are the same."""
    names = [n for n, _ in items]
    units = [c.units.get(n, Units()) for n in names]
    matrices = [unit_matrix(w, u.layout) for (_, w), u in zip(items, units)]
    rows, fan = matrices[0].shape
    keyed = min(fan, KEYED)
    for name in names:
        c.const(scope, name, "rows", float(rows))
    work = torch.stack([m[:, :keyed] for m in matrices])  # (layers, units, keyed)
    work = work.float() if work.dtype in (torch.float16, torch.bfloat16) else work
    dirs = (c.direction(2 * (keyed + 1), work.device, work.dtype) - 1.0).view(2, keyed + 1)
    keys = dirs[:, :keyed] @ work.transpose(1, 2)  # (layers, 2, units)
    if names[0] in c.candidates:
        tolerance = keyed * torch.finfo(keys.dtype).eps * keys.abs().amax(dim=2)
        alike = (keys.amax(dim=2) - keys.amin(dim=2) <= tolerance).all(dim=1)
        for name, flag in zip(names, alike.unbind()):
            c.candidates[name] = c.candidates[name] | flag
    biases: List[Optional[torch.Tensor]] = [None] * len(names)
    if units[0].bias is not None and units[0].bias.numel() == rows:
        biases = [u.bias.detach() for u in units]
        keys = keys + dirs[:, keyed:] * torch.stack(biases).to(keys.dtype)[:, None, :]
        for name in names:
            c.const(scope, name, "biased", 1.0)
    ulps = 4 * math.isqrt(keyed) + 8
    bits = keys.float().view(torch.int32).to(torch.int64)
    order = ((bits[:, 0] << 32) | (bits[:, 1] & 0xFFFFFFFF)).argsort(dim=1)
    ranked = bits.gather(2, order[:, None, :].expand(-1, 2, -1))
    same = ((ranked[:, :, 1:] - ranked[:, :, :-1]).abs() <= ulps).all(dim=1)  # (layers, units - 1)
    c.put_many(scope, names, "dup_candidates", torch.count_nonzero(same, dim=1).float())
    for name, matrix, bias, o, s in zip(names, matrices, biases, order.unbind(), same.unbind()):
        c.pending.append(_Pending(name, matrix, bias, o, s, 1))


def confirm_duplicates(c: _Collector, result: ProbeResult, chunk: int = 4096) -> None:
    """Compare each candidate pair of units in full (weights and bias) and set ``dup_rows``: the number
    of units that are exact copies of another unit of their layer. Runs on the host, after the one
    transfer, and only for weights that have candidates; the others get ``dup_rows = 0`` for free."""
    for item in c.pending:
        stats = result.params.get(item.name, {})
        stats["dup_rows"] = float(_copies(item, chunk)) if stats.pop("dup_candidates", 0) else 0.0
    c.pending = []


def queue_candidates(c: _Collector) -> None:
    """Send the flags of :func:`confirm_extremes` with the one transfer."""
    for name, flag in c.candidates.items():
        c.put("params", name, "maybe_flat", flag.float())


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


def confirm_duplicates_now(c: _Collector, chunk: int = 4096) -> None:
    """:func:`confirm_duplicates` for weights that are freed before the one transfer (a streamed
    block): the candidates are counted and compared now, at one host sync per block."""
    for item in c.pending:
        copies = _copies(item, chunk) if int(torch.count_nonzero(item.same)) else 0
        c.const("params", item.name, "dup_rows", float(copies))
        c.confirmed.add(item.name)
    c.pending = []


def _copies(item: _Pending, chunk: int) -> int:
    """Candidate pairs of ``item`` whose units are equal in full, weights and bias.

    Keys of a unit's first weights can tie for many units that differ further on (every unit starting
    alike), and a tie leaves the copies anywhere in the run: the candidates are then ordered again by
    keys of their whole rows, on which only equal units come together, and neighbours compared."""
    with torch.no_grad():
        first = item.order[:-1][item.same]
        second = item.order[1:][item.same]
        if not item.whole and first.numel():
            ranked = _rekeyed(item, torch.unique(torch.cat([first, second])))
            first, second = ranked[:-1], ranked[1:]
            if item.groups > 1:  # only units of one group can be copies
                rows = item.matrix.shape[0]
                kept = _group_of(first, rows, item.groups) == _group_of(second, rows, item.groups)
                first, second = first[kept], second[kept]
        copies = 0
        for start in range(0, first.numel(), chunk):
            a, b = first[start:start + chunk], second[start:start + chunk]
            equal = (item.matrix[a] == item.matrix[b]).all(dim=1)
            if item.bias is not None:
                equal &= item.bias[a] == item.bias[b]
            copies += int(torch.count_nonzero(equal))
    return copies


def _rekeyed(item: _Pending, units: torch.Tensor) -> torch.Tensor:
    """``units`` ordered by keys of their whole rows (and bias), within their convolution group."""
    rows, fan = item.matrix.shape
    work = item.matrix[units]
    work = work.float() if work.dtype in (torch.float16, torch.bfloat16) else work
    dirs = (draw.rand((2, fan + 1), draw.generator(work.device, 1), work.device) - 0.5).to(work.dtype)
    keys = dirs[:, :fan] @ work.t()
    if item.bias is not None:
        keys = keys + dirs[:, fan:] * item.bias[units].to(keys.dtype)[None, :]
    _, order = _key_order(keys, _group_of(units, rows, item.groups) if item.groups > 1 else None)
    return units[order]


def _group_of(units: torch.Tensor, rows: int, groups: int) -> torch.Tensor:
    """The convolution group of each of ``units`` (indices among ``rows`` units in ``groups`` equal groups)."""
    return units // (rows // groups)


def _key_order(keys: torch.Tensor, group: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The two float32 keys' bits, and the order that sorts units by them as one 64-bit integer; with
    ``group`` (each unit's convolution group), by group first: only units of one group can be copies."""
    bits = keys.float().view(torch.int32).to(torch.int64)
    order = ((bits[0] << 32) | (bits[1] & 0xFFFFFFFF)).argsort()
    if group is not None:
        order = order[group[order].argsort(stable=True)]
    return bits, order


def _derive(stats: Dict[str, float]) -> None:
    """Host-side: rms from the norm, std from rms and mean, absmax and spread from the extremes,
    dead units and the saturated fraction from their counts."""
    numel = max(stats.get("numel", 1.0), 1.0)
    if "norm" in stats:
        stats["rms"] = stats.pop("norm") / math.sqrt(numel)
    if "lead_norm" in stats:
        stats["lead_rms"] = stats.pop("lead_norm") / math.sqrt(max(stats.pop("lead_numel", 1.0), 1.0))
    if "alive" in stats:
        stats["dead"] = stats["units"] - stats.pop("alive")
    if "saturated_count" in stats:
        stats["saturated"] = stats.pop("saturated_count") / numel
    stats.pop("numel", None)
    if "rms" in stats and "mean" in stats and "std" not in stats:
        stats["std"] = math.sqrt(max(stats["rms"] ** 2 - stats["mean"] ** 2, 0.0)) \
            if math.isfinite(stats["rms"]) else stats["rms"]
    if "low" in stats and "high" in stats:
        low, high = stats["low"], stats["high"]
        stats["absmax"] = max(high, -low) if low == low and high == high else float("nan")
        stats["spread"] = high - low
        if "mean" not in stats and stats["spread"] == 0:
            stats["mean"] = low  # a constant tensor


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


@dataclass
class _Product:
    """A weight product ``y = x @ w`` of the forward (or a lookup of the rows ``x`` of ``w``): its input,
    and the gradient edge of its output."""

    name: str
    x: torch.Tensor
    version: int
    """``x``'s version counter when the product ran: an in-place write since changes what it holds."""
    edge: Any
    rows: int
    fan_in: int
    fan_out: int
    lookup: bool = False
    padding: Optional[int] = None
    """A lookup's ``padding_idx``: that row gets no gradient."""
    conv: Optional[O.Conv] = None
    """A convolution's kernel size, stride, padding and dilation: its rows are ``F.unfold(x)``'s columns."""

    def rows_of(self, g: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """A product's rows of ``A`` (its input) and ``B`` (its output's gradient ``g``), one row per output
        position: the weight's gradient is ``A.T @ B``, as ``(fan_in, fan_out)``."""
        if self.conv is None:
            return self.x.reshape(-1, self.fan_in), g.reshape(-1, self.fan_out)
        kernel, stride, padding, dilation = self.conv
        columns = F.unfold(self.x, kernel, dilation=dilation, padding=padding, stride=stride)  # (N, fan_in, L)
        return columns.mT.reshape(-1, self.fan_in), g.flatten(2).mT.reshape(-1, self.fan_out)


def _product(name: str, x: Any, y: Any, w: Optional[torch.Tensor], lookup: bool = False,
             padding: Optional[int] = None, conv: Optional[O.Conv] = None) -> Optional[_Product]:
    """The product, when its weight's gradient is ``x.reshape(-1, fan_in).T @ dy.reshape(-1, fan_out)``
    in some layout (``w`` has ``fan_in * fan_out`` entries, ``x`` and ``y`` the same rows), for a lookup
    ``dy.reshape(-1, fan_in)`` summed into the rows ``x`` of the ``(fan_out, fan_in)`` table, for a 2-D
    convolution the same product of ``F.unfold(x)``'s columns (:meth:`_Product.rows_of`); and when the
    gradient of ``y`` can be asked of autograd (a whole, contiguous view is asked through its base).
    None otherwise."""
    if w is None or type(x) is not torch.Tensor or type(y) is not torch.Tensor or x.is_nested or y.is_nested \
            or x.layout != torch.strided or y.layout != torch.strided or not y.dim() \
            or not y.is_floating_point() or x.device != y.device or y.grad_fn is None:
        return None
    if lookup:
        if x.is_floating_point() or w.dim() != 2:
            return None
        fan_in, fan_out, rows = int(w.shape[1]), int(w.shape[0]), x.numel()
        if y.shape[-1] != fan_in or y.numel() != rows * fan_in:
            return None
    elif conv is not None:
        if x.dim() != 4 or y.dim() != 4 or w.dim() != 4 or not x.is_floating_point() \
                or x.shape[0] != y.shape[0] or x.shape[1] != w.shape[1] or y.shape[1] != w.shape[0]:
            return None
        fan_in, fan_out, rows = int(w[0].numel()), int(w.shape[0]), int(y.shape[0] * y.shape[2] * y.shape[3])
    else:
        if not x.dim() or not x.is_floating_point():
            return None
        fan_in, fan_out = int(x.shape[-1]), int(y.shape[-1])
        if not fan_in * fan_out or fan_in * fan_out != w.numel() or x.numel() // fan_in != y.numel() // fan_out:
            return None
        rows = x.numel() // fan_in
    target = y
    if y._base is not None:
        base = y._base
        if not (base.numel() == y.numel() and base.is_contiguous() and y.is_contiguous()
                and base.storage_offset() == y.storage_offset() and base.grad_fn is not None):
            return None
        target = base
    try:
        version = x._version
    except RuntimeError:  # an inference tensor
        return None
    edge = torch.autograd.graph.get_gradient_edge(target)
    return _Product(name, x.detach(), version, edge, rows, fan_in, fan_out, lookup, padding, conv)


def _by_products(graph: Graph, c: _Collector, weights: List[Tuple[str, torch.Tensor]]) -> Dict[str, List[_Product]]:
    """The weights whose gradients come from their products (:func:`_product_grads`): every op of the graph
    that uses the weight is a kept product or lookup of it, all in one layout (a lookup reads a table laid
    out as ``F.linear``'s weight), whose input still holds what it read; and the rows are few enough that
    the two Gram matrices cost less than the gradient's product: ``rows^2 * fan_in + dense^2 * fan_out <=
    dense * fan_in * fan_out``, ``dense`` the products' rows (a lookup's one-hot rows cost comparisons, not
    products; without lookups, ``rows * (fan_in + fan_out) <= fan_in * fan_out``)."""
    products = c.products or {}
    if not products:
        return {}
    uses: Dict[str, List[int]] = {}
    for op in graph:
        for name in set(op.params.values()):
            uses.setdefault(name, []).append(op.id)
    out: Dict[str, List[_Product]] = {}
    for name, _ in weights:
        found = [products.get(i) for i in uses.get(name, [])]
        if not found or any(p is None or p.name != name for p in found):
            continue
        kept: List[_Product] = found  # type: ignore[assignment]  # no None left
        first = kept[0]
        layouts = {"out_in" if graph[i].kind == "embedding" else graph[i].attrs.get("layout", "out_in")
                   for i in uses[name]}
        if len(layouts) != 1 or any((p.fan_in, p.fan_out) != (first.fan_in, first.fan_out) for p in kept) \
                or any(p.x._version != p.version for p in kept):
            continue
        rows = sum(p.rows for p in kept)
        dense = sum(p.rows for p in kept if not p.lookup)
        if rows * rows * first.fan_in + dense * dense * first.fan_out <= dense * first.fan_in * first.fan_out:
            out[name] = kept
    return out


def _product_grads(c: _Collector, by_products: Dict[str, List[_Product]], grads: List[Optional[torch.Tensor]],
                   named: Dict[str, nn.Parameter]) -> None:
    """The norm and mean of each weight's gradient without forming it. The gradient is ``A.T @ B``, rows
    stacked over the weight's uses: a product contributes its input to ``A`` and its output's gradient to
    ``B``; a lookup its output's gradient to ``A`` and the one-hot rows of its ids (zero at ``padding_idx``)
    to ``B``. Then ``|A.T @ B|^2 = sum((A @ A.T) * (B @ B.T))`` and ``sum(A.T @ B) = (A.sum(1) * B.sum(1)).sum()``,
    where the one-hot rows' products are comparisons of ids and columns picked by them. Equal to the formed
    gradient's up to rounding, and 0 exactly when every contribution is 0. A weight none of whose outputs
    reaches the model output has no gradient, as autograd gives none."""
    it = iter(grads)
    for name, products in by_products.items():
        pairs = [(p, g) for p in products if (g := next(it)) is not None]
        if not pairs:
            continue
        w = named[name]
        wide = w.dtype == torch.float64 or any(t.dtype == torch.float64 for p, g in pairs for t in (p.x, g))
        dtype = torch.float64 if wide else torch.float32
        fan_in = pairs[0][0].fan_in
        dense = [(p, g) for p, g in pairs if not p.lookup]
        lookups = [(p, g) for p, g in pairs if p.lookup]
        device = pairs[0][1].device
        operands = [p.rows_of(g) for p, g in dense]
        a = _rows([x for x, _ in operands] + [g.reshape(-1, fan_in) for _, g in lookups], fan_in, dtype, device)
        b = _rows([dy for _, dy in operands], pairs[0][0].fan_out, dtype, device)
        del operands
        gram = a @ a.mT
        if lookups:
            ids = torch.cat([p.x.reshape(-1) for p, _ in lookups])
            kept = torch.cat([torch.ones(p.rows, dtype=torch.bool, device=ids.device) if p.padding is None
                              else p.x.reshape(-1) != p.padding for p, _ in lookups])
            n = b.shape[0]
            ones = kept.to(dtype)
            other = torch.empty_like(gram)
            other[:n, :n] = b @ b.mT
            other[:n, n:] = b[:, ids] * ones
            other[n:, :n] = other[:n, n:].mT
            other[n:, n:] = (ids[:, None] == ids[None, :]).to(dtype) * ones[:, None] * ones[None, :]
            sums = torch.cat([b.sum(1), ones])
        else:
            other = b @ b.mT
            sums = b.sum(1)
        c.put("grads", name, "norm", torch.sum(gram * other).clamp_min(0).sqrt())
        c.put("grads", name, "mean", torch.dot(a.sum(1), sums) / w.numel())
        c.const("grads", name, "numel", float(w.numel()))
        c.overflow[name] = pairs


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


def _rows(parts: List[torch.Tensor], width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``parts`` (rows of ``width``) stacked, in ``dtype`` (no copy for one part already in it)."""
    if not parts:
        return torch.zeros(0, width, dtype=dtype, device=device)
    return (torch.cat([t.to(dtype) for t in parts]) if len(parts) > 1 else parts[0].to(dtype))


GRAD_EXTREMES = False
"""Gradients get no extremes pass: the rules ask of a gradient its scale and mean, whether it is zero
(its norm is 0: every entry is 0, or below 4e-23 in float32, where no optimizer step moves the weight)
and whether it is finite (its mean is: a sum of finite float32 entries overflows only when they reach
3.4e38 / numel, 1e30 and more, while the norm's squares overflow from 1.8e19)."""


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
        grads = list(torch.autograd.grad([loss], [p for _, p in wanted], allow_unused=True))
    else:
        cotangent = draw.randn(main.shape, draw.generator(main.device, 0), main.device, main.dtype)
        grads = list(torch.autograd.grad([main], edges + [p for _, p in wanted], [cotangent], allow_unused=True))
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


ATTENTION_HEADS = 8
"""Heads (with their batch items) whose attention rows are measured per attention op."""
ATTENTION_ROWS = 64
"""Query rows measured per sampled head: ``ATTENTION_HEADS * ATTENTION_ROWS = 512`` rows in all.

Why that is enough: each row's entropy over ``ln(admissible keys)`` lies in [0, 1], so the
mean over 512 rows has a standard error below ``0.5 / sqrt(512) = 0.022``, against a decision
threshold (0.5) that healthy attention at init (0.85 and more) and saturated attention (below
0.1) miss by far more. At initialisation the heads of a layer are statistically alike (their
weights are i.i.d.), so a few heads stand for all of them; the rows are spread evenly over the
query positions, so causal attention's short early rows are weighed as they occur. The cost,
``512 * keys * head_dim`` multiply-adds per op, is a few per cent of the op's own
``batch * heads * queries * keys * head_dim`` on a probe batch of 16 sequences with 12 heads,
and independent of the batch size."""
SOFTMAX_ROWS = 512
"""Rows of a large softmax output (or of the logits) measured; same reasoning as above."""
LOGIT_VALUES = 1 << 21
"""Logits measured: whole rows, ``LOGIT_VALUES // classes`` of them but at least
:data:`MIN_LOGIT_ROWS` and at most :data:`SOFTMAX_ROWS` (:func:`logit_rows`)."""
MIN_LOGIT_ROWS = 64


def logit_rows(classes: int) -> int:
    """Rows of the logits measured: their statistics take a few passes over each value, and a
    vocabulary of 50k-260k classes makes each row costly, while 64 rows already bound the standard
    error of the mean entropy / ln(C) by ``0.5 / sqrt(64) = 0.06`` (and at initialisation the rows
    are alike: see ``benchmarks/logit_rows.py`` for how far the figures move)."""
    return max(MIN_LOGIT_ROWS, min(SOFTMAX_ROWS, LOGIT_VALUES // max(classes, 1)))


def _row_positions(length: int, limit: int) -> Tuple[int, int]:
    """``(count, step)``: rows ``offset + step * i`` for ``i < count`` spread evenly over ``length``."""
    count = min(length, limit)
    return count, max(1, length // count)


def _head_pairs(batch: int, heads: int) -> List[Tuple[int, int]]:
    """Up to ``ATTENTION_HEADS`` (batch item, head) pairs: heads spread evenly, batch items cycled."""
    count = min(ATTENTION_HEADS, batch * heads)
    if heads >= count:
        return [(i % batch, i * heads // count) for i in range(count)]
    return [((i // heads) % batch, i % heads) for i in range(count)]


def put_attention(c: _Collector, key: Any, call: O.AttentionCall) -> None:
    """Attention-row statistics of one attention op, on a sample of heads and query rows.

    Queues ``entropy`` (mean over rows with at least two admissible keys of the row's entropy
    divided by ``ln(admissible keys)``), ``maxprob`` (mean largest probability of those rows),
    ``onehot_rows`` (fraction of rows the mask leaves with fewer than two keys), ``raw_rms``
    (root mean square of ``q . k`` over the admissible pairs, before the scale), ``q_rms`` and
    ``k_rms``; and the constants ``keys``, ``head_dim``, ``scale`` and ``default_scale``.
    Admissible keys are the ones the mask allows: boolean masks, ``is_causal``, and additive
    biases above :data:`~initlint.capture.ops.MASKED_BIAS`.
    """
    with torch.no_grad():
        sample = _sample_sdpa(call) if call.form == "sdpa" else _sample_mha(call)
        if sample is None:
            return
        q, k, allowed, bias = sample
        head_dim = call.head_dim
        scale = call.scale if call.scale is not None else head_dim ** -0.5
        _attention_rows(c, key, q, k, scale, allowed, bias)
    c.const("ops", key, "keys", float(call.keys))
    c.const("ops", key, "head_dim", float(head_dim))
    c.const("ops", key, "scale", float(scale))
    c.const("ops", key, "default_scale", 1.0 if call.scale is None else 0.0)


_Sample = Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]


def _sample_sdpa(call: O.AttentionCall) -> Optional[_Sample]:
    q, k = call.q, call.k
    lead_q, lead_k = tuple(q.shape[:-2]), tuple(k.shape[:-2])
    length, keys = int(q.shape[-2]), int(k.shape[-2])
    heads = lead_q[-1] if lead_q else 1
    batch = math.prod(lead_q[:-1]) if len(lead_q) > 1 else 1
    rows, step = _row_positions(length, ATTENTION_ROWS)
    pairs = _head_pairs(batch, heads)
    qs, ks, masks = [], [], []
    for i, (b, h) in enumerate(pairs):
        index = _unravel(b, lead_q[:-1]) + ((h,) if lead_q else ())
        offset = i * step // len(pairs)
        qs.append(q[index][offset::step][:rows])
        ks.append(k[_broadcast_index(index, lead_q, lead_k, call.gqa)])
        if call.mask is not None:
            masks.append(_mask_rows(call.mask, index, lead_q, length, offset, step, rows, keys))
    allowed, bias = _split_mask(torch.stack(masks), sdpa=True) if masks else (None, None)
    if call.is_causal:
        causal = _causal(len(pairs), rows, step, keys, q.device)
        allowed = causal if allowed is None else allowed & causal
    return torch.stack(qs), torch.stack(ks), allowed, bias


def _sample_mha(call: O.AttentionCall) -> Optional[_Sample]:
    query, key, heads = call.q, call.k, call.heads
    length, batch, keys = int(query.shape[0]), int(query.shape[1]), int(key.shape[0])
    head_dim = call.head_dim
    rows, step = _row_positions(length, ATTENTION_ROWS)
    pairs = _head_pairs(batch, heads)
    xq, xk, wq, wk, bq, bk, masks, pads = [], [], [], [], [], [], [], []
    for i, (b, h) in enumerate(pairs):
        offset = i * step // len(pairs)
        part = slice(h * head_dim, (h + 1) * head_dim)
        xq.append(query[offset::step, b][:rows])
        xk.append(key[:, b])
        wq.append(call.q_weight[part])
        wk.append(call.k_weight[part])
        if call.q_bias is not None:
            bq.append(call.q_bias[part])
            bk.append(call.k_bias[part])
        if isinstance(call.mask, torch.Tensor):
            plane = call.mask if call.mask.dim() == 2 else call.mask[b * heads + h]
            masks.append(plane[offset::step][:rows] if plane.shape[0] == length else plane.expand(rows, keys))
        if isinstance(call.padding, torch.Tensor):
            pads.append(call.padding[b].expand(rows, keys))
    q = torch.bmm(torch.stack(xq).float(), torch.stack(wq).float().transpose(1, 2))
    k = torch.bmm(torch.stack(xk).float(), torch.stack(wk).float().transpose(1, 2))
    if bq:
        q, k = q + torch.stack(bq).float()[:, None], k + torch.stack(bk).float()[:, None]
    allowed, bias = _split_mask(torch.stack(masks), sdpa=False) if masks else (None, None)
    if pads:
        pad_allowed, pad_bias = _split_mask(torch.stack(pads), sdpa=False)
        allowed = pad_allowed if allowed is None else allowed if pad_allowed is None else allowed & pad_allowed
        bias = pad_bias if bias is None else bias if pad_bias is None else bias + pad_bias
    return q, k, allowed, bias


def _unravel(flat: int, shape: Tuple[int, ...]) -> Tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _broadcast_index(index: Tuple[int, ...], lead_q: Tuple[int, ...], lead_k: Tuple[int, ...],
                     gqa: bool) -> Tuple[int, ...]:
    """The key tensor's index for query index ``index`` (right-aligned broadcasting; grouped heads)."""
    out = []
    for pos in range(1, len(lead_k) + 1):
        size_k = lead_k[-pos]
        i = index[-pos] if pos <= len(index) else 0
        if size_k == 1:
            i = 0
        elif pos == 1 and gqa and size_k != lead_q[-1]:
            i = i // (lead_q[-1] // size_k)
        out.append(i)
    return tuple(reversed(out))


def _mask_rows(mask: torch.Tensor, index: Tuple[int, ...], lead_q: Tuple[int, ...], length: int, offset: int,
               step: int, rows: int, keys: int) -> torch.Tensor:
    """The sampled rows of an SDPA mask broadcastable to ``(*lead_q, L, S)``, as ``(rows, keys)``."""
    lead_m = tuple(mask.shape[:-2])
    plane = mask[_broadcast_index(index, lead_q, lead_m, False)] if lead_m else mask
    if plane.dim() < 2:
        plane = plane.reshape(1, -1)
    if plane.shape[0] == length:
        plane = plane[offset::step][:rows]
    return plane.expand(rows, keys)


def _split_mask(mask: torch.Tensor, sdpa: bool) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(allowed, bias)``: a boolean mask as admissibility (SDPA: True attends; MHA: True is masked),
    an additive one as a bias whose entries at or below ``MASKED_BIAS`` are masks."""
    if mask.dtype == torch.bool:
        return (mask if sdpa else ~mask), None
    bias = mask.float()
    return bias > O.MASKED_BIAS, bias


def _causal(pairs: int, rows: int, step: int, keys: int, device: torch.device) -> torch.Tensor:
    """SDPA's ``is_causal`` (top-left aligned: query ``i`` sees keys ``j <= i``) for the sampled rows."""
    offsets = torch.arange(pairs, device=device) * step // pairs
    positions = offsets[:, None] + torch.arange(rows, device=device)[None, :] * step
    return torch.arange(keys, device=device)[None, None, :] <= positions[:, :, None]


def _attention_rows(c: _Collector, key: Any, q: torch.Tensor, k: torch.Tensor, scale: float,
                    allowed: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> None:
    """Row statistics of ``softmax(q @ k^T * scale + bias)`` over the admissible keys."""
    q, k = q.float(), k.float()
    raw = torch.bmm(q, k.transpose(1, 2))
    scores = raw * scale if bias is None else bias + raw * scale
    if allowed is None:
        admissible = torch.full(raw.shape[:-1], raw.shape[-1], device=raw.device)
        pairs = float(raw.numel())
        raw_sq = raw.square().sum()
    else:
        allowed = allowed.expand(raw.shape)
        admissible = allowed.sum(-1, dtype=torch.int32)
        # a row with no admissible key would be NaN: give it uniform scores (it is counted apart)
        scores = scores.masked_fill(~allowed, float("-inf")).masked_fill((admissible == 0)[..., None], 0.0)
        pairs = allowed.sum().clamp_min(1)
        raw_sq = raw.square().masked_fill(~allowed, 0.0).sum()
    logp = torch.log_softmax(scores, dim=-1)
    p = logp.exp()
    entropy = torch.special.entr(p).sum(-1) / admissible.clamp_min(2).float().log()
    rows = (admissible >= 2).float()
    count = rows.sum().clamp_min(1.0)
    c.put("ops", key, "entropy", (entropy * rows).sum() / count)
    c.put("ops", key, "maxprob", (p.amax(-1) * rows).sum() / count)
    c.put("ops", key, "onehot_rows", 1.0 - rows.mean())
    c.put("ops", key, "raw_rms", (raw_sq / pairs).sqrt())
    c.put("ops", key, "q_rms", q.square().mean().sqrt())
    c.put("ops", key, "k_rms", k.square().mean().sqrt())


def sample_rows(y: torch.Tensor, dim: int, limit: int = SOFTMAX_ROWS) -> torch.Tensor:
    """At most ``limit`` rows of ``y`` along ``dim``, as ``(rows, size)``, spread over the other axes.

    The stride between the chosen rows is a prime, so it does not alias with a sequence length
    or a head count (every query position and head is reached, not one position over and over).
    """
    flat = y.movedim(dim, -1).reshape(-1, y.shape[dim])
    total = flat.shape[0]
    if total <= limit:
        return flat
    step = _prime_at_most(total // limit)
    return flat[::step][:limit]


def _prime_at_most(n: int) -> int:
    for candidate in range(max(n, 2), 1, -1):
        if all(candidate % d for d in range(2, int(candidate ** 0.5) + 1)):
            return candidate
    return 1


TOKEN_SEQUENCES = 2
"""Sequences of the probe batch whose token vectors IL013 compares."""
LEAD_TOKENS = 16
"""Leading positions of a sequence whose scale IL012 compares (``lead_rms``): position ``t`` of a causal
model sees only the tokens up to ``t``, so these statistics do not depend on the sequence's length."""
TOKEN_COUNT = 64
"""Tokens per sequence compared pairwise (``64 * 63 / 2 = 2016`` pairs per sequence): the mean
cosine has a standard error below 0.01 even when the tokens are independent."""


def put_token_cosine(c: _Collector, key: Any, y: torch.Tensor, batch_first: bool) -> None:
    """Mean pairwise cosine similarity of the token vectors of a ``(batch, tokens, features)`` output
    (``(tokens, batch, features)`` when not ``batch_first``), on a sample of sequences and tokens."""
    seqs = y[:TOKEN_SEQUENCES] if batch_first else y[:, :TOKEN_SEQUENCES].transpose(0, 1)
    count, step = _row_positions(int(seqs.shape[1]), TOKEN_COUNT)
    if count < 2:
        return
    v = seqs[:, ::step][:, :count].float()
    v = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(1e-30)
    # the cosines of all pairs sum, over i != j, to |sum_i v_i|^2 - sum_i |v_i|^2: sums over the tokens, not
    # the (count x count) Gram matrix (half the time at 768 features, a third at 3072); the two sums are at
    # most count^2 and count, so their difference is off by about count^2 * 1e-7 and the mean by 1e-7
    off_diagonal = v.sum(dim=1).square().sum() - v.square().sum()
    c.put("ops", key, "token_cos", off_diagonal / (v.shape[0] * count * (count - 1)))
