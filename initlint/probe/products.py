"""Weight gradients from the products that use the weight (``y = x @ w``, a lookup, a 2-D convolution):
formed from the kept inputs and output gradients as Gram products, without forming the gradient."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..capture import ops as O
from ..capture.graph import Graph

from .collector import _Collector


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
    paired = [(name, [(p, g) for p in products if (g := next(it)) is not None]) for name, products in by_products.items()]
    alike: Dict[Any, List[Tuple[str, _Product, torch.Tensor]]] = {}
    for name, pairs in paired:  # weights of one plain product each, of one shape: measured in a batch
        if len(pairs) == 1 and not pairs[0][0].lookup and pairs[0][0].conv is None:
            p, g = pairs[0]
            wide = torch.float64 in (named[name].dtype, p.x.dtype, g.dtype)
            alike.setdefault((p.rows, p.fan_in, p.fan_out, wide, g.device), []).append((name, p, g))
    batched = set()
    for (rows, fan_in, fan_out, wide, _), items in alike.items():
        if len(items) > 1:
            _batched_grads(c, items, rows, fan_in, fan_out, torch.float64 if wide else torch.float32, named)
            batched.update(name for name, _, _ in items)
    for name, pairs in paired:
        if not pairs or name in batched:
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
        # the squared norm and the sum; the root and the mean are taken on the host (two kernels fewer)
        c.put("grads", name, "norm_squared", torch.dot(gram.reshape(-1), other.reshape(-1)))
        c.put("grads", name, "sum", torch.dot(a.sum(1), sums))
        c.const("grads", name, "numel", float(w.numel()))
        c.overflow[name] = pairs


_BATCHED = 1 << 22
"""Elements of products' rows (inputs and output gradients) stacked at once by :func:`_batched_grads`."""


def _batched_grads(c: _Collector, items: List[Tuple[str, _Product, torch.Tensor]], rows: int, fan_in: int,
                   fan_out: int, dtype: torch.dtype, named: Dict[str, nn.Parameter]) -> None:
    """:func:`_product_grads` for weights of one plain product each, all of one shape: their Gram products as
    batched products, so that a stack of equal layers launches its kernels once per batch, not once per layer
    (the same values up to rounding: batched products sum in another order)."""
    at_once = max(1, _BATCHED // max(rows * (fan_in + fan_out), 1))
    for start in range(0, len(items), at_once):
        part = items[start:start + at_once]
        a = torch.stack([p.x.reshape(rows, fan_in) for _, p, _ in part]).to(dtype)
        b = torch.stack([g.reshape(rows, fan_out) for _, _, g in part]).to(dtype)
        names = [name for name, _, _ in part]
        c.put_many("grads", names, "norm_squared", torch.sum((a @ a.mT) * (b @ b.mT), dim=(1, 2)))
        c.put_many("grads", names, "sum", torch.linalg.vecdot(a.sum(2), b.sum(2), dim=1))
        for name, p, g in part:
            c.const("grads", name, "numel", float(named[name].numel()))
            c.overflow[name] = [(p, g)]


def _rows(parts: List[torch.Tensor], width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``parts`` (rows of ``width``) stacked, in ``dtype`` (no copy for one part already in it)."""
    if not parts:
        return torch.zeros(0, width, dtype=dtype, device=device)
    return (torch.cat([t.to(dtype) for t in parts]) if len(parts) > 1 else parts[0].to(dtype))
