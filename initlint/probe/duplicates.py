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


class _Pending:
    """A weight whose duplicate-unit candidates are confirmed on the host once their count is known.

    ``order`` (its units sorted by their keys) and ``same`` (whether each sorted unit's keys match the
    next one's) are its own tensors, or the batch's of :func:`_duplicate_rows_batched`, of which it has the
    units ``start:end`` (sorted weight by weight), cut out only when confirmed."""

    def __init__(self, name: str, matrix: torch.Tensor, bias: Optional[torch.Tensor], order: torch.Tensor,
                 same: torch.Tensor, groups: int = 1, span: Optional[Tuple[int, int]] = None) -> None:
        self.name, self.matrix, self.bias, self.groups = name, matrix, bias, groups
        self._order, self._same, self.span = order, same, span

    @property
    def order(self) -> torch.Tensor:
        if self.span is None:
            return self._order
        start, end = self.span
        return self._order[start:end] - start

    @property
    def same(self) -> torch.Tensor:
        if self.span is None:
            return self._same
        start, end = self.span
        return self._same[start:end - 1]


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


def duplicate_rows_all(c: _Collector, scope: str, weights: List[Tuple[str, torch.Tensor]]) -> None:
    """:func:`_duplicate_rows` for every weight: those without convolution groups in batches of one keyed
    width, dtype and device (:func:`_duplicate_rows_batched`), the grouped ones one by one."""
    batches: Dict[Any, List[Tuple[str, torch.Tensor, Optional[torch.Tensor]]]] = {}
    for name, w in weights:
        units = c.units.get(name, Units())
        if units.groups > 1:
            _duplicate_rows(c, scope, name, w)
            continue
        matrix = unit_matrix(w, units.layout)
        rows, fan = matrix.shape
        c.const(scope, name, "rows", float(rows))
        if rows < 2:
            c.const(scope, name, "dup_rows", 0.0)
            continue
        bias = units.bias.detach() if units.bias is not None and units.bias.numel() == rows else None
        batches.setdefault((min(fan, KEYED), w.dtype, w.device), []).append((name, matrix, bias))
    for (keyed, _, _), items in batches.items():
        _duplicate_rows_batched(c, scope, items, keyed)


def unit_owners(rows: List[int], device: torch.device) -> torch.Tensor:
    """For units of several weights laid end to end (``rows[i]`` units of weight ``i``), the index of each
    unit's weight, made on the device (a host list copied there would make CUDA wait): two ops per run of
    weights with equal unit counts, not one per weight."""
    runs: List[Tuple[int, int, int]] = []  # (first weight, weights, units each)
    for i, n in enumerate(rows):
        if runs and runs[-1][2] == n:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, n)
        else:
            runs.append((i, 1, n))
    return torch.cat([torch.arange(first, first + count, device=device).repeat_interleave(n)
                      for first, count, n in runs])


def _duplicate_rows_batched(c: _Collector, scope: str, items: List[Tuple[str, torch.Tensor, Optional[torch.Tensor]]],
                            keyed: int) -> None:
    """:func:`_duplicate_rows` for weights of one dtype and device whose keys read ``keyed`` weights of each
    unit, without convolution groups: the units of all of them keyed in one product and sorted in one pass,
    weight by weight (by the weight, then by the keys), so that the ops are per batch, not per layer (a deep
    stack of equal layers, a ResNet's convolutions of many shapes). The keys are :func:`_duplicate_rows`'s,
    and the candidates are confirmed in full as its are, so the counts are the same."""
    items = sorted(items, key=lambda item: item[1].shape[0])  # weights of one unit count side by side
    names = [name for name, _, _ in items]
    rows = [m.shape[0] for _, m, _ in items]
    work = torch.cat([m[:, :keyed] for _, m, _ in items])  # (units of all, keyed)
    work = work.float() if work.dtype in (torch.float16, torch.bfloat16) else work  # half keys would collide
    dirs = (c.direction(2 * (keyed + 1), work.device, work.dtype) - 1.0).view(2, keyed + 1)  # zero mean
    keys = dirs[:, :keyed] @ work.t()  # (2, units of all)
    # weights of one unit count (a stack of equal layers) are sorted as rows of a matrix, each on its own;
    # of several, all at once by their weight and then by their keys
    equal = len(set(rows)) == 1
    weight = None if equal else unit_owners(rows, work.device)
    flagged = [i for i, name in enumerate(names) if name in c.candidates]
    if flagged:  # every unit's first weights alike: a candidate for a constant weight (see _duplicate_rows)
        if equal:
            per_weight = keys.view(2, len(items), rows[0])
            high, low, size = per_weight.amax(dim=2), per_weight.amin(dim=2), per_weight.abs().amax(dim=2)
        else:
            index = weight[None, :].expand(2, -1)
            high = keys.new_full((2, len(items)), -math.inf).scatter_reduce(1, index, keys, "amax")
            low = keys.new_full((2, len(items)), math.inf).scatter_reduce(1, index, keys, "amin")
            size = keys.new_zeros((2, len(items))).scatter_reduce(1, index, keys.abs(), "amax")
        alike = (high - low <= keyed * torch.finfo(keys.dtype).eps * size).all(dim=0)
        if len(flagged) == len(items):  # one op for all, not one per weight (no host list as an index)
            merged = torch.stack([c.candidates[n] for n in names]) | alike
            c.candidates.update(zip(names, merged.unbind()))
        else:
            parts = alike.unbind()
            for i in flagged:
                c.candidates[names[i]] = c.candidates[names[i]] | parts[i]
    biases = [b for _, _, b in items]
    if any(b is not None for b in biases):
        none = keys.new_zeros(max(rows))
        keys = keys + dirs[:, keyed:] * torch.cat([none[:n] if b is None else b.to(keys.dtype)
                                                   for b, n in zip(biases, rows)])[None, :]
        for name, b in zip(names, biases):
            if b is not None:
                c.const(scope, name, "biased", 1.0)
    ulps = 4 * math.isqrt(keyed) + 8
    if equal:
        bits = keys.float().view(torch.int32).to(torch.int64).view(2, len(items), rows[0]).transpose(0, 1)
        order = ((bits[:, 0] << 32) | (bits[:, 1] & 0xFFFFFFFF)).argsort(dim=1)  # (weights, units)
        ranked = bits.gather(2, order[:, None, :].expand(-1, 2, -1))
        same = ((ranked[:, :, 1:] - ranked[:, :, :-1]).abs() <= ulps).all(dim=1)  # (weights, units - 1)
        c.put_many(scope, names, "dup_candidates", torch.count_nonzero(same, dim=1).float())
        for (name, matrix, bias), o, s in zip(items, order.unbind(), same.unbind()):
            c.pending.append(_Pending(name, matrix, bias, o, s, 1))
        return
    bits, order = _key_order(keys, weight)
    ranked = bits[:, order]
    ranked_weight = weight[order]
    same = ((ranked[:, 1:] - ranked[:, :-1]).abs() <= ulps).all(dim=0) & (ranked_weight[1:] == ranked_weight[:-1])
    counts = torch.zeros(len(items), dtype=torch.float32, device=work.device)
    c.put_many(scope, names, "dup_candidates", counts.index_add_(0, ranked_weight[1:], same.float()))
    start = 0
    for (name, matrix, bias), n in zip(items, rows):
        c.pending.append(_Pending(name, matrix, bias, order, same, 1, (start, start + n)))
        start += n


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
    by_device: Dict[torch.device, List[str]] = {}
    for name, flag in c.candidates.items():
        by_device.setdefault(flag.device, []).append(name)
    for names in by_device.values():  # one op per device, not one per weight
        c.put_many("params", names, "maybe_flat", torch.stack([c.candidates[n] for n in names]).float())


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
