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
TOKEN_KINDS = O.NORM_KINDS | {"add", "attention", "linear", "embedding", "input"}
"""Ops whose token vectors IL013 may compare: the residual stream (adds), norms, attention and
projections; :func:`put_token_cosine` runs on their 3-D outputs."""
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
    ``dup_rows``, ``rows`` (and ``mean`` when all its entries are equal); per bias: ``mean``."""
    grads: Dict[str, Dict[str, float]] = field(default_factory=dict)
    """Per weight parameter: ``std``, ``absmax`` of its gradient under the backward probe."""
    logits: Optional[Dict[str, float]] = None
    """Softmax statistics of the model output when it is logits (declared, or certain from the
    output: see :func:`logits_output`): ``maxprob``, ``entropy``, ``onehot_rows``, ``classes``,
    ``xent`` (expected initial cross-entropy) and ``declared`` (1.0 when the caller said so)."""
    logits_op: Optional[int] = None
    """The op that produced the logits, when the capture knows it."""
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
        if y.dim() == 3 and op.kind in TOKEN_KINDS and y.shape[-1] >= 16:
            self._tokens(op, y)

    def attention(self, op: Op, call: O.AttentionCall) -> None:
        """Called by the capture with the inputs of an attention op (after the op itself)."""
        put_attention(self.c, op.id, call)

    def _tokens(self, op: Op, y: torch.Tensor) -> None:
        """Token similarity of a ``(batch, tokens, features)`` output; the batch axis is the one whose
        size is the probe batch's (axis 0 when both are)."""
        graph = self.graph_of()
        first = graph[graph.inputs[0]].shape if graph.inputs else None
        batch = first[0] if first else None
        batch_first = not (y.shape[1] == batch and y.shape[0] != batch)
        put_token_cosine(self.c, op.id, y, batch_first)

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
    admissible = (logp > -1e20).sum(-1) if log else (y > 0).sum(-1)
    rows = (admissible >= 2).float()
    count = rows.sum().clamp_min(1.0)
    entropy = -torch.special.xlogy(p, p).sum(-1) / admissible.clamp_min(2).float().log()
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
              rows: bool = False) -> None:
    """Per tensor: ``rms``, ``low``, ``high`` (and ``mean``; ``dup_rows``/``rows`` for matrices).

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
            if rows and t.dim() >= 2 and t.shape[0] >= 2:
                _duplicate_rows(c, scope, name, t)


def _grouped(tensors: List[Tuple[str, torch.Tensor]], key: Any) -> List[List[Tuple[str, torch.Tensor]]]:
    """``(name, detached tensor)`` pairs in groups of equal ``key(tensor)``, in first-seen order."""
    groups: Dict[Any, List[Tuple[str, torch.Tensor]]] = {}
    for name, t in tensors:
        groups.setdefault(key(t), []).append((name, t.detach()))
    return list(groups.values())


def _duplicate_rows(c: _Collector, scope: str, name: str, w: torch.Tensor) -> None:
    """Count of rows (units) whose weights equal another row's: equal rows project identically
    on a random direction, so sort the projections and count equal neighbours."""
    matrix = w.reshape(w.shape[0], -1)
    if matrix.dtype in (torch.float16, torch.bfloat16):
        matrix = matrix.float()  # a half-precision projection would make distinct rows collide
    proj = (matrix @ c.direction(matrix.shape[1], matrix.device, matrix.dtype)).sort().values
    c.put(scope, name, "dup_rows", (proj[1:] == proj[:-1]).sum())
    c.const(scope, name, "rows", float(matrix.shape[0]))


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


def _param_stats(c: _Collector, params: List[Tuple[str, torch.Tensor]]) -> None:
    """Weights: scale, extremes and duplicated rows. Biases: the mean is all a rule uses
    (IL003 names a large negative bias)."""
    weights = [(n, p) for n, p in params if p.dim() >= 2]
    biases = [(n, p) for n, p in params if p.dim() < 2]
    c.longest_row = max((p[0].numel() for _, p in weights), default=0)
    summarise(c, "params", weights, mean=False, rows=True)
    for items in _grouped(biases, lambda b: (b.shape, b.dtype, b.device)):
        stack = torch.stack([b for _, b in items]).reshape(len(items), -1)
        c.put_many("params", [n for n, _ in items], "mean", stack.mean(dim=1, dtype=_acc(stack)))


def used_params(graph: Graph) -> List[str]:
    """Names of the parameters of the weight layers (Linear, Conv): the ones the rules judge."""
    return list(dict.fromkeys(name for op in graph if op.kind in O.WEIGHT_KINDS for name in op.params.values()))


def run_probe(cap: Capture, args: Tuple[Any, ...], kwargs: Dict[str, Any], *, logits: Optional[bool] = False,
              backward: bool = True, forward: bool = True) -> ProbeResult:
    """Run the probe through ``cap`` and return host-side statistics.

    With ``forward=False`` only the static parameter statistics are computed (for models whose
    tensors hold no data, such as models on the ``meta`` device). ``logits``: True, the output
    is logits; False, it is not; None, it is when that is certain (see :func:`logits_output`).
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
            _put_logits(c, cap, out, main, logits, result)
            if grad_wanted:
                _backward(cap, named, main, c, result)
            del out, main
    params = [(n, named[n]) for n in used_params(cap.graph) if n in named]
    params = [(n, p) for n, p in params if p.is_floating_point() and p.numel() > 0 and p.device.type != "meta"]
    _param_stats(c, params)
    c.finish(result)
    return result


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


def _put_logits(c: _Collector, cap: Capture, out: Any, main: Optional[torch.Tensor], logits: Optional[bool],
                result: ProbeResult) -> None:
    target = logits_output(out, main, cap, logits)
    if target is None:
        return
    rows = sample_rows(target.detach(), -1).float()
    put_softmax(c, "logits", "logits", torch.log_softmax(rows, -1), -1, log=True, cross_entropy=True)
    c.const("logits", "logits", "declared", 1.0 if logits else 0.0)
    result.logits_op = cap.producer_of(target, out)


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


# ------------------------------------------------------------------ attention rows
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
    biases above :data:`~initlint.ops.MASKED_BIAS`.
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
        admissible = allowed.sum(-1)
        # a row with no admissible key would be NaN: give it uniform scores (it is counted apart)
        scores = scores.masked_fill(~allowed, float("-inf")).masked_fill((admissible == 0)[..., None], 0.0)
        pairs = allowed.sum().clamp_min(1)
        raw_sq = raw.square().masked_fill(~allowed, 0.0).sum()
    logp = torch.log_softmax(scores, dim=-1)
    p = logp.exp()
    entropy = -torch.special.xlogy(p, p).sum(-1) / admissible.clamp_min(2).float().log()
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
    gram = torch.bmm(v, v.transpose(1, 2))
    off_diagonal = gram.sum() - gram.diagonal(dim1=1, dim2=2).sum()
    c.put("ops", key, "token_cos", off_diagonal / (v.shape[0] * count * (count - 1)))
