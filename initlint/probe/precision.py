"""The precision probe: the forward and backward pass again, under ``torch.autocast``.

With ``precision="fp16"`` or ``"bf16"``, :func:`run_precision_probe` runs the captured model twice
more on the probe batch, both times with dropout off and with the same loss:

* in the model's own dtype, for the weight gradients a full-precision step would see;
* under ``torch.autocast(device_type, dtype)``, measuring each op's output (largest magnitude, whether
  it holds an Inf or NaN, its dtype), the gradient reaching it, and each weight's gradient, the loss
  multiplied by the loss scale training would use (``GradScaler``'s initial 65536, else 1).

Nothing is kept but the statistics (:class:`PrecisionStats`). The caller runs it inside
:func:`initlint.probe.guard.guarded`; the backward passes run the autograd engine as ``torch.autograd.grad``
does (:func:`~initlint.capture.base.grad_without_dropout`), so no ``.grad`` is touched, and the autocast state is the context manager's, restored on exit.
"""
from __future__ import annotations

import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..capture import Capture
from ..capture import ops as O
from ..capture.base import grad_without_dropout
from ..capture.graph import Graph, Op
from ..capture.nested import tensors as _tensors
from ..errors import UsageError
from . import draw
from .run import primary_output, unusual_kind
from .step import as_given

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
"""The precisions :func:`initlint.audit` accepts, and the autocast dtype of each."""
SCALER_INIT_SCALE = 65536.0
"""``torch.amp.GradScaler()``'s default ``init_scale`` (2**16): the loss scale of the first step."""


@dataclass(frozen=True)
class OpPrecision:
    """One op's output under autocast, and the gradient that reached it."""

    absmax: float
    """Largest magnitude of the output (``inf`` or ``nan`` when it holds one)."""
    finite: bool
    dtype: str
    """The output's dtype under autocast (``float16``, ``bfloat16``, ``float32``)."""
    grad_absmax: Optional[float] = None
    """Largest magnitude of the gradient with respect to the output (None: none reached it)."""
    grad_finite: Optional[bool] = None


@dataclass(frozen=True)
class WeightPrecision:
    """One weight's gradient under autocast against the same gradient in the model's own dtype."""

    absmax: float
    """Largest magnitude of the autocast gradient (at the loss scale)."""
    finite: bool
    nonzero: int
    """Entries that are nonzero in the full-precision gradient."""
    flushed: int
    """Of those, entries that are exactly zero in the autocast gradient: lost to underflow."""

    @property
    def share(self) -> float:
        """The share of the weight's gradient entries lost to underflow."""
        return self.flushed / self.nonzero if self.nonzero else 0.0


@dataclass
class PrecisionStats:
    """What the precision probe measured (host-side numbers only)."""

    precision: str
    """``fp16`` or ``bf16``."""
    scale: float
    """The loss scale the autocast backward ran at."""
    loss: str = ""
    """The loss the backward passes differentiated, in words."""
    ops: Dict[int, OpPrecision] = field(default_factory=dict)
    """Per op of the audited graph."""
    weights: Dict[str, WeightPrecision] = field(default_factory=dict)
    """Per weight of a Linear/Conv layer."""
    backward_ran: bool = False
    reference_finite: bool = True
    """Whether the full-precision loss and gradients were finite (if not, that is IL009's finding)."""
    notes: List[str] = field(default_factory=list)


def autocast_dtype(precision: Optional[str], device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype of ``precision`` on ``device`` (None for no precision); :class:`UsageError`
    for an unknown precision or one the device cannot autocast."""
    if precision is None:
        return None
    if precision not in DTYPES:
        raise UsageError(f"unknown precision '{precision}'; use fp16 or bf16")
    dtype = DTYPES[precision]
    if not torch.amp.is_autocast_available(device.type):
        raise UsageError(f"precision {precision} needs torch.autocast, which the device '{device}' does not have; "
                         f"audit on cpu or cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unsupported dtype is a warning and a disabled autocast
        with torch.autocast(device.type, dtype=dtype):
            enabled = torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type) == dtype
    if not enabled:
        raise UsageError(f"the device '{device}' cannot autocast to {precision} ({dtype}); "
                         f"use {'bf16' if precision == 'fp16' else 'fp16'} or another device")
    return dtype


class _Observer:
    """Per op: the output's largest magnitude and dtype; a hook on the output for its gradient."""

    def __init__(self, record_grads: bool) -> None:
        self.values: Dict[int, Tuple[torch.Tensor, str]] = {}
        self.grads: Dict[int, torch.Tensor] = {}
        self.record_grads = record_grads
        self.ids: Optional[Dict[int, int]] = None
        """Op ids of the run -> the audited graph's, when the capture recorded a new graph (None: the same)."""

    def __call__(self, op: Op, value: Any) -> None:
        t = value if isinstance(value, torch.Tensor) else next(
            (v for v in _tensors(value) if v.is_floating_point()), None)
        if t is None or not t.is_floating_point() or t.numel() == 0 or unusual_kind(t) is not None:
            return
        if op.kind in ("view", "dropout", "identity", "empty", "input"):
            return
        with torch.no_grad():
            self.values[op.id] = (t.detach().abs().amax().float(), str(t.dtype).replace("torch.", ""))
        if self.record_grads and t.requires_grad:
            t.register_hook(lambda g, i=op.id: self._grad(i, g))

    def _grad(self, op_id: int, g: torch.Tensor) -> None:
        with torch.no_grad():
            peak = g.detach().abs().amax().float()
            self.grads[op_id] = peak if op_id not in self.grads else torch.maximum(self.grads[op_id], peak)


LossFn = Callable[[Any, Any], torch.Tensor]


def default_loss(out: Any, logits: bool, seed: int) -> Tuple[Optional[torch.Tensor], str]:
    """The loss of the precision probe: the model's own (a ``loss`` field of its output); cross-entropy
    against random labels when the output is logits; else the mean squared error against a standard-normal
    target. Both reduce by the mean, as training losses do, which sets the scale of the gradients."""
    own = getattr(out, "loss", None) if not isinstance(out, dict) else out.get("loss")
    if isinstance(own, torch.Tensor) and own.dim() == 0 and own.is_floating_point():
        return own, "the model's own loss"
    main = primary_output(out)
    if main is None or not main.requires_grad:
        return None, ""
    gen = draw.generator(main.device, seed)
    if logits and main.dim() >= 2 and main.shape[-1] >= 2:
        flat = main.reshape(-1, main.shape[-1]).float()
        labels = draw.randint(main.shape[-1], (flat.shape[0],), gen, main.device)
        return F.cross_entropy(flat, labels), "cross-entropy against random labels"
    target = draw.randn(main.shape, gen, main.device, torch.float32)
    return F.mse_loss(main.float(), target), "the mean squared error against a random target"


def run_precision_probe(cap: Capture, args: Tuple[Any, ...], kwargs: Dict[str, Any], precision: str, *,
                        grad_scaler: bool = False, logits: bool = False, seed: int = 0,
                        loss: Optional[LossFn] = None) -> PrecisionStats:
    """Measure the model under ``torch.autocast`` at ``precision`` (see the module docstring).

    ``loss(output, inputs)``, when given, replaces :func:`default_loss`. Run inside the state guard."""
    device = _device(cap.model)
    dtype = autocast_dtype(precision, device)
    stats = PrecisionStats(precision, SCALER_INIT_SCALE if grad_scaler and precision == "fp16" else 1.0)
    weights = _weights(cap.graph, dict(cap.model.named_parameters()))
    backward = precision == "fp16"  # bfloat16 has float32's range: its gradients neither overflow nor underflow
    ref_grads: Dict[str, torch.Tensor] = {}
    if backward:
        ref_grads, _ = _pass(cap, args, kwargs, weights, None, logits, seed, loss, stats, 1.0, backward)
        # one transfer for every gradient: a float64 sum of float32 values is finite exactly when each is
        stats.reference_finite = not ref_grads or bool(torch.stack(
            [g.detach().double().sum() for g in ref_grads.values()]).isfinite().all())
    grads, observer = _pass(cap, args, kwargs, weights, dtype, logits, seed, loss, stats, stats.scale, backward)
    _collect(stats, observer, grads, ref_grads)
    return stats


def _device(model: nn.Module) -> torch.device:
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


def _weights(graph: Graph, named: Dict[str, nn.Parameter]) -> Dict[str, nn.Parameter]:
    """The weights of the Linear/Conv layers that require grad, in graph order."""
    out: Dict[str, nn.Parameter] = {}
    for op in graph:
        name = op.params.get("weight")
        if op.kind in O.WEIGHT_KINDS and name in named and named[name].requires_grad:
            out.setdefault(name, named[name])
    return out


def _pass(cap: Capture, args: Tuple[Any, ...], kwargs: Dict[str, Any], weights: Dict[str, nn.Parameter],
          dtype: Optional[torch.dtype], logits: bool, seed: int, loss: Optional[LossFn], stats: PrecisionStats,
          scale: float, backward: bool) -> Tuple[Dict[str, torch.Tensor], "_Observer"]:
    """One forward (under autocast when ``dtype``) and, with ``backward``, the loss's gradients of ``weights``
    (times ``scale``); returns them (empty without a backward pass) and the observer of the forward."""
    observer = _Observer(record_grads=dtype is not None and backward)
    kept = cap.graph
    value, what = None, ""
    try:
        with torch.set_grad_enabled(backward), \
                (torch.autocast(_device(cap.model).type, dtype=dtype) if dtype is not None else nullcontext()):
            out = cap.run(args, kwargs, observer)
            if kept is not cap.graph:
                observer.ids = _aligned(cap.graph, kept)
            if backward:
                value, what = (loss(out, as_given(args, kwargs)), "the loss given") if loss is not None else \
                    default_loss(out, logits, seed)
    finally:
        cap.graph = kept  # the runtime capture records a fresh graph on every run
    if not backward:
        return {}, observer
    if not isinstance(value, torch.Tensor) or not value.requires_grad or not weights:
        if dtype is not None:
            stats.notes.append("the precision probe ran no backward pass: the output carries no gradient")
        return {}, observer
    stats.loss = what
    grads = grad_without_dropout([value.float() * scale], list(weights.values()))
    stats.backward_ran = stats.backward_ran or dtype is not None
    return {n: g.detach() for n, g in zip(weights, grads) if g is not None}, observer


def _aligned(new: Graph, old: Graph) -> Dict[int, int]:
    """Op ids of a graph recorded again (the runtime capture records one per run) -> the audited graph's.

    Under autocast a model may run extra ops (``hidden.to(self.wo.weight.dtype)`` in T5); ops are matched
    by module, kind and call, and their order among those of the same kind in the module."""
    def keys(graph: Graph) -> Dict[Tuple[str, str, str, int], int]:
        seen: Dict[Tuple[str, str, str], int] = {}
        out = {}
        for op in graph:
            base = (op.module, op.kind, op.target)
            seen[base] = seen.get(base, -1) + 1
            out[base + (seen[base],)] = op.id
        return out

    before = keys(old)
    return {i: before[key] for key, i in keys(new).items() if key in before}


def _collect(stats: PrecisionStats, observer: _Observer, grads: Dict[str, torch.Tensor],
             ref_grads: Dict[str, torch.Tensor]) -> None:
    """Everything measured, to the host in one transfer."""
    if observer.ids is not None:
        observer.values = {observer.ids[i]: v for i, v in observer.values.items() if i in observer.ids}
        observer.grads = {observer.ids[i]: v for i, v in observer.grads.items() if i in observer.ids}
    op_ids = list(observer.values)
    grad_ids = [i for i in op_ids if i in observer.grads]
    names = [n for n in grads if n in ref_grads]
    with torch.no_grad():
        parts = [torch.stack([observer.values[i][0] for i in op_ids]) if op_ids else torch.zeros(0),
                 torch.stack([observer.grads[i] for i in grad_ids]) if grad_ids else torch.zeros(0)]
        for n in names:
            g, ref = grads[n], ref_grads[n]
            nonzero = ref != 0
            parts.append(torch.stack([g.abs().amax().float(), torch.count_nonzero(nonzero).float(),
                                      torch.count_nonzero(nonzero & (g == 0)).float()]))
        flat = torch.cat([p.reshape(-1).double().cpu() for p in parts]).tolist()
    values, flat = flat[:len(op_ids)], flat[len(op_ids):]
    grad_values, flat = dict(zip(grad_ids, flat[:len(grad_ids)])), flat[len(grad_ids):]
    for i, v in zip(op_ids, values):
        g = grad_values.get(i)
        stats.ops[i] = OpPrecision(v, _finite(v), observer.values[i][1], g, None if g is None else _finite(g))
    for k, n in enumerate(names):
        peak, nonzero, flushed = flat[3 * k:3 * k + 3]
        stats.weights[n] = WeightPrecision(peak, _finite(peak), int(nonzero), int(flushed))


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))
