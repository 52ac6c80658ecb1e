"""What the probe collects during its passes: device scalars queued for the one transfer to the host
(:class:`_Collector`), and the records it keeps between the forward and the backward or the transfer: how a
weight's entries map to units, duplicate-unit candidates, the weight products whose gradients are formed
from their inputs."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

from . import draw


BATCHED_ELEMENTS = 1 << 22
"""Sample elements that wait for their batch (:meth:`_Collector.put_batched`) at most: 16 MB in float32."""


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
        self.discrete: Set[int] = set()
        """Ops whose output holds no floating-point tensor."""
        self.tracking = False
        """Whether the forward records gradients (the backward probe follows it)."""
        self.untracked: Set[int] = set()
        """Ops that ran with autograd off in a forward that records gradients: the model's own ``no_grad``."""
        self.checkpointed: Set[int] = set()
        """Ops that ran with autograd off inside reentrant activation checkpointing (not the model's no_grad)."""
        self.units: Dict[str, Any] = {}
        """Weight -> its :class:`~initlint.probe.duplicates.Units`."""
        self.pending: List[Any] = []
        """Duplicate-unit candidates to confirm (:class:`~initlint.probe.duplicates._Pending`)."""
        self.confirmed: Set[str] = set()
        """Weights whose duplicate units were confirmed early (:func:`confirm_duplicates_now`)."""
        self.weights: Dict[str, torch.Tensor] = {}
        """Weights measured without extremes: those that may be zero or constant get them on the host
        (:func:`confirm_extremes`)."""
        self.candidates: Dict[str, torch.Tensor] = {}
        """Per weight of :attr:`weights`: a device flag, its norm is 0 or its units' keys are all alike."""
        self.products: Optional[Dict[int, Any]] = None
        """Op id -> the weight product it computed (:meth:`StatsObserver.weight_product`); None: not kept."""
        self.named: Dict[str, torch.Tensor] = {}
        self.batched: Dict[Tuple[Any, ...], Tuple[Callable[[torch.Tensor], torch.Tensor], List[Any], List[torch.Tensor]]] = {}
        """Samples whose statistic is computed in one batch per name and shape (:meth:`put_batched`)."""
        self.batched_elements = 0
        self.overflow: Dict[str, List[Tuple[Any, torch.Tensor]]] = {}
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

    def put_batched(self, scope: str, key: Any, name: str, sample: torch.Tensor,
                    reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """A statistic of ``sample`` (the collector's own copy) computed later, together with the other samples
        of its name, shape, dtype and device: ``reduce`` maps the stacked samples ``(n, *shape)`` to their
        ``n`` values. One set of ops per batch instead of one per op of the model (the token similarity of
        every block); at most :data:`BATCHED_ELEMENTS` sample elements wait at a time."""
        group = self.batched.setdefault((scope, name, tuple(sample.shape), sample.dtype, sample.device),
                                        (reduce, [], []))
        group[1].append(key)
        group[2].append(sample)
        self.batched_elements += sample.numel()
        if self.batched_elements > BATCHED_ELEMENTS:
            self.flush()

    def flush(self) -> None:
        """Compute the waiting batched statistics (:meth:`put_batched`); each is then a value like any other."""
        batched, self.batched, self.batched_elements = self.batched, {}, 0
        for (scope, name, *_), (reduce, keys, samples) in batched.items():
            with torch.no_grad():
                values = reduce(torch.stack(samples))
            for key, value in zip(keys, values.unbind()):
                self.put(scope, key, name, value)

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

    def finish(self, result: Any) -> None:
        self.flush()
        result.shapes.update(self.shapes)
        result.discrete.update(self.discrete)
        result.untracked.update(self.untracked)
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


def _derive(stats: Dict[str, float]) -> None:
    """Host-side: rms from the norm, std from rms and mean, absmax and spread from the extremes,
    dead units and the saturated fraction from their counts."""
    numel = max(stats.get("numel", 1.0), 1.0)
    if "norm_squared" in stats:  # a Gram product's: rounding can take an exact 0 a little below
        stats["norm"] = math.sqrt(max(stats.pop("norm_squared"), 0.0))  # NaN stays NaN
    if "sum" in stats:
        stats["mean"] = stats.pop("sum") / numel
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
