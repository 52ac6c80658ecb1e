"""Stage 3, probe: one forward (and optionally one backward) pass of the probe batch.

Statistics are computed on the fly, op by op, as small device scalars; activations
are never kept. Everything is moved to the host in a single transfer at the end, so
the probe adds no per-layer host-device synchronisation.

The model is left exactly as it was found: training flags, buffers (BatchNorm running
statistics), the global RNG state and the grad mode are restored in ``finally``, and
the backward probe uses ``torch.autograd.grad`` so no ``.grad`` is touched.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from . import ops as O
from .capture import Capture
from .capture.runtime import _tensors
from .graph import Graph, Op

SATURATION_MARGIN = 0.01
"""An output within 1% of the activation's range from a bound counts as saturated
(|tanh| > 0.98, sigmoid < 0.01 or > 0.99)."""

_NO_STATS = frozenset({"view", "dropout", "identity"})
EXTREMA_KINDS = O.WEIGHT_KINDS | O.NORM_KINDS | frozenset(O.ACTIVATIONS) | {
    "softmax", "log_softmax", "attention", "rnn", "embedding", "conv_transpose", "input"}
"""Ops whose largest magnitude is measured: where an Inf is never on purpose (IL009)."""


@dataclass
class ProbeResult:
    """Host-side statistics of one probe run."""

    ops: Dict[int, Dict[str, float]] = field(default_factory=dict)
    """Per op: ``rms`` (root mean square, the scale the variance analysis propagates) and
    ``absmax`` of its output; ``dead``/``units`` (ReLU family);
    ``saturated`` (bounded activations); ``maxprob``/``entropy`` (softmax)."""
    params: Dict[str, Dict[str, float]] = field(default_factory=dict)
    """Per weight of a Linear/Conv layer: ``rms``, ``low``, ``high``, ``absmax``, ``spread``,
    ``dup_rows`` (units that are exact copies of another unit, weights and bias compared in full),
    ``rows`` (units), ``groups`` (grouped convolutions) and ``mean`` when all its entries are equal;
    per bias: ``mean``."""
    grads: Dict[str, Dict[str, float]] = field(default_factory=dict)
    """Per weight parameter: ``std``, ``absmax`` of its gradient under the backward probe."""
    logits: Optional[Dict[str, float]] = None
    """Softmax statistics of the model output when it was declared to be logits."""
    forward_ran: bool = False
    backward_ran: bool = False
    notes: List[str] = field(default_factory=list)


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
        self.units: Dict[str, "Units"] = {}
        self.pending: List["_Pending"] = []

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
            gen = torch.Generator().manual_seed(0)
            current = self._directions[key] = (torch.rand(length, generator=gen) + 0.5).to(device, dtype)
        return current[:size]

    def finish(self, result: ProbeResult) -> None:
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


def unit_axis(graph: Graph, op: Op) -> int:
    """Axis indexing units (features/channels) of ``op``'s output, from its nearest producer that fixes it."""
    seen = 0
    current: Optional[Op] = op
    while current is not None and seen < 64:
        axis = O.unit_axis(current.kind)
        if axis is not None:
            return axis
        current = graph[current.inputs[0]] if current.inputs else None
        seen += 1
    return -1


class Observer:
    """Computes per-op statistics during the forward pass (called by the capture)."""

    def __init__(self, graph_of: Any, collector: _Collector) -> None:
        self.graph_of = graph_of
        self.c = collector

    def __call__(self, op: Op, value: Any) -> None:
        t = value if isinstance(value, torch.Tensor) else next(
            (v for v in _tensors(value) if v.is_floating_point()), None)
        if t is None:
            return
        op.attrs["shape"] = tuple(t.shape)
        if op.kind in _NO_STATS or not t.is_floating_point() or t.numel() == 0:
            return
        y = t.detach()
        # Scale as root mean square: the norm here, divided by sqrt(numel) on the host (an
        # arithmetic op with a Python number costs more than the reduction on small tensors).
        self.c.put("ops", op.id, "norm", torch.linalg.vector_norm(y, dtype=_acc(y)))
        self.c.const("ops", op.id, "numel", float(y.numel()))
        if op.kind in O.DYING_KINDS and y.dim() >= 2:
            self._dead(op, y)  # also measures the largest value
        elif op.kind in EXTREMA_KINDS:  # elsewhere a NaN still shows in the norm, and an Inf may be a mask
            # NaN propagates through amin/amax, so non-finite outputs show up here
            low, high = torch.aminmax(y)
            self.c.put("ops", op.id, "low", low)
            self.c.put("ops", op.id, "high", high)
        act = O.ACTIVATIONS.get(op.kind)
        if act is not None and act.bounds is not None:
            self._saturated(op, y, act.bounds)
        if op.kind in ("softmax", "log_softmax"):
            put_softmax(self.c, "ops", op.id, y, op.attrs.get("dim", -1), log=op.kind == "log_softmax")

    def _dead(self, op: Op, y: torch.Tensor) -> None:
        """ReLU-family outputs are >= 0: a unit is dead when its largest output over the batch is 0."""
        axis = unit_axis(self.graph_of(), op) % y.dim()
        units = y.shape[axis]
        peaks = y.amax(dim=[d for d in range(y.dim()) if d != axis])  # NaN stays NaN: counted alive
        op.attrs["units"] = units
        op.attrs["unit_axis"] = axis
        self.c.put("ops", op.id, "alive", torch.count_nonzero(peaks))
        self.c.const("ops", op.id, "units", float(units))
        self.c.put("ops", op.id, "high", peaks.amax())
        self.c.const("ops", op.id, "low", 0.0)

    def _saturated(self, op: Op, y: torch.Tensor, bounds: Tuple[float, float]) -> None:
        lo, hi = bounds
        centre, reach = (lo + hi) / 2, (hi - lo) / 2 - SATURATION_MARGIN * (hi - lo)
        centred = y if centre == 0 else y - centre
        self.c.put("ops", op.id, "saturated_count", torch.count_nonzero(centred.abs() > reach))


def put_softmax(c: _Collector, scope: str, key: Any, y: torch.Tensor, dim: int, log: bool) -> None:
    """Mean max-probability and entropy / ln(C) of a (log-)probability tensor."""
    classes = y.shape[dim]
    if classes < 2:
        return
    y = y.float()
    logp = y if log else y.clamp_min(1e-30).log()
    p = logp.exp()
    # An entry with probability exactly 0 is masked (causal attention, padding) or underflowed.
    # Entropy is taken over the admissible entries of each row, normalised by ln(count); rows
    # with a single admissible entry are counted apart as one-hot rows: a few of them are
    # masks (the first position of causal attention), most of them mean saturation.
    admissible = (logp > -1e20).sum(dim) if log else (p > 0).sum(dim)
    rows = (admissible >= 2).float()
    count = rows.sum().clamp_min(1.0)
    plogp = torch.where(p > 0, p * logp, torch.zeros_like(p))
    entropy = -plogp.sum(dim) / admissible.clamp_min(2).float().log()
    c.put(scope, key, "maxprob", p.amax(dim).mean())
    c.put(scope, key, "entropy", (entropy * rows).sum() / count)
    c.put(scope, key, "onehot_rows", 1.0 - rows.mean())
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
              rows: bool = False) -> None:
    """Per tensor: ``rms``, ``low``, ``high`` (and ``mean``; duplicate-unit candidates for weights).

    Reductions run in place, without copies; the norms of all tensors of one dtype and device
    come from one fused call. std, absmax and spread are derived on the host (:func:`_derive`)."""
    for items in _grouped(tensors, lambda t: (t.dtype, t.device)):
        names = [n for n, _ in items]
        values = [t for _, t in items]
        acc = _acc(values[0])
        norms = torch._foreach_norm(values, 2, dtype=acc)
        c.put_many(scope, names, "norm", torch.stack(norms))
        for name, t in items:
            c.const(scope, name, "numel", float(t.numel()))
            if mean:
                c.put(scope, name, "mean", t.mean(dtype=acc))
            low, high = torch.aminmax(t)
            c.put(scope, name, "low", low)
            c.put(scope, name, "high", high)
            if rows and t.dim() >= 2:
                _duplicate_rows(c, scope, name, t)


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


def unit_matrix(w: torch.Tensor, layout: str) -> torch.Tensor:
    """The weight as ``(units, fan)``: one row per unit, without a copy."""
    return w.t() if layout == "in_out" and w.dim() == 2 else w.reshape(w.shape[0], -1)


def _duplicate_rows(c: _Collector, scope: str, name: str, w: torch.Tensor) -> None:
    """Candidates for units that are exact copies of another unit, on the device and without a sync.

    Each unit (its weight row and its bias) is hashed to two float32 keys: its projections on two
    fixed random directions. Equal units have equal keys; sorting by the keys puts them side by
    side, and neighbours with equal keys are the candidates. Distinct units share one key by chance
    (188 pairs in a 150k x 1024 head at N(0, 0.02)), both keys far more rarely (about once in 10^5
    such layers), but a chance is not a proof: the candidates are compared in full on the host
    (:func:`confirm_duplicates`), and only then counted."""
    units = c.units.get(name, Units())
    matrix = unit_matrix(w, units.layout)
    rows, fan = matrix.shape
    c.const(scope, name, "rows", float(rows))
    if units.groups > 1:
        c.const(scope, name, "groups", float(units.groups))
    if rows < 2 or rows // max(units.groups, 1) < 2:
        c.const(scope, name, "dup_rows", 0.0)
        return
    work = matrix.float() if matrix.dtype in (torch.float16, torch.bfloat16) else matrix  # half keys would collide
    dirs = (c.direction(2 * (fan + 1), work.device, work.dtype) - 1.0).view(2, fan + 1)  # zero mean: independent keys
    keys = work @ dirs[:, :fan].t()
    bias = units.bias.detach() if units.bias is not None and units.bias.numel() == rows else None
    if bias is not None:
        keys = keys + bias.to(keys.dtype)[:, None] * dirs[:, fan]
        c.const(scope, name, "biased", 1.0)
    # The two float32 keys' bits as one 64-bit integer: a single sort groups equal keys.
    bits = keys.float().view(torch.int32).to(torch.int64)
    hashed = (bits[:, 0] << 32) | (bits[:, 1] & 0xFFFFFFFF)
    ranked, order = hashed.sort()
    same = ranked[1:] == ranked[:-1]
    if units.groups > 1:  # only units of one group can be copies: the group becomes the leading key
        group = torch.arange(rows, device=order.device) // (rows // units.groups)
        order = order[group[order].argsort(stable=True)]
        ranked, ranked_group = hashed[order], group[order]
        same = (ranked[1:] == ranked[:-1]) & (ranked_group[1:] == ranked_group[:-1])
    c.put(scope, name, "dup_candidates", torch.count_nonzero(same))
    c.pending.append(_Pending(name, matrix, bias, order, same))


def confirm_duplicates(c: _Collector, result: ProbeResult, chunk: int = 4096) -> None:
    """Compare each candidate pair of units in full (weights and bias) and set ``dup_rows``: the number
    of units that are exact copies of another unit of their layer. Runs on the host, after the one
    transfer, and only for weights that have candidates; the others get ``dup_rows = 0`` for free."""
    for item in c.pending:
        stats = result.params.get(item.name, {})
        if not stats.pop("dup_candidates", 0):
            stats["dup_rows"] = 0.0
            continue
        with torch.no_grad():
            first = item.order[:-1][item.same]
            second = item.order[1:][item.same]
            copies = 0
            for start in range(0, first.numel(), chunk):
                a, b = first[start:start + chunk], second[start:start + chunk]
                equal = (item.matrix[a] == item.matrix[b]).all(dim=1)
                if item.bias is not None:
                    equal &= item.bias[a] == item.bias[b]
                copies += int(torch.count_nonzero(equal))
        stats["dup_rows"] = float(copies)
    c.pending = []


def _derive(stats: Dict[str, float]) -> None:
    """Host-side: rms from the norm, std from rms and mean, absmax and spread from the extremes,
    dead units and the saturated fraction from their counts."""
    numel = max(stats.get("numel", 1.0), 1.0)
    if "norm" in stats:
        stats["rms"] = stats.pop("norm") / math.sqrt(numel)
    if "alive" in stats:
        stats["dead"] = stats.pop("units") - stats.pop("alive")
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
                 units: Optional[Dict[str, Units]] = None) -> None:
    """Weights: scale, extremes and duplicated units. Biases: the mean is all a rule uses
    (IL003 names a large negative bias)."""
    weights = [(n, p) for n, p in params if p.dim() >= 2]
    biases = [(n, p) for n, p in params if p.dim() < 2]
    c.units = units or {}
    c.pending = []
    # Two key directions per unit and one entry each for the bias: one vector serves every layer.
    c.longest_row = 2 * (max((p[0].numel() for _, p in weights), default=0) + 1)
    summarise(c, "params", weights, mean=False, rows=True)
    for items in _grouped(biases, lambda b: (b.shape, b.dtype, b.device)):
        stack = torch.stack([b for _, b in items]).reshape(len(items), -1)
        c.put_many("params", [n for n, _ in items], "mean", stack.mean(dim=1, dtype=_acc(stack)))


def weight_units(graph: Graph, model: nn.Module, named: Dict[str, torch.Tensor]) -> Dict[str, Units]:
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
            groups = _conv_groups(graph, op, modules.get(op.module), named[name])
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


def _conv_groups(graph: Graph, op: Op, module: Optional[nn.Module], w: torch.Tensor) -> int:
    """The module's ``groups``, else input channels / the weight's channels per group (a functional conv)."""
    if isinstance(module, nn.modules.conv._ConvNd) and module.weight is w:
        return int(module.groups)
    shape = graph[op.inputs[0]].attrs.get("shape") if op.inputs else None
    if not shape or len(shape) < w.dim() - 1:
        return 1
    channels = shape[1] if len(shape) == w.dim() else shape[0]  # batched (N, C, ...) or unbatched (C, ...)
    return max(int(channels) // int(w.shape[1]), 1)


def used_params(graph: Graph) -> List[str]:
    """Names of the parameters of the weight layers (Linear, Conv): the ones the rules judge."""
    return list(dict.fromkeys(name for op in graph if op.kind in O.WEIGHT_KINDS for name in op.params.values()))


def run_probe(cap: Capture, args: Tuple[Any, ...], kwargs: Dict[str, Any], *, logits: bool = False,
              backward: bool = True, forward: bool = True) -> ProbeResult:
    """Run the probe through ``cap`` and return host-side statistics.

    With ``forward=False`` only the static parameter statistics are computed (for models whose
    tensors hold no data, such as models on the ``meta`` device).
    """
    result = ProbeResult()
    c = _Collector()
    named = dict(cap.model.named_parameters())
    if forward:
        observer = Observer(lambda: cap.graph, c)
        grad_wanted = backward and any(p.requires_grad for p in named.values())
        with torch.set_grad_enabled(grad_wanted):
            out = cap.run(args, kwargs, observer)
            result.forward_ran = True
            main = primary_output(out)
            if main is not None and logits:
                put_softmax(c, "logits", "logits", torch.log_softmax(main.detach().float(), -1), -1, log=True)
            if grad_wanted:
                _backward(cap, named, main, c, result)
            del out, main
    params = [(n, named[n]) for n in used_params(cap.graph) if n in named]
    params = [(n, p) for n, p in params if p.is_floating_point() and p.numel() > 0 and p.device.type != "meta"]
    _param_stats(c, params, weight_units(cap.graph, cap.model, named))
    c.finish(result)
    confirm_duplicates(c, result)
    return result


def _backward(cap: Capture, named: Dict[str, nn.Parameter], main: Optional[torch.Tensor], c: _Collector,
              result: ProbeResult) -> None:
    if main is None:
        result.notes.append("the backward probe was skipped: the model returns no floating-point tensor")
        return
    if not main.requires_grad:
        result.notes.append("the backward probe was skipped: the model output does not require grad")
        return
    # Only the weights IL006 judges: embeddings' gradients are sparse and large, and not needed.
    weights = [(n, named[n]) for op in cap.graph if op.kind in O.WEIGHT_KINDS
               for role, n in op.params.items() if role == "weight" and n in named and named[n].requires_grad]
    weights = list(dict(weights).items())
    if not weights:
        return
    gen = torch.Generator().manual_seed(0)
    cotangent = torch.randn(main.shape, generator=gen).to(main.device, main.dtype)
    grads = list(torch.autograd.grad([main], [p for _, p in weights], [cotangent], allow_unused=True))
    summarise(c, "grads", [(name, g) for (name, _), g in zip(weights, grads) if g is not None], mean=True)
    del grads
    result.backward_ran = True


@contextmanager
def preserved(model: nn.Module, seed: int) -> Iterator[None]:
    """Run the body with the model in train mode and seeded RNG, then restore everything."""
    flags = [(m, m.training) for m in model.modules()]
    saved_buffers = []
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None:
                saved_buffers.append((module, name, buf, buf.detach().clone()))
    grad_mode = torch.is_grad_enabled()
    cuda = [i for i in range(torch.cuda.device_count())] if torch.cuda.is_initialized() else []
    mps_state = torch.mps.get_rng_state() if torch.backends.mps.is_available() else None
    try:
        with torch.random.fork_rng(devices=cuda):
            # torch.manual_seed would also seed every lazily initialised accelerator backend,
            # which costs milliseconds per call; the devices fork_rng saved are enough.
            torch.default_generator.manual_seed(seed)
            if cuda:
                torch.cuda.manual_seed_all(seed)
            if mps_state is not None:
                torch.mps.manual_seed(seed)
            model.train()
            yield
    finally:
        for module, flag in flags:
            module.training = flag
        with torch.no_grad():
            for module, name, buf, copy in saved_buffers:
                module._buffers[name] = buf
                if buf.device.type != "meta":
                    buf.copy_(copy)
        if mps_state is not None:
            torch.mps.set_rng_state(mps_state)
        torch.set_grad_enabled(grad_mode)
