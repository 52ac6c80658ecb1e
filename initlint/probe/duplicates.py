"""Units that are exact copies of another unit of their layer (IL008): keys on the device, candidates
confirmed on the host after the probe's one transfer."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import draw

from .collector import _Collector



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


def confirm_duplicates(c: _Collector, result: Any, chunk: int = 4096) -> None:
    """Compare each candidate pair of units in full (weights and bias) and set ``dup_rows`` in ``result``
    (the :class:`~initlint.probe.run.ProbeResult`): the number of units that are exact copies of another
    unit of their layer. Runs on the host, after the one transfer, and only for weights that have
    candidates; the others get ``dup_rows = 0`` for free."""
    for item in c.pending:
        stats = result.params.get(item.name, {})
        stats["dup_rows"] = float(_copies(item, chunk)) if stats.pop("dup_candidates", 0) else 0.0
    c.pending = []


def queue_candidates(c: _Collector) -> None:
    """Send the flags of :func:`confirm_extremes` with the one transfer."""
    for name, flag in c.candidates.items():
        c.put("params", name, "maybe_flat", flag.float())


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
        if item.matrix.shape[1] > KEYED and first.numel():  # the keys did not read whole units
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
