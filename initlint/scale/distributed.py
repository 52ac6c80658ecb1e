"""Sharded audit inside a ``torch.distributed`` job (FSDP2 ``fully_shard``, DTensor tensor parallelism).

Every rank calls ``initlint.audit(model, local_batch)`` and gets the report of the unsharded
model probed with the global batch (the ranks' local batches concatenated in data-parallel
rank order). The user's model is never run: its forward would lazily initialise FSDP state,
unshard parameters and leave gradients behind. Instead the audit runs on a plain copy of the
module tree (original classes, no FSDP or tensor-parallel hooks) block by block, as the
streaming audit does (:mod:`initlint.scale.stream`), each block's weights gathered from their
shards with ``DTensor.full_tensor()`` just before it runs and released after; so weight
statistics, duplicate rows across shards included, are those of the unsharded weights.

Activations differ across data-parallel ranks and are reduced with torch.distributed
collectives over the data-parallel groups (the FSDP mesh; none under tensor parallelism
alone, where every rank sees the same batch): sums of squares, element counts and
saturated counts are summed, extremes take the min/max, a ReLU unit is alive when it is
alive on some rank (per-unit maxima), softmax means are averaged. Weight gradients are
summed across the data-parallel groups before they are summarised, and the backward
probe's random output direction is the slice of the global batch's direction that belongs
to the rank. Every rank ends with the same statistics, findings and report.

When one rank's probe fails (an out-of-memory error on one device, a local batch the model
refuses), every rank stops at its next collective with the same error naming that rank
(:mod:`initlint.scale.agreement`); no rank waits out the process group's timeout.
"""
from __future__ import annotations

import sys
import zlib
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from ..attempts import ForwardFailed
from ..capture import nested
from ..capture import Capture, RuntimeCapture, capture
from ..capture.graph import Graph
from ..inputs.load import LoadError
from ..probe import draw
from ..probe.run import ProbeResult, StatsObserver, _Collector
from .agreement import Agreement, RanksFailed
from .stream import (BlockProgress, Materialiser, Plan, StreamError, StreamProbe, _fx_called, _seeded, _swap,
                     _terminal_progress)

_SUMMED = frozenset({"norm", "lead_norm", "saturated_count"})
_NORMS = frozenset({"norm", "lead_norm"})
"""Norms combine as the root of the ranks' summed squares; their element counts (``_NUMELS``) add up."""
_NUMELS = frozenset({"numel", "lead_numel"})
_LOWEST = frozenset({"low"})
_HIGHEST = frozenset({"high"})
"""How a batch-dependent op statistic combines across data-parallel ranks (counts, ``*count``,
are summed too); any other (a softmax's mean max-probability, entropy, share of one-hot
rows) is averaged, which is exact for the equal local batches the audit requires."""


def _dtensor_type() -> Optional[type]:
    """DTensor if anything has imported it (a model can hold none otherwise; importing costs time)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def is_sharded(model: nn.Module) -> bool:
    """True when some parameter or buffer of ``model`` is a DTensor (FSDP2, tensor parallelism)."""
    dtensor = _dtensor_type()
    return dtensor is not None and any(isinstance(t, dtensor) for t in list(model.parameters()) + list(model.buffers()))


# ----------------------------------------------------------------------------- the plain copy
def _plain_class(cls: type) -> type:
    """The user's class behind FSDP2's ``FSDP<Class>`` subclass."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except Exception:
        return cls
    if issubclass(cls, FSDPModule):
        return next(c for c in cls.__mro__[1:] if issubclass(c, nn.Module) and not issubclass(c, FSDPModule))
    return cls


def skeleton(model: nn.Module) -> Tuple[nn.Module, Dict[int, torch.Tensor]]:
    """A copy of the module tree with the user's classes, no hooks and every tensor on the meta
    device with its global shape; and, per copied tensor id, the user's tensor it stands for.
    Nothing of the user's model is copied or changed (FSDP modules refuse ``deepcopy``)."""
    modules: Dict[int, nn.Module] = {}
    tensors: Dict[int, torch.Tensor] = {}
    sources: Dict[int, torch.Tensor] = {}

    def twin(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in tensors:
            meta = torch.empty(t.shape, dtype=t.dtype, device="meta")
            copy = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
            tensors[id(t)] = copy
            sources[id(copy)] = t
        return tensors[id(t)]

    def clone(m: nn.Module) -> nn.Module:
        if id(m) in modules:
            return modules[id(m)]
        cls = _plain_class(type(m))
        new = object.__new__(cls)
        state = dict(m.__dict__)
        for key, value in state.items():
            if "hook" in key and isinstance(value, dict):
                state[key] = type(value)()  # FSDP's and tensor parallelism's hooks stay on the user's model
        state["_parameters"] = {n: None if p is None else twin(p) for n, p in m._parameters.items()}
        state["_buffers"] = {n: None if b is None else twin(b) for n, b in m._buffers.items()}
        modules[id(m)] = new
        state["_modules"] = {n: None if c is None else clone(c) for n, c in m._modules.items()}
        object.__setattr__(new, "__dict__", state)
        return new

    return clone(model), sources


def _data_parallel_groups(model: nn.Module) -> List[Any]:
    """Process groups across which ranks hold different data: FSDP's shard group (and HSDP's
    replicate group); none under tensor parallelism alone."""
    groups: Dict[int, Any] = OrderedDict()
    for m in model.modules():
        get_state = getattr(m, "_get_fsdp_state", None)
        if get_state is None:
            continue
        for param_group in getattr(get_state(), "_fsdp_param_groups", None) or []:
            info = param_group.mesh_info
            for attr in ("shard_process_group", "replicate_process_group"):
                group = getattr(info, attr, None)
                if group is not None and dist.get_world_size(group) > 1:
                    groups.setdefault(id(group), group)
    return list(groups.values())


def _mesh_groups(model: nn.Module) -> List[Any]:
    """The process groups of every mesh the model's DTensors live on (one per mesh dimension):
    together they reach every rank that takes part in the gathers and reductions."""
    dtensor = _dtensor_type()
    meshes: Dict[int, Any] = OrderedDict()
    for t in list(model.parameters()) + list(model.buffers()):
        if dtensor is not None and isinstance(t, dtensor):
            meshes.setdefault(id(t.device_mesh), t.device_mesh)
    groups: Dict[int, Any] = OrderedDict()
    for mesh in meshes.values():
        for dim in range(mesh.ndim):
            group = mesh.get_group(dim)
            groups.setdefault(id(group), group)
    return list(groups.values())


# ----------------------------------------------------------------------------- gathering
class _Gathered(Materialiser):
    """Blocks get the unsharded values of the user's tensors (``full_tensor()`` of a DTensor)."""

    def __init__(self, plan: Plan, device: torch.device, sources: Dict[int, torch.Tensor],
                 agreement: Agreement) -> None:
        super().__init__(plan, device, None, 0)
        self.sources = sources
        self.dtensor = _dtensor_type()
        self.agreement = agreement

    def _skip_to(self, step: int) -> None:
        return  # values come from the shards, not from a random stream

    def _materialise(self, group: Any) -> None:
        self.spares.clear()  # the gathers bring their own storage
        self.agreement.check()
        with torch.no_grad():
            for t in group.tensors:  # the same order on every rank: the gathers are collectives
                if id(t) in self.live:
                    continue
                src = self.sources[id(t)]
                value = src.full_tensor() if isinstance(src, self.dtensor) else src.detach().clone()
                if t.device.type == "meta":
                    _swap(t, value.to(self.device))
                else:
                    t.untyped_storage().resize_(t.numel() * t.element_size())
                    t.copy_(value)
                self.live.add(id(t))


# ----------------------------------------------------------------------------- reductions
def batch_dependent(graph: Graph, batch: int, shapes: Dict[int, Tuple[int, ...]]) -> Set[int]:
    """Ops whose output depends on the probe batch: reachable from an input whose first axis is the batch."""
    found: Set[int] = set()
    for op in graph:
        if op.kind == "input":
            shape = shapes.get(op.id, op.shape)
            if shape and shape[0] == batch:
                found.add(op.id)
        elif any(i in found for i in op.inputs):
            found.add(op.id)
    return found


class _DPCollector(_Collector):
    """Reduces the batch-dependent forward statistics over the data-parallel groups before the host transfer."""

    def __init__(self, groups: List[Any], graph_of: Callable[[], Graph], batch: int, agreement: Agreement) -> None:
        super().__init__()
        self.groups = groups
        self.agreement = agreement
        self.graph_of = graph_of
        self.batch = batch
        self.peaks: Dict[int, torch.Tensor] = {}
        self.dependent: Set[int] = set()
        self.ranks = 1
        for group in groups:
            self.ranks *= dist.get_world_size(group)

    def finish(self, result: ProbeResult) -> None:
        self.flush()  # the batched statistics are reduced with the others
        if self.groups:
            with torch.no_grad(), torch._C.DisableTorchFunction():
                self._reduce()
        super().finish(result)

    def _reduce(self) -> None:
        self.dependent = batch_dependent(self.graph_of(), self.batch, self.shapes)
        self.agreement.check()  # one for the reductions below: between them runs initlint's own work on small tensors
        self._check_same_keys()
        chosen = [i for i, (scope, key, _) in enumerate(self.keys)
                  if scope == "logits" or (scope == "ops" and key in self.dependent)]
        kinds = {"sum": [], "min": [], "max": [], "mean": []}
        for i in chosen:
            name = self.keys[i][2]
            summed = name in _SUMMED or name.endswith("count")
            kinds["sum" if summed else "min" if name in _LOWEST else "max" if name in _HIGHEST else "mean"].append(i)
        device = self.device or torch.device("cpu")
        for kind, items in kinds.items():
            if not items:
                continue
            vals = torch.stack([self.values[i].detach().to(device, torch.float64) for i in items])
            squares = torch.tensor([self.keys[i][2] in _NORMS for i in items], device=device)
            vals = torch.where(squares, vals * vals, vals)
            vals = self._all_reduce(vals, kind)
            vals = torch.where(squares, vals.sqrt(), vals)
            for i, v in zip(items, vals):
                self.values[i] = v
        self._reduce_peaks(device)
        self.consts = [(scope, key, name, value * self.ranks if name in _NUMELS and scope == "ops"
                        and key in self.dependent else value) for scope, key, name, value in self.consts]

    def _reduce_peaks(self, device: torch.device) -> None:
        """A unit is alive if it is alive on some rank: per-unit maxima, then the count."""
        ids = [i for i in self.peaks if i in self.dependent]
        if not ids:
            return
        flat = torch.cat([self.peaks[i].to(device, torch.float64).reshape(-1) for i in ids])
        flat = self._all_reduce(flat, "max")
        counts = torch.stack([torch.count_nonzero(chunk) for chunk in flat.split([self.peaks[i].numel() for i in ids])])
        where = {(scope, key, name): n for n, (scope, key, name) in enumerate(self.keys)}
        for op_id, count in zip(ids, counts):
            index = where.get(("ops", op_id, "alive"))
            if index is not None:
                self.values[index] = count.to(torch.float64)

    def _all_reduce(self, t: torch.Tensor, kind: str) -> torch.Tensor:
        op = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
              "max": dist.ReduceOp.MAX}[kind]
        t = t.contiguous()
        for group in self.groups:
            dist.all_reduce(t, op=op, group=group)
        return t / self.ranks if kind == "mean" else t

    def _check_same_keys(self) -> None:
        """Every rank must have measured the same ops in the same order, and ReLUs of the same widths
        (the reductions pair them up; a collective whose sizes differ aborts the process under gloo)."""
        widths = sorted((op_id, peaks.numel()) for op_id, peaks in self.peaks.items())
        text = repr([(s, k, n) for s, k, n in self.keys] + widths).encode()
        digest = torch.tensor([zlib.crc32(text)], dtype=torch.float64, device=self.device or "cpu")
        low, high = self._all_reduce(digest.clone(), "min"), self._all_reduce(digest.clone(), "max")
        if not torch.equal(low, high):
            raise StreamError("the ranks ran different forward passes (different ops or shapes); give every "
                              "rank a local batch of the same shape")


class _DPObserver(StatsObserver):
    """Also keeps each ReLU-family output's per-unit maxima, for the cross-rank dead-unit count."""

    def _dead(self, op: Any, y: torch.Tensor) -> torch.Tensor:
        peaks = super()._dead(op, y)
        self.c.peaks[op.id] = peaks.float()
        return peaks


class ShardedProbe(StreamProbe):
    """The streamed probe with gathered weights and data-parallel reductions."""

    def __init__(self, cap: Capture, plan: Plan, mat: Materialiser, device: torch.device, backward: bool,
                 progress: Optional[Callable[[BlockProgress], None]], groups: List[Any], batch: int,
                 agreement: Agreement) -> None:
        super().__init__(cap, plan, mat, device, backward, progress)
        self.groups = groups
        self.batch = batch
        self.agreement = agreement
        self.c = _DPCollector(groups, lambda: self.cap.graph, batch, agreement)

    def _observer(self) -> StatsObserver:
        return _DPObserver(lambda: self.cap.graph, self.c)

    def _cotangent(self, main: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the direction the single-process probe draws for the global batch."""
        if not self.groups or main.dim() == 0:
            return super()._cotangent(main)
        index, stride = 0, 1
        for group in self.groups:
            index += dist.get_rank(group) * stride
            stride *= dist.get_world_size(group)
        shape = (main.shape[0] * stride,) + tuple(main.shape[1:])
        full = draw.randn(shape, draw.generator(main.device, 0), main.device, main.dtype)
        return full.narrow(0, index * main.shape[0], main.shape[0])

    def _summarise_grad(self, name: str, g: torch.Tensor) -> None:
        g = g.contiguous()
        if self.groups:
            self.agreement.check()
        for group in self.groups:  # the global batch's gradient is the sum of the ranks'
            dist.all_reduce(g, op=dist.ReduceOp.SUM, group=group)
        super()._summarise_grad(name, g)

    def _backward(self, main: Optional[torch.Tensor], result: ProbeResult) -> None:
        self.agreement.stage = "the backward probe"
        super()._backward(main, result)

    def _finish(self, result: ProbeResult) -> None:
        self.agreement.stage = "the reduction of the statistics"
        super()._finish(result)
        for op_id, shape in result.shapes.items():  # shapes of the global batch
            if op_id in self.c.dependent and shape:
                result.shapes[op_id] = (shape[0] * self.c.ranks,) + tuple(shape[1:])


# ----------------------------------------------------------------------------- entry point
def sharded_probe(model: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], *, device: torch.device,
                  seed: int, logits: bool, backward: bool, notes: List[str],
                  progress: Optional[Callable[[BlockProgress], None]] = None,
                  failed: Optional[LoadError] = None) -> Tuple[Capture, ProbeResult]:
    """Probe a sharded model on this rank (every rank must call it, with local batches of one shape).

    ``failed`` is this rank's error in preparing its probe batch, if any: every rank then raises it,
    naming this rank. Returns the capture of a plain meta copy of the model and statistics equal on
    every rank; when some rank's probe fails, every rank raises the same :class:`LoadError`.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise LoadError("the model has DTensor parameters but torch.distributed is not initialised; "
                        "call initlint.audit inside the distributed job, on every rank")
    agreement = Agreement(_mesh_groups(model), device)
    try:
        if failed is not None:
            raise failed
        groups = _data_parallel_groups(model)
        batch = _local_batch(nested.tensors((args, kwargs)), groups, device, agreement)
        agreement.stage = "the capture of the model's graph"
        work, sources = skeleton(model)
        cap = capture(work)
        agreement.check()  # a rank whose capture raised says so before the others' vote below
        if agreement.any(cap.name != "fx") and cap.name == "fx":
            cap = RuntimeCapture(work)  # fx cannot trace it on some rank: every rank must run the same graph
    except Exception as exc:
        raise LoadError(_settled(agreement, exc, model, args, kwargs, "").sentence) from None
    if dist.get_rank() != 0:
        progress = None
    elif progress is None:
        progress = _terminal_progress()
    run = dict(device=device, seed=seed, logits=logits, backward=backward, progress=progress, groups=groups,
               batch=batch, sources=sources, agreement=agreement)
    while True:
        try:
            return cap, _attempt(cap, args, kwargs, notes, **run)
        except RanksFailed as exc:  # on every rank at once: they fall back together
            if exc.final or cap.name != "fx":
                raise LoadError(exc.sentence) from None
            notes.append(f"the fx-traced graph failed to run ({exc.reason}); used the runtime capture")
        agreement.reset()
        cap = RuntimeCapture(work)


def _attempt(cap: Capture, args: Tuple[Any, ...], kwargs: Dict[str, Any], notes: List[str], *,
             device: torch.device, seed: int, logits: bool, backward: bool,
             progress: Optional[Callable[[BlockProgress], None]], groups: List[Any], batch: int,
             sources: Dict[int, torch.Tensor], agreement: Agreement) -> ProbeResult:
    """One probe of ``cap``; every rank either returns or raises the same :class:`RanksFailed`."""
    agreement.stage = "the forward probe"
    try:
        plan = Plan(cap.model, _fx_called(cap), init=None)
        mat = _Gathered(plan, device, sources, agreement)
        probe = ShardedProbe(cap, plan, mat, device, backward, progress, groups, batch, agreement)
        try:
            with _seeded(cap.model, seed, device):
                result = probe.run(args, kwargs, logits)
        finally:
            mat.release_all()
        agreement.stage = "the end of its probe"
        agreement.check()  # the last collective: a rank that failed after the others' last one says so here
    except Exception as exc:
        raise _settled(agreement, exc, cap.model, args, kwargs, cap.name) from None
    ranks = probe.c.ranks
    notes.append(f"the model is sharded over {dist.get_world_size()} processes: audited block by block, each "
                 f"block's weights gathered from their shards; activation statistics reduced over the "
                 f"data-parallel batch of {ranks} x {batch}" if ranks > 1 else
                 f"the model is sharded over {dist.get_world_size()} processes: audited block by block, each "
                 f"block's weights gathered from their shards (one batch, shared by every rank)")
    return result


def _settled(agreement: Agreement, exc: Exception, model: nn.Module, args: Tuple[Any, ...],
             kwargs: Dict[str, Any], backend: str) -> RanksFailed:
    """The failure every rank agrees on: this rank's own, told to the others, unless they told it first."""
    if agreement.failure is not None or isinstance(exc, RanksFailed):
        return agreement.failure or exc  # type: ignore[return-value]
    if isinstance(exc, LoadError):
        return agreement.fail(str(exc), str(exc), final=True)
    failed = ForwardFailed(exc, backend)
    if failed.ours or agreement.stage == "the forward probe":
        message = str(failed.as_load_error(model, args, kwargs))
    else:  # the backward's recomputation, say: not "the model's forward raised"
        message = f"{failed.reason}{failed.where}"
    return agreement.fail(failed.reason, message, final=False)


def _local_batch(tensors: List[torch.Tensor], groups: List[Any], device: torch.device, agreement: Agreement) -> int:
    """The local batch size, the same on every data-parallel rank (the reductions pair ranks' ops up)."""
    batch = int(tensors[0].shape[0]) if tensors and tensors[0].dim() else 1
    agreement.check()
    if groups:
        sizes = torch.tensor([float(batch)], dtype=torch.float64, device=device)
        low, high = sizes.clone(), sizes.clone()
        for group in groups:
            dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
            dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
        if low.item() != high.item():
            raise StreamError(f"the local batches differ in size across data-parallel ranks ({int(low.item())} to "
                              f"{int(high.item())}); give every rank a batch of the same size")
    return batch
