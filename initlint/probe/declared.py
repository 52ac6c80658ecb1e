"""The declared init, replayed on private copies: what a model's own init (``_init_weights`` as
``model.apply`` calls it, ``reset_parameters()``, ``init_weights()``) makes of each parameter, and
what PyTorch's defaults make of it, without touching the model or the global random state.

IL014 judges with it (``rules/il014_init_not_applied.py``). The interface:

- :class:`Draw`, :func:`draw_of`, :func:`draws_of`, :func:`same`: the statistics of a tensor that tell
  inits apart, read from a sample of it;
- :func:`scan_memory`, :func:`may_be_unwritten`, :func:`largest_finite`: whether memory was ever written;
- :func:`declare_applied`, :func:`declare_called`: the replays, on private copies (:class:`_Private`:
  fresh memory, tiles standing for large random fills, writes outside the copy refused), None when the
  init cannot run on a copy. An error of the replay itself is raised, never taken for that.
"""
from __future__ import annotations

import copy
import functools
import math
import struct
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..capture.graph import enclosing_paths
from ..compat import is_inplace
from .guard import saved_rng, seed_devices

# ----------------------------------------------------------------------------- what a tensor holds
SAMPLE = 1 << 14
"""Elements sampled (in 256 evenly spaced runs of :data:`RUN`) for a tensor's std, mean, kurtosis and zero/one
fractions, and for the signs of memory nobody wrote: the std to about 0.6% (``1/sqrt(2 n)`` for a normal
draw), the kurtosis to about 0.04, well inside what tells inits apart (:func:`same`). 65536 elements gave
the same verdicts at four times the reads (on a 50-layer MLP of width 256, 9 ms of a 60 ms audit)."""
RUN = 64
"""Contiguous elements per run of a sample: a run reads whole cache lines, where an evenly strided sample
of a large weight reads one element per line and so costs a pass over all of it (a 32-layer Llama's 291
parameters: 110 ms for strided samples, 25 ms in runs)."""
RUNS = 256
"""Runs per sample: memory nobody wrote that spans more than 1/256 of a tensor holds a whole run."""
SCAN_SAMPLE = 1 << 12
"""Elements sampled (256 runs of 16) of a tensor larger than :data:`SAMPLE` for the signs of memory nobody wrote
(:func:`may_be_unwritten`; a smaller one is read whole): where such memory spans a run, nearly every element of
it is a denormal or a huge value, so 16 tell as well as 64, at a quarter of the reads (a 50-layer MLP of width
256: 3.2 ms of a 60 ms audit with 16384)."""
PATCH = 1 << 16
"""Elements of the largest constant fill kept beside a tiled tensor's tile (:meth:`_Private._patch`)."""
HUGE = 1e20
"""No init draws a magnitude this large; memory nobody wrote does (values up to 3e38)."""
BLOCK = 1 << 25
"""Elements of the largest subtree copied at once for the declared init (128 MB in float32); a larger
module is split into its children, so the copy never holds more than this or the largest single module."""
_CHUNK = 1 << 22
DECLARED_DIGITS = 2
"""Significant digits of a declared std: a property of the init, measured on one draw of it (0.0199 is 0.02)."""


@dataclass
class Draw:
    """The statistics of one tensor that tell inits apart."""

    n: int
    """Elements sampled."""
    std: float
    mean: float
    zeros: float
    """Fraction of exact zeros."""
    ones: float
    """Fraction of exact ones."""
    kurt: Optional[float]
    """Kurtosis (normal 3, uniform 1.8); None for a constant tensor."""
    denormal: int = 0
    absmax: float = 0.0
    """Largest finite magnitude."""
    finite: bool = True

    def family(self) -> str:
        if self.kurt is None:
            return "constant"
        if self.kurt < 2.2:
            return "uniform"
        return "normal" if self.kurt > 2.7 else "truncated normal"


def _runs(n: int, size: int) -> Optional[Tuple[int, int, int]]:
    """Where the sample of ``size`` elements of a tensor of ``n`` lies: ``(runs, run length, step)``, runs of
    :data:`RUN` contiguous elements (fewer for a small ``size``, so that there are :data:`RUNS`) starting
    ``step`` apart, the first at 0 and the last ending near ``n``; None when the sample is the whole tensor."""
    if n <= size:
        return None
    run = max(1, min(RUN, size // RUNS))
    runs = -(-size // run)
    return runs, run, (n - run) // (runs - 1) if runs > 1 else 0


def _sampled(t: torch.Tensor, size: int = SAMPLE) -> torch.Tensor:
    """``size`` elements of ``t`` in evenly spaced runs (:func:`_runs`), in its own dtype."""
    view = _sample_view(t, size)
    return view if view.dim() == 1 and view.numel() <= size else view.reshape(-1)[:size]


def _sample_view(t: torch.Tensor, size: int = SAMPLE) -> torch.Tensor:
    """The runs of :func:`_sampled` as a ``(runs, run)`` view of ``t`` (the whole of ``t``, flat, when it
    is the sample): samples of several tensors are stacked from these views in one copy. Not detached
    (one op less per tensor): the callers read samples with autograd off."""
    where = _runs(t.numel(), size)
    if where is None:
        return t if t.dim() == 1 else t.reshape(-1)
    runs, run, step = where
    # a contiguous tensor's runs are a view of it as it is (no flat view first: one op less per tensor)
    return (t if t.is_contiguous() else t.reshape(-1)).as_strided((runs, run), (step, 1))


def _sampled_positions(n: int, size: int, device: torch.device) -> torch.Tensor:
    """The flat positions :func:`_sampled` reads."""
    where = _runs(n, size)
    if where is None:
        return torch.arange(n, device=device)
    runs, run, step = where
    return (torch.arange(runs, device=device)[:, None] * step + torch.arange(run, device=device)).reshape(-1)[:size]


def draw_of(t: torch.Tensor, full: bool = False) -> Draw:
    """Statistics of ``t`` from a sample in evenly spaced runs; ``full`` also scans every element for the
    signatures of memory nobody initialised (denormals, huge or non-finite values)."""
    return draws_of([t], full)[0]


def draws_of(tensors: Sequence[torch.Tensor], full: bool = False,
             sample: Optional[Callable[[torch.Tensor, int], torch.Tensor]] = None) -> List[Draw]:
    """:func:`draw_of` for many tensors, with one transfer to the host per device (never one per tensor).
    ``sample(t, size)``: the sample of ``t`` in its own dtype (default :func:`_sampled`;
    a private copy's tensors are read through :meth:`_Private.sample`).

    Samples of one length, dtype and device are stacked and reduced row by row (a model's parameters
    come in a few sizes, and every large one gives :data:`SAMPLE` elements), :data:`_CACHED` elements at a time."""
    with torch.no_grad():  # the samples are views of parameters: nothing of this is differentiated
        return _draws_of(tensors, full, sample)


def _draws_of(tensors: Sequence[torch.Tensor], full: bool,
              sample: Optional[Callable[[torch.Tensor, int], torch.Tensor]]) -> List[Draw]:
    # the samples of a few tensors at a time, stacked from views of them in one copy (all of them at once
    # took 75 MB on a 32-layer Llama, fresh memory faulted in page by page); another sampler's samples
    # are taken first
    groups: Dict[Tuple[Tuple[int, ...], torch.dtype, torch.device], List[Tuple[int, torch.Tensor]]] = {}
    for i, t in enumerate(tensors):
        x = _sample_view(t, SAMPLE) if sample is None else sample(t, SAMPLE)
        groups.setdefault((tuple(x.shape), x.dtype, x.device), []).append((i, x))
    table = Table()
    sizes: Dict[int, int] = {}
    for (shape, _, device), items in groups.items():
        length = math.prod(shape)
        sizes.update((i, min(length, SAMPLE)) for i, _ in items)
        for part in _in_cache(items, length, device):
            rows = _moments(torch.stack([x for _, x in part]).reshape(len(part), -1)[:, :SAMPLE])
            if full:
                rows = torch.cat([rows, torch.stack([torch.stack([v.double() for v in scan_memory(tensors[i])])
                                                     if tensors[i].is_floating_point() else _NO_SCAN.to(rows.device)
                                                     for i, _ in part])], dim=1)
            table.add([i for i, _ in part], rows)
    rows_of = dict(table.read())
    draws = [_draw(sizes[i], rows_of[i] if full else rows_of[i] + _NO_SCAN_ROW) for i in range(len(tensors))]
    for t, d in zip(tensors, draws):
        if d.absmax < 0:
            d.absmax = largest_finite(t)
    return draws


_NO_SCAN_ROW = [0.0, 0.0, 1.0]
"""What an unscanned tensor reports: largest magnitude 0, no denormal, finite."""
_NO_SCAN = torch.tensor(_NO_SCAN_ROW, dtype=torch.float64)


_CACHED = 1 << 18
"""Sample elements reduced together: 2 MB in float64, which stays in the cache through the passes (70
samples of 65536 at once took 181 ms, 4 at a time 35 ms)."""


_AT_ONCE = 1 << 22
"""Sample elements reduced together on an accelerator, where a batch costs its kernels' launches, not cache
misses: 32 MB in float64 (a 32-layer Llama's 224 large samples in one batch instead of 14)."""


def _in_cache(items: List[Any], length: int, device: torch.device) -> Iterator[List[Any]]:
    """``items`` (samples of ``length`` elements each) in runs of at most :data:`_CACHED` elements on the CPU,
    :data:`_AT_ONCE` elsewhere."""
    at_once = max(1, (_CACHED if device.type == "cpu" else _AT_ONCE) // max(length, 1))
    for start in range(0, len(items), at_once):
        yield items[start:start + at_once]


class Table:
    """Rows computed on several devices, keyed by index, read with one transfer per device."""

    def __init__(self) -> None:
        self.parts: Dict[torch.device, List[torch.Tensor]] = {}
        self.keys: Dict[torch.device, List[int]] = {}

    def add(self, keys: List[int], rows: torch.Tensor) -> None:
        self.parts.setdefault(rows.device, []).append(rows)
        self.keys.setdefault(rows.device, []).extend(keys)

    def read(self) -> Iterator[Tuple[int, Any]]:
        for device, parts in self.parts.items():
            yield from zip(self.keys[device], torch.cat(parts).tolist())


def _moments(x: torch.Tensor) -> torch.Tensor:
    """Per row of ``x`` (samples of equal length): mean, the sums of squares and of fourth powers about the
    mean (in float64) and the counts of exact zeros and ones, as a ``(rows, 5)`` float64 tensor; the sums are
    divided by the sample size on the host (:func:`_draw`), one op less each. Two passes (the mean, then the
    powers about it) instead of ``var_mean``, whose one-pass update costs about three times as much on the
    CPU; the squares serve both sums."""
    # a bool tensor's sum() takes a slow path on the CPU (about 50x a float sum) unless it sums to int32;
    # logical_not(x) is x == 0 (NaN is not) at less than half its cost, and x - 1 is 0 exactly when x is 1
    if x.is_floating_point():
        zeros = torch.logical_not(x).sum(dim=1, dtype=torch.int32)
        ones = torch.logical_not(x - 1).sum(dim=1, dtype=torch.int32)
    else:
        zeros = (x == 0).sum(dim=1, dtype=torch.int32)
        ones = (x == 1).sum(dim=1, dtype=torch.int32)
    wide = x.double() if x.dtype != torch.float64 else x.clone()  # worked on in place
    mean = wide.mean(dim=1)
    squares = wide.sub_(mean[:, None]).square_()
    second = squares.sum(dim=1)
    fourth = torch.linalg.vecdot(squares, squares, dim=1)
    return torch.stack([mean, second, fourth, zeros.double(), ones.double()], dim=1)


def _draw(n: int, row: List[float]) -> Draw:
    """A :class:`Draw` from a sample of ``n`` elements and its row of :func:`_moments` (and of the memory scan)."""
    mean, second, fourth, zeros, ones, absmax, denormal, finite = row
    n = max(n, 1)
    var = second / n
    std = math.sqrt(var) if var == var and var > 0 else (0.0 if var == 0 else float("nan"))
    kurt = fourth / n / var ** 2 if var > 0 and math.isfinite(var) else None
    return Draw(int(n), std, mean, zeros / n, ones / n, kurt, denormal=int(denormal), absmax=absmax,
                finite=bool(finite))


def scan_memory(t: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The largest finite magnitude, the count of denormals and whether every value is finite, in
    chunks, on the device. Denormals are counted only where the dtype's smallest normal is far below
    any init's values (float32, bfloat16, float64): in float16 it is 6e-5, and about 0.2% of an ordinary
    std-0.02 draw lands below it.

    Two reductions per chunk (the largest magnitude, and counts of compares): a tensor holding inf or
    NaN, whose largest magnitude is then not finite, gets a second, masked pass (:func:`largest_finite`)."""
    flat = t.detach().reshape(-1)
    count_denormals = torch.finfo(t.dtype).tiny < 1e-30
    absmax = torch.zeros((), dtype=torch.float64, device=flat.device)
    denormal = torch.zeros((), dtype=torch.int64, device=flat.device)
    for i in range(0, flat.numel(), _CHUNK):
        size = flat[i:i + _CHUNK].abs()
        absmax = torch.maximum(absmax, size.amax().double())  # NaN and inf propagate: not finite
        if count_denormals:
            denormal = denormal + (torch.count_nonzero(size < torch.finfo(t.dtype).tiny)
                                   - torch.count_nonzero(size == 0))
    finite = absmax < math.inf  # False for inf and NaN
    if not flat.numel():
        return absmax, denormal, torch.ones((), dtype=torch.bool, device=flat.device)
    return torch.where(finite, absmax, -1.0), denormal, finite  # -1: see largest_finite


def may_be_unwritten(tensors: Sequence[torch.Tensor], norms: Optional[Sequence[Optional[float]]] = None) -> List[bool]:
    """Whether each tensor needs the full scan of :func:`scan_memory`: its norm is not finite or at least
    :data:`HUGE` (so it may hold a value that large), or its sample (:data:`SCAN_SAMPLE` elements; all of a
    tensor of at most :data:`SAMPLE`) holds a denormal or a huge value. Memory nobody wrote holds such values all over (stale
    integers read as float32 are denormals; arbitrary bits have huge exponents a quarter of the time);
    an init draws none. ``norms``: the norms already known (the probe's weights), None where not; the
    others of a dtype come from one fused call. Samples of a length are read together, and the flags
    reach the host in one transfer per device."""
    with torch.no_grad():  # parameters read as they are, not detached one by one
        return _may_be_unwritten(tensors, norms)


def _may_be_unwritten(tensors: Sequence[torch.Tensor], norms: Optional[Sequence[Optional[float]]]) -> List[bool]:
    flags = [False] * len(tensors)
    by_dtype: Dict[Tuple[torch.dtype, torch.device], List[int]] = {}
    known = list(norms) if norms is not None else [None] * len(tensors)
    for i, t in enumerate(tensors):
        if t.is_floating_point() and t.numel():
            by_dtype.setdefault((t.dtype, t.device), []).append(i)
            if known[i] is not None and not (known[i] < HUGE):  # type: ignore[operator]
                flags[i] = True
    table = Table()  # a tensor's flags may come in more than once (its norm, its sample): they are or-ed
    for (dtype, device), indices in by_dtype.items():
        values = [tensors[i] for i in indices]
        unknown = [k for k, i in enumerate(indices) if known[i] is None]
        if unknown:
            measured = torch._foreach_norm([values[k] for k in unknown], 2,
                                           dtype=torch.float32 if dtype.itemsize < 4 else None)
            table.add([indices[k] for k in unknown], ~(torch.stack(measured) < HUGE))
        # samples of one shape stacked from views of the tensors, in one copy (not a copy of each sample, then
        # of their stack), their magnitudes taken in place: 28 -> 16 ms on nn.Transformer's 60 large tensors.
        # No flag is written into a device tensor at host-side indices: that copies the indices to the device,
        # and CUDA waits for it (one synchronisation per part)
        views = [_sample_view(t, SAMPLE if t.numel() <= SAMPLE else SCAN_SAMPLE) for t in values]
        samples: Dict[Tuple[int, ...], List[int]] = {}
        for k, view in enumerate(views):
            samples.setdefault(tuple(view.shape), []).append(k)
        for shape, ks in samples.items():
            length = min(math.prod(shape), SAMPLE)
            for part in _in_cache(ks, length, device):
                size = torch.stack([views[k] for k in part]).reshape(len(part), -1)[:, :length].abs_()
                odd = ~(size.amax(dim=1) < HUGE)  # a huge value, inf or NaN
                if torch.finfo(dtype).tiny < 1e-30:  # a denormal (see scan_memory): the least nonzero magnitude is one
                    odd |= torch.where(size > 0, size, math.inf).amin(dim=1) < torch.finfo(dtype).tiny
                table.add([indices[k] for k in part], odd)
    for i, flag in table.read():
        flags[i] = flags[i] or bool(flag)
    return flags


def largest_finite(t: torch.Tensor) -> float:
    """The largest finite magnitude of a tensor that holds inf or NaN (the rare path of :func:`scan_memory`)."""
    flat = t.detach().reshape(-1)
    high = 0.0
    for i in range(0, flat.numel(), _CHUNK):
        size = flat[i:i + _CHUNK].abs()
        high = max(high, float(torch.where(size < math.inf, size, 0).amax()))
    return high


def same(a: Draw, b: Draw, tol: float) -> bool:
    """True when ``a`` and ``b`` could be two draws of one init: std within ``1 +- tol`` (plus sampling
    noise), the same mean, fractions of exact zeros and ones, and distribution family (kurtosis)."""
    if a.std == 0 or b.std == 0:
        return a.std == b.std and math.isclose(a.mean, b.mean, rel_tol=1e-6, abs_tol=1e-12)
    if not (math.isfinite(a.std) and math.isfinite(b.std)):
        return False
    n = min(a.n, b.n)
    if abs(math.log(a.std / b.std)) > math.log1p(tol) + 3 / math.sqrt(2 * n):
        return False
    scale = max(a.std, b.std)
    if abs(a.mean - b.mean) > 0.1 * scale + 4 * scale / math.sqrt(n):
        return False
    if abs(a.zeros - b.zeros) > 0.05 or abs(a.ones - b.ones) > 0.05:
        return False
    if a.kurt is not None and b.kurt is not None and abs(a.kurt - b.kurt) > max(0.4, 5 * math.sqrt(24 / n)):
        return False
    return True
def defined_outside_torch(module: nn.Module, method: str) -> bool:
    for cls in type(module).__mro__:
        if method in cls.__dict__:
            return not (cls.__module__ or "").startswith("torch.")
    return False

def join_path(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def element_count(m: nn.Module) -> int:
    seen: Dict[int, int] = {}
    for t in list(m.parameters()) + [b for b in m.buffers() if b is not None]:
        seen[id(t)] = t.numel()
    return sum(seen.values())


def own_element_count(m: nn.Module) -> int:
    return sum(t.numel() for t in list(m.parameters(recurse=False)) + [b for b in m.buffers(recurse=False)
                                                                       if b is not None])


def post_order(m: nn.Module, path: str = "") -> List[Tuple[str, nn.Module]]:
    """Modules children first, as ``PreTrainedModel.initialize_weights`` visits them."""
    out: List[Tuple[str, nn.Module]] = []
    seen: set = set()

    def walk(p: str, mod: nn.Module) -> None:
        if id(mod) in seen:
            return
        seen.add(id(mod))
        for name, child in mod.named_children():
            walk(join_path(p, name), child)
        out.append((p, mod))

    walk(path, m)
    return out


@contextmanager
def one_thread() -> Iterator[None]:
    """Many small reductions: one thread avoids the thread pool's start-up cost on each (20x on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def own_random_stream(seed: int = 0) -> Iterator[None]:
    """The declared init draws from a stream of its own; every global random state is put back."""
    restore = saved_rng()
    try:
        seed_devices(seed)
        with torch.no_grad():
            yield
    finally:
        restore()


class _Foreign(Exception):
    """The declared init wrote a tensor that is not the private copy's (:attr:`_Private.owned`)."""


class _Undeclared(Exception):
    """The declared init cannot run on a private copy: it raised, or the unit cannot be copied. It declares
    nothing to compare. An error of the replay itself (:attr:`_Private.failure`) is never this: it
    reaches the audit, which reports the rule's error."""


def _users(what: str, run: Callable[..., Any], *args: Any) -> Any:
    """``run(*args)``, code of the user's model (copying its attributes): its failure is :class:`_Undeclared`."""
    try:
        return run(*args)
    except Exception as exc:  # noqa: BLE001 - any error of the user's code; the replay's own are not in here
        raise _Undeclared(f"{what}: {type(exc).__name__}: {exc}") from exc


def _private_copy(root: nn.Module, unit: nn.Module, whole: bool, deep: bool = False,
                  every: Optional[List[nn.Module]] = None) -> nn.Module:
    """A copy of ``unit`` (its subtree when ``whole``, else only its own tensors) that shares nothing
    with the model: modules outside the unit are not copied even when the unit refers to them.

    Its parameters are :class:`_Private` tensors: fresh memory that holds the original's values only
    once an op of the declared init reads them (most inits overwrite a parameter without reading it).
    The modules are copied attribute by attribute (:func:`_module_copies`) unless ``deep``
    (``copy.deepcopy``). The init runs guarded: writing a tensor that it did not make and the copy does
    not own raises :class:`_Foreign` before the write (:func:`_on_copies` then tries a deep copy, and an
    init that still writes the model's tensors, through the original owner's attributes say, declares
    nothing). ``every``: ``root``'s modules, when the caller has listed them once for many units."""
    lazy = _Private()
    if not whole:
        shell = copy.copy(unit)
        shell.__dict__ = dict(unit.__dict__)
        shell._parameters = {k: lazy.parameter(v) for k, v in unit._parameters.items()}
        shell._buffers = {k: lazy.buffer(v) for k, v in unit._buffers.items()}
        shell._modules = {}
        private = shell.to_empty(device="cpu") if _on_meta(shell) else shell
    else:
        inside = {id(m) for m in unit.modules()}
        memo: Dict[int, Any] = {id(m): m for m in (root.modules() if every is None else every) if id(m) not in inside}
        for p in unit.parameters():
            memo[id(p)] = lazy.parameter(p)
        deep = deep or any(_copies_itself(type(m)) for m in unit.modules())
        if deep:
            private = _users("copying the unit", copy.deepcopy, unit, memo)
            lazy.owned.update(_storage(t) for t in memo.values()
                              if isinstance(t, torch.Tensor) and t.layout == torch.strided)
        else:
            private = _module_copies(unit, memo, lazy)
        if _on_meta(private):  # a streamed model's block
            private = private.to_empty(device="cpu")
    lazy.own(private)
    private._initlint_private = lazy  # type: ignore[attr-defined]
    return private


_SHALLOW = (dict, set, list, OrderedDict)
"""A module's containers (hooks, the non-persistent buffers' names) get a copy of their own; what they hold
is shared (hooks, names)."""
_ATOMIC = (bool, int, float, str, bytes, type(None), torch.dtype, torch.device)


def _copies_itself(cls: type) -> bool:
    """Whether a module class says how it is copied (``__deepcopy__``, ``__reduce__``, ``__getstate__``);
    ``__setstate__`` is called as ``copy.deepcopy`` calls it."""
    return any(name in klass.__dict__ for klass in cls.__mro__ if klass not in (nn.Module, object)
               for name in ("__deepcopy__", "__reduce__", "__reduce_ex__", "__getstate__"))


def _module_copies(unit: nn.Module, memo: Dict[int, Any], lazy: "_Private") -> nn.Module:
    """``copy.deepcopy(unit, memo)`` in effect, at a fraction of its cost: each module of the subtree is a
    new object with its own ``__dict__``, parameters from ``memo``, buffers and tensor attributes
    cloned, submodules copied, its containers copied one level, atomic values shared, and any other
    attribute (a config object, say) deep-copied with one memo for the whole subtree."""
    modules = list({id(m): m for m in unit.modules()}.values())
    for m in modules:
        fresh = m.__class__.__new__(m.__class__)
        memo[id(m)] = fresh
    for m in modules:
        state = {}
        for key, value in m.__dict__.items():
            if key == "_parameters":
                state[key] = {k: memo[id(v)] if v is not None else None for k, v in value.items()}
            elif key == "_buffers":
                state[key] = {k: lazy.buffer(v) for k, v in value.items()}
            elif key == "_modules":
                state[key] = {k: memo.get(id(v), v) if v is not None else None for k, v in value.items()}
            elif isinstance(value, _ATOMIC):
                state[key] = value
            elif isinstance(value, nn.Module):
                state[key] = memo.get(id(value), value)
            elif isinstance(value, torch.Tensor):
                state[key] = memo[id(value)] if id(value) in memo else lazy.buffer(value)
            elif type(value) is tuple and all(isinstance(v, _ATOMIC) for v in value):
                state[key] = value
            elif type(value) in _SHALLOW:
                state[key] = value.copy()
            else:
                _seed_flat_dicts(value, memo)
                state[key] = _users(f"copying {key}", copy.deepcopy, value, memo)
        _users("restoring the copy", memo[id(m)].__setstate__, state)  # as copy.deepcopy ends (an RNN relinks its flat weights)
    return memo[id(unit)]


def _seed_flat_dicts(value: Any, memo: Dict[int, Any]) -> None:
    """Put in ``memo`` a copy of each dict among ``value``'s attributes whose keys and values are all atomic
    (a deep copy of such a dict is its shallow copy): ``copy.deepcopy`` then takes it from there instead of
    copying it entry by entry (an ImageNet config's ``id2label`` and ``label2id`` hold 1000 labels each)."""
    for item in getattr(value, "__dict__", {}).values():
        if type(item) is dict and id(item) not in memo and len(item) > 16 \
                and all(isinstance(k, _ATOMIC) and isinstance(v, _ATOMIC) for k, v in item.items()):
            memo[id(item)] = item.copy()
            memo.setdefault(id(memo), []).append(item)  # kept alive as copy.deepcopy keeps what it memoised


def _on_copies(run: Callable[[bool], Any]) -> Any:
    """``run(deep)`` on private copies in the declared init's own random stream: attribute-wise copies
    first, a deep copy when the init wrote a tensor of the model's (the same stream, so the same draws)."""
    try:
        with own_random_stream():
            return run(False)
    except _Foreign:
        with own_random_stream():
            return run(True)


def _lazy_of(private: nn.Module) -> "_Private":
    """The :class:`_Private` that holds a private copy's parameters (:func:`_private_copy` sets it)."""
    return private._initlint_private  # type: ignore[return-value]


def _written(before: Dict[str, int], tensors: Dict[str, torch.Tensor], lazy: "_Private") -> List[str]:
    """Names of the tensors an init step wrote: an op of the declared init wrote their memory (through the
    parameter or an alias: ``weight.data.normal_()`` leaves the version counter alone), or their version
    counter moved."""
    return [name for name, t in tensors.items()
            if t._version != before[name] or (t.layout == torch.strided and t.numel() and _storage(t) in lazy.wrote)]


@dataclass
class Declared:
    """What the declared init makes of the parameters of one unit."""

    default: Dict[str, List[Tuple[str, Draw]]]
    own: Dict[str, Draw]
    full: Dict[str, Draw]
    writer: Dict[str, str]
    """Parameter -> the module whose init call wrote it last (a block that rescales it)."""


def _declare_applied(make_copy: Callable[[], nn.Module], path: str, originals: List[nn.Module],
                     owners: Dict[int, Any], differs: Callable[[str, Draw], bool]) -> Declared:
    """The whole declared init (children first) on a private copy; when it differs from what a parameter
    holds, PyTorch's defaults and then each module's own ``_init_weights`` on a second copy, to tell
    where the parameter was left. Each pass keeps the statistics of what it wrote."""
    result = Declared({}, {}, {}, {})
    private = make_copy()
    modules = post_order(private, path)
    by_copy = {id(c): o for (_, c), o in zip(modules, originals)}
    tensors = {join_path(path, n): p for n, p in private.named_parameters()}
    result.full = _pass(tensors, [(p, m, _owner_step(owners, by_copy[id(m)], m, p)) for p, m in modules],
                        _lazy_of(private), result.writer)
    if not any(differs(n, d) for n, d in result.full.items()):
        return result  # an intact model costs one pass
    del private, modules, tensors, by_copy
    private = make_copy()
    modules = post_order(private, path)
    by_copy = {id(c): o for (_, c), o in zip(modules, originals)}
    tensors = {join_path(path, n): p for n, p in private.named_parameters()}
    result.default = _defaults(tensors, modules, _lazy_of(private))
    own_steps = [(p, m, _owner_step(owners, by_copy[id(m)], m, p)) for p, m in modules
                 if any(True for _ in m.parameters(recurse=False))]
    result.own = _pass(tensors, own_steps, _lazy_of(private))
    return result


def _torch_reset(m: nn.Module) -> Optional[Callable[[], Any]]:
    if not any(True for _ in m.parameters(recurse=False)) or defined_outside_torch(m, "reset_parameters"):
        return None
    return getattr(m, "reset_parameters", None)


def _owner_step(owners: Dict[int, Any], original: nn.Module, m: nn.Module,
                path: str = "") -> Optional[Callable[[], Any]]:
    owner = owners.get(id(original))
    if owner is None:
        return None
    targets = _tie_targets(owner, m, path)
    if not targets:
        return lambda: owner.module._init_weights(m)
    return lambda: _untied(m, targets, lambda: owner.module._init_weights(m))


def _tie_targets(owner: Any, m: nn.Module, path: str) -> List[str]:
    """The parameters ``m`` holds as the target of a Hugging Face tie: ``init_weights`` draws them
    untied and then ties them to their source, so the source's draw is the one they keep."""
    ties = getattr(owner.module, "all_tied_weights_keys", None) if owner.hf else None
    if not isinstance(ties, dict) or not ties:
        return []
    local = path[len(owner.path) + 1:] if owner.path else path
    return [n for n, p in m._parameters.items() if p is not None and join_path(local, n) in ties]


def _untied(m: nn.Module, names: List[str], step: Callable[[], Any]) -> None:
    held = {n: m._parameters[n] for n in names}
    try:
        for n, p in held.items():
            m._parameters[n] = nn.Parameter(torch.empty_like(p), requires_grad=p.requires_grad)
        step()
    finally:
        m._parameters.update(held)


def _defaults(tensors: Dict[str, torch.Tensor], modules: List[Tuple[str, nn.Module]],
              lazy: "_Private") -> Dict[str, List[Tuple[str, Draw]]]:
    """Each parameter's PyTorch default, per module that holds it (a tied weight has one per holder)."""
    names = {id(t): n for n, t in tensors.items()}
    found: Dict[str, List[Tuple[str, Draw]]] = {}
    for _, module in modules:
        reset = _torch_reset(module)
        if reset is None:
            continue
        with lazy.drawing(tensors.values()):
            _init_step(reset, lazy)
        for p in module.parameters(recurse=False):
            if id(p) in names:
                found.setdefault(names[id(p)], []).append((type(module).__name__, _drawn(lazy, [p])[0]))
    return found


TILE = 65521
"""Values a random fill of a large parameter draws in a declared-init pass (a prime, so that no period
of a parameter's shape lines up with the tile). A tiled tensor's sample is its tile: the tensor holds
each of the tile's values about equally often."""


_OVERWRITES = frozenset({torch.ops.aten.normal_.default, torch.ops.aten.uniform_.default,
                         torch.ops.aten.zero_.default, torch.ops.aten.fill_.Scalar, torch.ops.aten.fill_.Tensor,
                         torch.ops.aten.copy_.default})
"""In-place ops that write every element of their first argument whatever it held."""
_RANDOM_FILLS = (torch.ops.aten.normal_.default, torch.ops.aten.uniform_.default)
_NO_READ = frozenset({torch.ops.aten.empty_like.default, torch.ops.aten.zeros_like.default,
                      torch.ops.aten.ones_like.default, torch.ops.aten.new_empty.default,
                      torch.ops.aten.new_zeros.default, torch.ops.aten.new_ones.default})
"""Ops that read a tensor's metadata, not its values."""
_CONSTANT_FILLS = (torch.ops.aten.zero_.default, torch.ops.aten.fill_.Scalar)
_DEFERRED_FILLS = _RANDOM_FILLS + _CONSTANT_FILLS
_WHOLE_REDUCTIONS = frozenset({torch.ops.aten.any.default, torch.ops.aten.all.default, torch.ops.aten.max.default,
                               torch.ops.aten.min.default})
"""Reductions of a whole tensor whose value is that of any tensor holding the same set of values."""
_NOT_TILED = object()


class _Private(TorchDispatchMode):
    """The parameters of a private copy, and the mode the declared init runs in on them.

    A private parameter starts as fresh memory standing for its original: its values are copied in only
    when an op of the declared init reads them (an in-place op that does not overwrite the whole tensor,
    or any op taking it as an input), never when the init overwrites it (``normal_``, ``zero_``,
    ``fill_``, ``copy_``). Views read nothing and copy nothing; a write through a view first copies the
    values in. Most inits overwrite every parameter, so the copy of the model's parameters is never made.

    A random fill (``normal_``, ``uniform_``) of a whole large parameter draws :data:`TILE` values, which
    stand for that value repeated over the tensor: what the init does next (scaling, clamping, a norm
    over rows) writes them out and sees a full tensor of the declared distribution, and the sample
    :func:`draw_of` reads is the tile itself while nothing else touched it. The random draws of a large
    model, a pass as costly as a forward and backward at a small batch (GPT-2 124M: 124M normal draws),
    and its copy, cost nothing then. A random
    fill of a smaller whole tensor draws nothing until an op reads it; one that a later fill overwrites
    (``kaiming_normal_`` after a first ``normal_``) is never drawn.

    Values of a private tensor are read through :meth:`sample`; an op outside torch's dispatcher
    (``.numpy()``, ``data_ptr()``) would see memory that holds nothing yet."""

    def __init__(self) -> None:
        super().__init__()
        self.original: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        """Storage -> (private tensor, original tensor) whose values it stands for."""
        self.tiled: Dict[int, Tuple[torch.Tensor, Union[torch.Tensor, "_Fill"]]] = {}
        """Storage -> (private tensor, :data:`TILE` values repeated over it, or the fill that draws them)."""
        self.pending: Dict[int, Tuple[torch.Tensor, "_Fill"]] = {}
        """Storage -> (private tensor, the random fill that wrote the whole of it, not drawn yet): a tensor too
        small to tile, drawn in full only when something reads it."""
        self.patches: Dict[int, List[Tuple[torch.Tensor, float]]] = {}
        """Storage -> (flat positions, value) written over its tile since, in order: an Embedding's
        ``weight[padding_idx].zero_()`` after its ``normal_``."""
        self.large: set = set()
        self.owned: set = set()
        """Storages of the copy's own tensors and of every tensor an op made in this mode: writing any other
        raises :class:`_Foreign`."""
        self.wrote: set = set()
        """Storages an op of the declared init wrote (since :func:`_pass` last cleared it)."""
        self._positions: Dict[Tuple[int, int, torch.device], torch.Tensor] = {}
        self.failure: Optional[Exception] = None
        """An error of the replay itself (not of an op the init asked for), kept even if the init catches it."""
        self._op_failure: Optional[Exception] = None

    def run(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        """An op the declared init asked for, or a random fill it deferred: its error is the init's."""
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            self._op_failure = exc
            raise

    def op_failed(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the error of an op the declared init asked for (:meth:`run`)."""
        return exc is self._op_failure

    def raise_failure(self) -> None:
        """Raise the replay's own error, if one happened since the last call."""
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def own(self, private: nn.Module) -> None:
        self.owned.update(_storage(t) for t in list(private.parameters()) + list(private.buffers())
                          if t.layout == torch.strided)

    def buffer(self, b: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """A tensor of the copy's own standing for ``b`` (a buffer, a tensor attribute): like a private parameter,
        fresh memory that holds ``b``'s values only once an op reads them (an init seldom reads a BatchNorm's
        running statistics: no copy kernel for them); a plain clone where ``b`` is of another kind."""
        if b is None:
            return None
        if type(b) is not torch.Tensor or b.requires_grad or b.device.type == "meta" or not b.numel() \
                or b.layout != torch.strided:
            fresh = b.clone()
            if fresh.layout == torch.strided:
                self.owned.add(_storage(fresh))
            return fresh
        fresh = torch.empty_like(b, memory_format=torch.preserve_format)
        self.owned.add(_storage(fresh))
        self.original[_storage(fresh)] = (fresh, b)
        return fresh

    def parameter(self, p: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """A private parameter standing for ``p`` (a plain copy on the meta device or when empty)."""
        if p is None or type(p) not in (nn.Parameter, torch.Tensor) or p.device.type == "meta" or not p.numel() \
                or p.layout != torch.strided:
            return copy.deepcopy(p)
        fresh = torch.empty_like(p, memory_format=torch.preserve_format)
        if isinstance(p, nn.Parameter):
            fresh = nn.Parameter(fresh, requires_grad=p.requires_grad)
        self.owned.add(_storage(fresh))
        self.original[_storage(fresh)] = (fresh, p)  # read only under no_grad: not detached (one op less)
        return fresh

    @contextmanager
    def drawing(self, tensors: Iterable[torch.Tensor]) -> Iterator[None]:
        """Run the declared init on ``tensors`` (the private copy's parameters) in this mode."""
        self.large = {_storage(t) for t in tensors if t.numel() >= 4 * TILE}
        with self:
            yield

    def sample(self, t: torch.Tensor, size: int = SAMPLE) -> torch.Tensor:
        """:func:`_sampled` of a private tensor, read from what its values stand for."""
        key = _storage(t) if t.numel() else None
        if key in self.original and self.original[key][0].shape == t.shape:
            return _sampled(self.original[key][1], size)
        if key in self.tiled and self.tiled[key][0].shape == t.shape and t.is_contiguous() and not t.storage_offset():
            block = self._block(key)
            if key not in self.patches:
                return block[:size]
            n = t.numel()
            where = (n, size, block.device)
            if where not in self._positions:  # the sampled places of a tensor of n elements, and their tile entries
                positions = _sampled_positions(n, size, block.device)
                self._positions[where] = torch.stack([positions, positions % TILE])
            positions, index = self._positions[where]
            values = block[index]
            for written, value in self.patches.get(key, []):
                values = torch.where(torch.isin(positions, written), value, values)
            return values
        self._materialise(key)
        return _sampled(t, size)

    def _materialise(self, key: Optional[int]) -> None:
        """Write out the values ``key``'s tensor stands for, without counting it as a write of the init
        (through an alias with a version counter of its own)."""
        if key in self.original:
            fresh, original = self.original.pop(key)
            with torch.no_grad():
                _alias(fresh).copy_(original)
        elif key in self.pending:
            fresh, fill = self.pending.pop(key)
            with torch.no_grad():
                self.run(fill.draw, _alias(fresh))
        elif key in self.tiled:
            block = self._block(key)
            fresh, _ = self.tiled.pop(key)
            flat = _alias(fresh).view(-1)
            rows = flat.numel() // TILE
            with torch.no_grad():
                flat[:TILE].copy_(block)
                flat[TILE:rows * TILE].view(rows - 1, TILE).copy_(block.expand(rows - 1, TILE))
                flat[rows * TILE:].copy_(block[:flat.numel() - rows * TILE])
                for written, value in self.patches.pop(key, []):
                    flat[written] = value

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        try:
            return self._guarded(func, args, kwargs or {})
        except _Foreign:
            raise
        except Exception as exc:
            if not self.op_failed(exc) and self.failure is None:
                self.failure = exc
            raise

    def _guarded(self, func: Any, args: Any, kwargs: Any) -> Any:
        for t in _written_args(func, args, kwargs):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.numel():
                key = _storage(t)
                if key not in self.owned:
                    raise _Foreign(f"{func} writes a tensor the private copy does not own")
                self.wrote.add(key)
        out = self._dispatch(func, args, kwargs)
        for t in (out if isinstance(out, (list, tuple)) else [out]):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                self.owned.add(_storage(t))
        return out

    def _dispatch(self, func: Any, args: Any, kwargs: Any) -> Any:
        if func in _NO_READ:
            out = self.run(func, *args, **kwargs)
            if isinstance(out, torch.Tensor) and out.numel() >= 4 * TILE:
                self.large.add(_storage(out))  # a fresh tensor a random fill may draw as a tile
            return out
        if func.is_view or (not (self.original or self.tiled or self.pending) and func not in _DEFERRED_FILLS):
            # nothing stands for other values yet; a random or constant fill is still deferred (a streamed
            # block's copy starts as empty memory with no original to stand for, and its fills need not be drawn)
            return self.run(func, *args, **kwargs)
        tiled = self._on_tiles(func, args, kwargs)
        if tiled is not _NOT_TILED:
            return tiled
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if func in _CONSTANT_FILLS and target is not None and self._patch(func, target, args[1:], kwargs):
            return target
        whole = func in _OVERWRITES and target is not None and _covers(target)
        tkey = _storage(target) if whole else None
        for i, t in enumerate(_leaves(args, kwargs)):
            if t.layout == torch.strided and t.numel() and not (i == 0 and whole):
                self._materialise(_storage(t))
        if not whole:
            return self.run(func, *args, **kwargs)
        self._forget(tkey)
        if func in _RANDOM_FILLS or (func in _CONSTANT_FILLS and target.is_floating_point()
                                     and _constant(func, tuple(args[1:]), kwargs, torch.float64) is not None):
            # written only when read (a BatchNorm's ones and zeros, a bias's zeros): most never are, and their
            # draw is then exact, without a sample
            fill = _Fill(func, tuple(args[1:]), dict(kwargs), target.dtype, target.device)
            if tkey in self.large and _tileable(target):
                self.tiled[tkey] = (target, fill)
            else:
                self.pending[tkey] = (target, fill)
            return target
        return self.run(func, *args, **kwargs)

    def _patch(self, func: Any, view: torch.Tensor, args: Any, kwargs: Any) -> bool:
        """A constant written over part of a tiled tensor (``zero_``, ``fill_`` of a few rows), kept beside
        its tile instead of writing the tile out."""
        key = _storage(view) if view.layout == torch.strided and view.numel() else None
        if key not in self.tiled or kwargs or view.numel() > PATCH or _covers(view):
            return False
        if func is torch.ops.aten.zero_.default and not args:
            value = 0.0
        elif func is torch.ops.aten.fill_.Scalar and len(args) == 1 and isinstance(args[0], (int, float)):
            value = float(args[0])
        else:
            return False
        positions = torch.full((), view.storage_offset(), dtype=torch.int64, device=view.device)
        for size, stride in zip(view.shape, view.stride()):
            positions = (positions[..., None] + torch.arange(size, device=view.device) * stride)
        self.patches.setdefault(key, []).append((positions.reshape(-1), value))
        return True

    def _forget(self, key: Optional[int]) -> None:
        """Drop what ``key``'s tensor stood for: the whole of it is being overwritten."""
        for held in (self.original, self.tiled, self.pending, self.patches):
            held.pop(key, None)  # type: ignore[arg-type]

    def _stands_in(self, key: int) -> bool:
        """Whether ``key``'s tensor holds nothing yet: its values are its original's or a tile's."""
        return key in self.original or key in self.tiled or key in self.pending

    def _block(self, key: int) -> torch.Tensor:
        """The tile of ``key``'s tensor, drawn now if its fill has not drawn it yet."""
        target, block = self.tiled[key]
        if isinstance(block, _Fill):
            block = self.run(block.draw)
            self.tiled[key] = (target, block)
        return block

    def _tile_key(self, t: Any) -> Optional[int]:
        """The storage of ``t`` when ``t`` is the whole of a tiled tensor (no patch over its tile), else None."""
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or not t.numel():
            return None
        key = _storage(t)
        entry = self.tiled.get(key) if key not in self.patches else None
        return key if entry is not None and entry[0].shape == t.shape and _tileable(t) else None

    def draws(self, tensors: Sequence[torch.Tensor]) -> List[Draw]:
        """:func:`draws_of` for private tensors: a tensor that only a random fill wrote (its values never drawn,
        nothing done to it since) has the draw of its distribution, exactly; the others are sampled."""
        exact = [self._exact(t) for t in tensors]
        sampled = iter(draws_of([t for t, d in zip(tensors, exact) if d is None], sample=self.sample))
        return [d if d is not None else next(sampled) for d in exact]

    def _exact(self, t: torch.Tensor) -> Optional[Draw]:
        key = _storage(t) if t.layout == torch.strided and t.numel() else None
        entry = (self.tiled.get(key) or self.pending.get(key)) if key is not None else None
        if entry is None or not isinstance(entry[1], _Fill) or key in self.patches or entry[0].shape != t.shape:
            return None
        return entry[1].exact(min(t.numel(), SAMPLE))

    def _on_tiles(self, func: Any, args: Any, kwargs: Any) -> Any:
        """An op on tiled tensors done on their tiles, when its result is the same tile repeated: a pointwise
        op whose tensors are tensors tiled alike and numbers (``trunc_normal_``'s ``erfinv_``, ``mul_``,
        ``clamp_``, its bounds' mask), a reduction of the whole tensor to its extremes or to whether
        any or all are true (a tiled tensor holds every value of its tile), and a copy of a whole tiled
        tensor. :data:`_NOT_TILED` otherwise, before any tile is drawn: a fill that overwrites a tiled
        tensor (``kaiming_normal_`` after the first ``normal_``) needs nothing of its old tile."""
        if not self.tiled:
            return _NOT_TILED
        if func not in _WHOLE_REDUCTIONS and func is not torch.ops.aten.copy_.default \
                and (torch.Tag.pointwise not in func.tags or "out" in kwargs):
            return _NOT_TILED
        leaves = _leaves(args, kwargs)
        keys = [self._tile_key(t) for t in leaves]
        if all(key is None for key in keys):
            return _NOT_TILED
        shape = next(t.shape for t, key in zip(leaves, keys) if key is not None)
        if func in _WHOLE_REDUCTIONS:
            if len(leaves) == 1 and not kwargs and len(args) == 1:
                return self.run(func, self._block(keys[0]))  # type: ignore[arg-type]
            return _NOT_TILED
        if func is torch.ops.aten.copy_.default:
            if len(args) == 2 and not kwargs and keys[1] is not None and keys[0] is None and args[0].shape == shape \
                    and _tileable(args[0]):
                source = self._block(keys[1])
                if args[0].dtype == source.dtype and args[0].device == source.device:
                    key = _storage(args[0])
                    self._forget(key)
                    self.tiled[key] = (args[0], source.clone())
                    return args[0]
            return _NOT_TILED
        tiles = [self._block(key) if key is not None else None for key in keys]
        for t, tile in zip(leaves, tiles):
            if tile is None and (t.dim() or (t.numel() and self._stands_in(_storage(t)))):
                return _NOT_TILED  # a full-size operand, or a lazy one
            if tile is not None and t.shape != shape:
                return _NOT_TILED
        swap = {id(t): tile for t, tile in zip(leaves, tiles) if tile is not None}
        on_tiles = pytree.tree_map(lambda x: swap.get(id(x), x) if isinstance(x, torch.Tensor) else x, (args, kwargs))
        inplace = is_inplace(func)
        if inplace and (not leaves or swap.get(id(args[0])) is None):
            return _NOT_TILED
        result = self.run(func, *on_tiles[0], **on_tiles[1])
        if inplace:
            return args[0]
        if not isinstance(result, torch.Tensor) or result.shape != (TILE,):
            raise RuntimeError(f"{func} on tiles gave {type(result).__name__}")  # not expected of a pointwise op
        out = torch.empty(shape, dtype=result.dtype, device=result.device)
        self.tiled[_storage(out)] = (out, result)
        return out


def _leaves(args: Any, kwargs: Any) -> List[Any]:
    """The tensors among an op's arguments (its lists of tensors too): pytree's walk, without its cost."""
    out = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


@functools.lru_cache(maxsize=None)
def _written_names(func: Any) -> Tuple[Tuple[int, str], ...]:
    """(position, name) of the arguments ``func`` writes (``self`` of an in-place op, ``out=``)."""
    return tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def _written_args(func: Any, args: Any, kwargs: Any) -> List[Any]:
    out = []
    for i, name in _written_names(func):
        value = args[i] if i < len(args) else kwargs.get(name)
        out.extend(value if isinstance(value, (list, tuple)) else [value])
    return out


@dataclass
class _Fill:
    """A random fill of a whole large private tensor whose tile is drawn only when something reads it."""

    func: Any
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    dtype: torch.dtype
    device: torch.device

    def draw(self, into: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The fill's values: :data:`TILE` of them, or the whole of ``into``."""
        block = torch.empty(TILE, dtype=self.dtype, device=self.device) if into is None else into
        self.func(block, *self.args, **self.kwargs)
        return block

    def exact(self, n: int) -> Optional[Draw]:
        """The draw of the fill's distribution (``normal_(mean, std)``, ``uniform_(low, high)``, a constant) in
        float32 or float64, whose rounding moves no statistic; None elsewhere (half precision rounds a small
        std's values to zero)."""
        if self.dtype not in (torch.float32, torch.float64):
            return None
        if self.func in _CONSTANT_FILLS:
            value = _constant(self.func, self.args, self.kwargs, self.dtype)
            return None if value is None else Draw(n, 0.0, value, float(value == 0), float(value == 1), None)
        a = float(self.args[0]) if self.args else float(self.kwargs.get("mean" if self._normal else "from", 0.0))
        b = float(self.args[1]) if len(self.args) > 1 else float(self.kwargs.get("std" if self._normal else "to", 1.0))
        if self._normal:
            return Draw(n, b, a, 0.0, 0.0, 3.0) if b > 0 and math.isfinite(a) and math.isfinite(b) else None
        if not (b > a and math.isfinite(a) and math.isfinite(b)):
            return None
        return Draw(n, (b - a) / math.sqrt(12), (a + b) / 2, 0.0, 0.0, 1.8)

    @property
    def _normal(self) -> bool:
        return self.func is torch.ops.aten.normal_.default


def _constant(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], dtype: torch.dtype) -> Optional[float]:
    """The value a constant fill (``zero_()``, ``fill_(number)``) writes, as ``dtype`` (float32 or float64)
    holds it; None for another fill, or a value that is not a finite number."""
    if kwargs:
        return None
    if func is torch.ops.aten.zero_.default and not args:
        return 0.0
    if func is not torch.ops.aten.fill_.Scalar or len(args) != 1 or not isinstance(args[0], (bool, int, float)):
        return None
    value = float(args[0])
    if not math.isfinite(value) or abs(value) > torch.finfo(dtype).max:
        return None
    return struct.unpack("f", struct.pack("f", value))[0] if dtype == torch.float32 else value


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _tileable(t: torch.Tensor) -> bool:
    """A tensor a tile can stand for: large, contiguous, the whole of its storage."""
    return t.numel() >= 4 * TILE and t.is_contiguous() and not t.storage_offset() \
        and t.numel() * t.element_size() == t.untyped_storage().nbytes()


def _covers(t: torch.Tensor) -> bool:
    """Whether ``t`` is every element of its storage, once each."""
    if t.layout != torch.strided or t.storage_offset() or t.numel() * t.element_size() != t.untyped_storage().nbytes():
        return False
    extent = 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
    return extent == t.numel()  # numel elements within numel places: each place once


def _alias(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory as a tensor with a version counter of its own."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(),
                                                                 t.shape, t.stride())


def _pass(tensors: Dict[str, torch.Tensor], steps: List[Tuple[str, nn.Module, Optional[Callable[[], Any]]]],
          lazy: "_Private", writer: Optional[Dict[str, str]] = None) -> Dict[str, Draw]:
    before = {name: t._version for name, t in tensors.items()}
    lazy.wrote = set()
    with lazy.drawing(tensors.values()):
        _run_steps(tensors, steps, writer, lazy)
    written = list(_written(before, tensors, lazy))
    return dict(zip(written, _drawn(lazy, [tensors[n] for n in written])))


def _init_step(step: Callable[[], Any], lazy: "_Private") -> None:
    """One call of the declared init on the private copy. Its error means the init cannot run there
    (:class:`_Undeclared`); an error of the replay is raised as it is, also when the init caught it."""
    try:
        step()
    except _Foreign:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's init code; the replay's own error is lazy.failure
        lazy.raise_failure()
        raise _Undeclared(f"{type(exc).__name__}: {exc}") from exc
    lazy.raise_failure()


def _drawn(lazy: "_Private", tensors: Sequence[torch.Tensor]) -> List[Draw]:
    """:meth:`_Private.draws`; a random fill the init deferred fails here when its arguments were bad."""
    try:
        return lazy.draws(tensors)
    except Exception as exc:
        if lazy.op_failed(exc):
            raise _Undeclared(f"{type(exc).__name__}: {exc}") from exc
        raise


def _run_steps(tensors: Dict[str, torch.Tensor], steps: List[Tuple[str, nn.Module, Optional[Callable[[], Any]]]],
               writer: Optional[Dict[str, str]], lazy: "_Private") -> None:
    under: Dict[str, List[str]] = {}  # module path -> the tensors at or below it
    if writer is not None:
        for n in tensors:
            for path in ["", *enclosing_paths(n), n]:
                under.setdefault(path, []).append(n)
    for path, module, step in steps:
        if step is None:
            continue
        if writer is None:
            _init_step(step, lazy)
            continue
        versions = {n: tensors[n]._version for n in under.get(path, [])}
        _init_step(step, lazy)
        for n, version in versions.items():
            if tensors[n]._version != version:
                writer[n] = path




def _on_meta(m: nn.Module) -> bool:
    return any(t.device.type == "meta" for t in m.parameters())

def declare_applied(model: nn.Module, unit: nn.Module, whole: bool, path: str, originals: List[nn.Module],
                    owners: Dict[int, Any], differs: Callable[[str, Draw], bool],
                    every: Optional[List[nn.Module]] = None) -> Optional[Declared]:
    """What the declared init (each owner's ``_init_weights`` applied children first, as ``model.apply`` does)
    makes of the parameters of ``unit`` (its subtree when ``whole``) at ``path`` in ``model``, on private
    copies; where that differs from what a parameter holds (``differs``), PyTorch's defaults and each module's
    own init too. None when the init cannot run on a copy (it raised, or it writes the model's tensors).
    ``originals``: ``unit``'s modules in :func:`post_order`; ``owners``: module id -> its owner (``.module``
    has ``_init_weights``)."""
    try:
        return _on_copies(lambda deep: _declare_applied(lambda: _private_copy(model, unit, whole, deep, every), path,
                                                        originals, owners, differs))
    except (_Undeclared, _Foreign):
        return None


def declare_called(model: nn.Module, scope: nn.Module, method: str, path: str,
                   differs: Callable[[str, Draw], bool], every: Optional[List[nn.Module]] = None
                   ) -> Optional[Tuple[Dict[str, Draw], Dict[str, List[Tuple[str, Draw]]]]]:
    """What ``scope.<method>()`` (an init method without arguments) makes of its parameters, on a private copy,
    and, where that differs from what a parameter holds, PyTorch's defaults per holder; None when the method
    cannot run on a copy."""
    def declare(deep: bool) -> Tuple[Dict[str, Draw], Dict[str, List[Tuple[str, Draw]]]]:
        private = _private_copy(model, scope, True, deep, every)
        tensors = {join_path(path, n): p for n, p in private.named_parameters()}
        full = _pass(tensors, [(path, private, getattr(private, method))], _lazy_of(private))
        default: Dict[str, List[Tuple[str, Draw]]] = {}
        if any(differs(n, d) for n, d in full.items()):
            private = _private_copy(model, scope, True, deep, every)
            tensors = {join_path(path, n): p for n, p in private.named_parameters()}
            default = _defaults(tensors, post_order(private, path), _lazy_of(private))
        return full, default

    try:
        return _on_copies(declare)
    except (_Undeclared, _Foreign):
        return None
