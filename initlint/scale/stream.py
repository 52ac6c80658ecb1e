"""Streaming audit of a model on the ``meta`` device: one block holds values at a time.

A model built under ``with torch.device("meta")`` has shapes but no values, and may not fit
in memory once it has them. This module audits it block by block (the embedding, each
transformer block or residual stage, the head): a block's tensors are given storage on the
audit device and initialised just before its forward runs, its statistics are taken by the
same observer as for any model, and the storage is released when the next block starts.
Block inputs are kept; the backward probe recomputes each block from them, in reverse order,
with its weights drawn again from the same random state. Peak memory is about the largest
block plus the probe's activations, whatever the size of the model.

Initialisation follows the model: each module's own ``reset_parameters()`` by default, a
Hugging Face model's own ``_init_weights``, or the user's ``init(module)``, called once for
every module that directly owns parameters or buffers, in module order, from one random
stream seeded with the audit's seed. Values are thus the ones the materialised model
``model.to_empty(device=...)`` gets when the same init is applied to it in that order after
``torch.manual_seed(seed)``; on CPU, a random fill of 2**24 elements or more is drawn by several threads
instead (:class:`_ParallelFills`: the same distribution from other generators, seeded from that
stream), which a materialised model's fill is not. A tensor the init leaves unset is filled by the module's own
logic (a rotary ``inv_freq``, a norm's ones); a tensor tied across blocks is materialised
once, by its first owner in module order, and stays in memory for the whole audit.

The user's model is not touched: the audit works on a copy, whose tensors keep their Python
identity (``torch.utils.swap_tensors``), so captured graphs and parameter names are the
ones a materialised model gives.
"""
from __future__ import annotations

import copy
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..capture import ops as O
from ..capture import Capture, RuntimeCapture, capture
from ..capture.base import DropoutOff, grad_without_dropout
from ..attempts import ForwardFailed, _batch_of, _halve_batch, _out_of_memory_at_smallest
from ..compat import out_of_memory as _out_of_memory
from ..inputs.load import LoadError
from ..probe import draw
from ..probe.guard import saved_rng, seed_devices
from ..probe.duplicates import confirm_duplicates_now
from ..probe.run import (GRAD_EXTREMES, ProbeResult, StatsObserver, _Collector, _param_stats, backward_possible,
                         confirm_extremes, primary_output, put_logits, summarise, used_params, weight_units)
from ..probe.declared import defined_outside_torch, draw_of, post_order
from ..rules.il014_init_not_applied import _arity, _hf_base

InitFn = Callable[[nn.Module], None]

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
_PARALLEL_FILL = 1 << 24
"""Elements from which a random fill of a streamed block on CPU is drawn by several threads
(:class:`_ParallelFills`)."""
_PROGRESS_AFTER = 2.0
"""Seconds after which block-by-block progress is printed (to a terminal only)."""


class StreamError(LoadError):
    """The model cannot be audited block by block (a tensor nothing can initialise, a bad ``init``)."""


@dataclass
class BlockProgress:
    """What a ``progress`` callback receives after each block of a streamed audit."""

    phase: str
    """``forward`` or ``backward``."""
    index: int
    """1-based position of the block in this phase."""
    total: int
    """Number of blocks the phase runs through (a block called twice counts twice)."""
    block: str
    """Module path of the block (``model.layers.3``)."""
    seconds: float
    """Time since the audit started."""
    remaining: Optional[float] = None
    """Estimated seconds left: the time so far, per byte of the blocks done, times the bytes of the blocks
    left (each block once forward and once backward); None before the first block's end."""


@dataclass
class _Group:
    """Tensors materialised together, and the init steps that fill them (``steps[first:last]``)."""

    path: str
    module: nn.Module
    kind: str  # "unit": a block called as a whole; "loose": a module's own tensors; "none": nothing to hold
    first: int
    last: int
    tensors: List[torch.Tensor] = field(default_factory=list)
    nbytes: int = 0


# ----------------------------------------------------------------------------- plan
def is_streamable(model: nn.Module) -> bool:
    """True when the model's parameters and buffers are all on the ``meta`` device (and there is one)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return bool(tensors) and all(t.device.type == "meta" for t in tensors)


def _direct(module: nn.Module) -> List[Tuple[str, str, torch.Tensor]]:
    """``(kind, name, tensor)`` of the parameters and buffers ``module`` itself owns."""
    found = [("param", n, p) for n, p in module._parameters.items() if p is not None]
    return found + [("buffer", n, b) for n, b in module._buffers.items() if b is not None]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _units(model: nn.Module, callable_paths: Optional[Set[str]]) -> List[str]:
    """Module paths of the blocks: the largest modules that hold tensors, are called as a whole
    and contain no container of stages (``ModuleList``, ``Sequential``); the root never is one."""
    holds: Dict[int, bool] = {}
    has_stages: Dict[int, bool] = {}

    def scan(m: nn.Module) -> Tuple[bool, bool]:
        if id(m) not in holds:
            below = [scan(c) for c in m.children()]
            holds[id(m)] = bool(_direct(m)) or any(h for h, _ in below)
            has_stages[id(m)] = any(isinstance(c, _CONTAINERS) or s for c, (_, s) in zip(m.children(), below))
        return holds[id(m)], has_stages[id(m)]

    scan(model)
    units: List[str] = []
    seen: Set[int] = set()

    def visit(path: str, m: nn.Module, root: bool) -> None:
        if id(m) in seen or not holds[id(m)]:
            return
        seen.add(id(m))
        called = callable_paths is None or path in callable_paths
        if not root and called and not isinstance(m, _CONTAINERS) and not has_stages[id(m)]:
            units.append(path)
            return
        for name, child in m.named_children():
            visit(_join(path, name), child, False)

    visit("", model, True)
    return units


def _hf_owner(model: nn.Module) -> Dict[int, Any]:
    """Module id -> the model whose ``_init_weights(module)`` applies to it: the nearest Hugging Face
    ``PreTrainedModel`` at or above it, else the nearest module that declares ``_init_weights(module)``
    for its subtree (nanoGPT's ``self.apply(self._init_weights)``)."""
    hf = sys.modules.get("transformers.modeling_utils")  # a Hugging Face model has imported it already
    PreTrainedModel = getattr(hf, "PreTrainedModel", None)
    owner: Dict[int, Any] = {}

    def walk(m: nn.Module, current: Any) -> None:
        if PreTrainedModel is not None and isinstance(m, PreTrainedModel):
            current = m
        elif (current is None or not _is_hf(current)) and _declares_applied_init(m):
            current = m
        if id(m) in owner:
            return
        owner[id(m)] = current
        for child in m.children():
            walk(child, current)

    walk(model, None)
    return owner if any(v is not None for v in owner.values()) else {}


def _is_hf(owner: Any) -> bool:
    hf = _hf_base()
    return hf is not None and isinstance(owner, hf)


def _declares_applied_init(m: nn.Module) -> bool:
    return defined_outside_torch(m, "_init_weights") and _arity(m._init_weights) == 1


def _whole_model_init(model: nn.Module) -> Optional[str]:
    """A no-argument init the model declares for itself (torchtitan's ``init_weights()``), which no
    block-by-block audit can run: it initialises the whole model at once."""
    for method in ("init_weights", "reset_parameters", "_init_weights"):
        fn = getattr(model, method, None)
        if callable(fn) and defined_outside_torch(model, method) and _arity(fn) == 0:
            return f"{type(model).__name__}.{method}()"
    return None


class Plan:
    """Init steps in order and their grouping into blocks."""

    def __init__(self, model: nn.Module, callable_paths: Optional[Set[str]], init: Optional[InitFn]) -> None:
        self.model = model
        self.hf = _hf_owner(model)
        if self.hf and init is None:
            self.steps = post_order(model)  # every module: HF inits read parents (GPT-2's c_proj)
        else:
            self.steps = [(p, m) for p, m in model.named_modules() if _direct(m)]
        units = _units(model, callable_paths)
        self.groups: List[_Group] = []
        self.group_of: Dict[int, _Group] = {}  # step index -> group
        self.unit_of: Dict[int, _Group] = {}  # module id -> its block
        for index, (path, module) in enumerate(self.steps):
            unit = next((u for u in units if path == u or path.startswith(u + ".")), None)
            kind = "unit" if unit is not None else ("loose" if _direct(module) else "none")
            key = unit if unit is not None else path
            last = self.groups[-1] if self.groups else None
            if last is not None and last.kind == "unit" and kind == "unit" and last.path == key:
                last.last = index + 1
            else:
                owner = model.get_submodule(key) if key else model
                self.groups.append(_Group(key, owner, kind, index, index + 1))
            self.group_of[index] = self.groups[-1]
        blocks = [g.path for g in self.groups if g.kind == "unit"]
        if len(set(blocks)) != len(blocks):  # a block's modules must be initialised one after another
            raise StreamError(f"cannot audit {type(model).__name__} block by block: the modules of a block are "
                              f"not consecutive in module order")
        self._assign_tensors()

    def _assign_tensors(self) -> None:
        self.holders: Dict[int, List[Tuple[nn.Module, str, str]]] = {}
        groups_of: Dict[int, Set[int]] = {}
        for group in self.groups:
            if group.kind == "none":
                continue
            modules = group.module.modules() if group.kind == "unit" else [group.module]
            if group.kind == "unit":
                for m in group.module.modules():
                    self.unit_of[id(m)] = group
            for m in modules:
                for kind, name, t in _direct(m):
                    self.holders.setdefault(id(t), []).append((m, kind, name))
                    if id(t) not in groups_of:
                        group.tensors.append(t)
                        group.nbytes += t.numel() * t.element_size()
                    groups_of.setdefault(id(t), set()).add(id(group))
        self.kept: Set[int] = {i for i, gs in groups_of.items() if len(gs) > 1}
        """Tensors held by several blocks (tied weights): materialised once, kept until the end."""

    @property
    def units(self) -> List[_Group]:
        return [g for g in self.groups if g.kind == "unit"]


# ----------------------------------------------------------------------------- random state
def _rng_get(device: torch.device) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    if device.type == "cuda":
        return torch.get_rng_state(), torch.cuda.get_rng_state(device)
    if device.type == "mps":
        return torch.get_rng_state(), torch.mps.get_rng_state()
    return torch.get_rng_state(), None


def _rng_set(state: Tuple[torch.Tensor, Optional[torch.Tensor]], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        if device.type == "cuda":
            torch.cuda.set_rng_state(state[1], device)
        else:
            torch.mps.set_rng_state(state[1])


def _rng_seeded(seed: int, device: torch.device) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    restore = saved_rng()
    seed_devices(seed)
    state = _rng_get(device)
    restore()
    return state


# ----------------------------------------------------------------------------- materialisation
def _sentinel(t: torch.Tensor) -> Optional[float]:
    """The fill that marks a tensor no init has written: NaN for floats, the lowest integer for ints."""
    if t.is_floating_point() or t.is_complex():
        return float("nan")
    if t.dtype == torch.bool:
        return None
    return float(torch.iinfo(t.dtype).min)


def _swap(t: torch.Tensor, value: torch.Tensor) -> None:
    """Give ``t`` the storage of ``value`` in place, keeping the Python object (and its id)."""
    new = nn.Parameter(value, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else value
    torch.utils.swap_tensors(t, new)


def _empty(t: torch.Tensor, device: torch.device, spare: Optional[torch.Tensor] = None) -> None:
    """Storage for ``t`` on ``device``: ``spare``'s (a released tensor of the same shape), its own old
    storage if it was emptied, else a new one."""
    if t.device.type != "meta":
        t.untyped_storage().resize_(t.numel() * t.element_size())
    else:
        _swap(t, spare if spare is not None else torch.empty(t.shape, dtype=t.dtype, device=device))


def _drop(t: torch.Tensor) -> Optional[torch.Tensor]:
    """Back to the meta device; returns a plain tensor on the storage ``t`` gave up. A tensor
    something still holds a weak reference to keeps its object and device but gives its
    storage back (it is refilled before any further use)."""
    try:
        holder = nn.Parameter(torch.empty(t.shape, dtype=t.dtype, device="meta"), requires_grad=t.requires_grad) \
            if isinstance(t, nn.Parameter) else torch.empty(t.shape, dtype=t.dtype, device="meta")
        torch.utils.swap_tensors(t, holder)
    except RuntimeError:
        t.untyped_storage().resize_(0)
        return None
    return holder.detach()


def _key(t: torch.Tensor) -> Tuple[Any, ...]:
    return tuple(t.shape), t.dtype


class Materialiser:
    """Gives groups storage and values, and takes it back; replays the init's random stream."""

    def __init__(self, plan: Plan, device: torch.device, init: Optional[InitFn], seed: int) -> None:
        self.plan = plan
        self.device = device
        self.init = init
        self.seed = seed
        self.states: Dict[int, Tuple[torch.Tensor, Optional[torch.Tensor]]] = {0: _rng_seeded(seed, device)}
        self.frontier = 0  # steps before it have run once, so states[i] is known for i <= frontier
        self.live: Set[int] = set()  # ids of tensors that hold values
        self.live_groups: List[_Group] = []
        self.spares: Dict[Tuple[Any, ...], List[torch.Tensor]] = {}
        """Storage the last released block gave up, by shape: the next block of the same shapes
        (the next transformer layer) takes it over instead of faulting in fresh pages."""
        self.forget: Callable[[torch.Tensor], None] = lambda t: None
        """Called before a tensor is released: drops the capture's weak references to it."""
        self.drawn: Dict[str, Any] = {}
        """Parameter name -> the statistics of the values its init gave it (recorded once)."""
        self.left_unset: Dict[str, None] = {}
        """Weights ``init`` left unset, filled by their module's own logic (ordered, without repeats)."""

    # -- public
    def ensure(self, group: _Group) -> None:
        """Give ``group`` its values (a no-op when it holds them already)."""
        if group in self.live_groups:
            return
        self._skip_to(group.first)
        self._materialise(group)
        self.live_groups.append(group)

    def release(self, group: _Group) -> None:
        """Take the storage back (tied tensors stay)."""
        if group not in self.live_groups:
            return
        self.live_groups.remove(group)
        for t in group.tensors:
            if id(t) in self.plan.kept or id(t) not in self.live:
                continue
            self.forget(t)
            spare = _drop(t)
            if spare is not None:
                self.spares.setdefault(_key(spare), []).append(spare)
            self.live.discard(id(t))

    def release_all(self) -> None:
        for group in list(self.live_groups):
            self.release(group)
        for group in self.plan.groups:
            for t in group.tensors:
                if id(t) in self.live:
                    self.forget(t)
                    _drop(t)
                    self.live.discard(id(t))
        self.spares.clear()

    # -- internals
    def _spare(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        spares = self.spares.get(_key(t)) if t.device.type == "meta" else None
        return spares.pop() if spares else None

    def _skip_to(self, step: int) -> None:
        """Run the init steps before ``step`` that never ran, so its random state is known. On CPU a block
        released right after is run dry (:class:`_ParallelFills`): its large fills take their one draw of the
        random stream and write nothing (a Llama's head, last in module order but held from the start, would
        otherwise draw every layer one more time)."""
        while self.frontier < step:
            group = self.plan.group_of[self.frontier]
            dry = self.device.type == "cpu" and group.kind != "loose" \
                and not any(id(t) in self.plan.kept for t in group.tensors)
            self._materialise(group, dry=dry)
            if group.kind != "loose":
                self.live_groups.append(group)
                self.release(group)

    def _materialise(self, group: _Group, dry: bool = False) -> None:
        """Give ``group``'s tensors storage and run its init steps; ``dry``: for the random state after them only
        (the large fills write nothing; nothing is recorded), the group being released right after."""
        fresh = [t for t in group.tensors if id(t) not in self.live]
        reused = [self._spare(t) for t in fresh]
        self.spares.clear()  # what no tensor of this block can use goes before new storage is taken
        with torch.no_grad():
            for t, spare in zip(fresh, reused):
                _empty(t, self.device, spare)
                _mark(t)
                self.live.add(id(t))
        if fresh or group.last not in self.states:
            self._run_steps(group, {id(t) for t in fresh}, dry)
            self._fill_unset(group, fresh)
            if not dry:
                self._record(fresh)

    def _record(self, fresh: List[torch.Tensor]) -> None:
        """What the init gave each parameter, the first time it is drawn (IL014 compares it with the declared init)."""

        for t in fresh:
            m, kind, name = self.plan.holders[id(t)][0]
            path = _join(_path_of(self.plan.model, m), name)
            if kind == "param" and t.is_floating_point() and path not in self.drawn:
                self.drawn[path] = draw_of(t, full=True)

    def _run_steps(self, group: _Group, fresh: Set[int], dry: bool = False) -> None:
        outer = _rng_get(self.device)
        parallel = _ParallelFills(dry) if self.device.type == "cpu" else nullcontext()
        try:
            _rng_set(self.states[group.first], self.device)
            with torch.no_grad(), parallel:
                for index in range(group.first, group.last):
                    path, module = self.plan.steps[index]
                    with _Scratch(module, fresh, self.live):
                        self._call(path, module)
            self.states.setdefault(group.last, _rng_get(self.device))
            self.frontier = max(self.frontier, group.last)
        finally:
            _rng_set(outer, self.device)

    def _call(self, path: str, module: nn.Module) -> None:
        if self.init is not None:
            try:
                self.init(module)
            except Exception as exc:
                raise StreamError(f"init({path or '<model>'}: {type(module).__name__}) raised "
                                  f"{type(exc).__name__}: {exc}") from None
            return
        _default_init(self.plan, module)

    def _fill_unset(self, group: _Group, fresh: List[torch.Tensor]) -> None:
        unset = _unset(fresh)
        if not unset:
            return
        owners = {}
        for t in unset:
            for m, kind, name in self.plan.holders[id(t)]:
                owners.setdefault(id(m), (m, []))[1].append((kind, name, t))
            m, kind, name = self.plan.holders[id(t)][0]
            if self.init is not None and kind == "param" and t.dim() >= 2:  # weights; norms and biases have defaults
                self.left_unset[_join(_path_of(self.plan.model, m), name)] = None
        for index, (module, tensors) in enumerate(owners.values()):
            self._own_logic(module, tensors, index + group.first)
        still = _unset([t for _, ts in owners.values() for _, _, t in ts])
        if still:
            m, kind, name = self.plan.holders[id(still[0])][0]
            path = _path_of(self.plan.model, m)
            what = f"{'parameter' if kind == 'param' else 'buffer'} '{_join(path, name)}' ({type(m).__name__})"
            own = self.plan.hf.get(id(m))
            logic = (f"{type(own).__name__}._init_weights does not set it" if own is not None else
                     f"{type(m).__name__} has no reset_parameters() to set it")
            if self.init is not None:
                raise StreamError(f"{what} is on the meta device, init leaves it unset and {logic}; "
                                  f"make init set it")
            raise StreamError(f"{what} is on the meta device and {logic}; pass init= to initlint.audit "
                              f"with a function that sets it")

    def _own_logic(self, module: nn.Module, tensors: List[Tuple[str, str, torch.Tensor]], salt: int) -> None:
        """Fill unset tensors with the module's own logic, keeping what the init wrote."""
        unset = {id(t) for _, _, t in tensors}
        saved = [(t, t.detach().clone()) for _, _, t in _direct(module) if id(t) not in unset and id(t) in self.live]
        restore = saved_rng()
        try:
            seed_devices(self.seed + 1_000_003 * (salt + 1))  # reproducible, off the init's own stream
            with torch.no_grad():
                _default_init(self.plan, module)
                for t, value in saved:
                    t.copy_(value)
        finally:
            restore()


class _ParallelFills(TorchDispatchMode):
    """While a block's init steps run on CPU: a ``normal_`` or ``uniform_`` fill of a contiguous tensor of at
    least :data:`_PARALLEL_FILL` elements, from the global generator, is drawn in ``torch.get_num_threads()``
    chunks by as many threads, each from a generator of its own seeded from one draw of the global stream.
    So such a fill moves the global stream by exactly one draw, whatever its size: ``dry`` takes that draw
    and writes only the tensor's two ends (so it does not read as unset), which leaves the random state
    where a real run leaves it, for a block drawn only to reach the state after it.
    One generator draws some 250 million elements a second here (a 70B-shaped layer, 855 million, drawn for
    the forward and again for the backward); two threads draw about twice that. The block drawn again for the
    backward starts from the same global state, so it gets the same values. A dispatch mode: the init steps
    may run inside a torch-function handler (the runtime capture's), where torch-function modes are off."""

    _FILLS = {torch.ops.aten.normal_.default: ("mean", "std"), torch.ops.aten.uniform_.default: ("from", "to")}

    def __init__(self, dry: bool = False) -> None:
        super().__init__()
        self.dry = dry

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Optional[Dict] = None):
        kwargs = kwargs or {}
        names = self._FILLS.get(func)
        target = args[0] if args else None
        if names is None or kwargs.get("generator") is not None or set(kwargs) - set(names) - {"generator"} \
                or not isinstance(target, torch.Tensor) or target.numel() < _PARALLEL_FILL \
                or target.device.type != "cpu" or not target.is_contiguous() or not target.is_floating_point():
            return func(*args, **kwargs)
        given = list(args[1:3]) + [kwargs.get(k, d) for k, d in zip(names, (0.0, 1.0))][len(args[1:3]):]
        method = "normal_" if func is torch.ops.aten.normal_.default else "uniform_"
        base = int(torch.randint(0, 1 << 62, (1,)))  # one draw of the global stream, replayed with the block
        flat = target.view(-1)
        if self.dry:
            flat[0] = flat[-1] = 0.0
            return target
        count = max(1, torch.get_num_threads())
        size = -(-flat.numel() // count)
        errors: List[BaseException] = []

        def fill(i: int) -> None:  # another thread: no mode of this one is active there
            try:
                with torch.no_grad():
                    chunk = flat[i * size:(i + 1) * size]
                    getattr(chunk, method)(*given, generator=torch.Generator().manual_seed(base + i))
            except BaseException as exc:  # noqa: BLE001 - raised again in the calling thread
                errors.append(exc)

        workers = [threading.Thread(target=fill, args=(i,)) for i in range(count)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if errors:
            raise errors[0]
        return target


class _Scratch:
    """Swaps the already-initialised tied tensors of a module for scratch copies while an init step
    runs: the step draws as it would on a fresh model (the random stream stays in step), and
    the tied value, set by its first owner, is kept."""

    def __init__(self, module: nn.Module, fresh: Set[int], live: Set[int]) -> None:
        self.module = module
        self.swapped: List[Tuple[Dict[str, Any], str, torch.Tensor]] = []
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None and id(t) not in fresh and id(t) in live:
                    self.swapped.append((table, name, t))

    def __enter__(self) -> None:
        for table, name, t in self.swapped:
            scratch = torch.empty_like(t)
            if isinstance(t, nn.Parameter):
                scratch = nn.Parameter(scratch, requires_grad=t.requires_grad)
            table[name] = scratch

    def __exit__(self, *exc: Any) -> None:
        for table, name, t in self.swapped:
            table[name] = t


def _default_init(plan: Plan, module: nn.Module) -> None:
    """The model's own init for one module: Hugging Face ``_init_weights``; else ``reset_parameters()``,
    then the ``_init_weights(module)`` the model declares (as its constructor's ``self.apply`` does)."""
    owner = plan.hf.get(id(module))
    if owner is not None and _is_hf(owner):
        owner._init_weights(module)
        return
    reset = getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
    if callable(reset) and _direct(module):
        reset()
    if owner is not None:
        owner._init_weights(module)


def _mark(t: torch.Tensor) -> None:
    """Write the sentinel where :func:`_unset` looks: both ends (filling whole tensors would add one
    more write of the whole model; an init writes whole tensors)."""
    mark = _sentinel(t)
    flat = t.view(-1)
    if mark is None or flat.numel() <= 2:
        flat.fill_(mark if mark is not None else False)
    else:
        flat[0] = mark
        flat[-1] = mark


def _unset(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Tensors still holding the sentinel at both ends (one host transfer for the lot)."""
    checked = [t for t in tensors if t.numel() and _sentinel(t) is not None]
    if not checked:
        return []
    flags = []
    for t in checked:
        flat = t.detach().reshape(-1)
        ends = torch.stack([flat[0], flat[-1]])
        mark = _sentinel(t)
        flags.append(ends.isnan().all() if mark != mark else (ends == int(mark)).all())
    found = torch.stack(flags).tolist()
    return [t for t, bad in zip(checked, found) if bad]


def _path_of(model: nn.Module, module: nn.Module) -> str:
    return next((p for p, m in model.named_modules() if m is module), "?")


# ----------------------------------------------------------------------------- probe
class _UnitCall(torch.autograd.Function):
    """One call of a block: forward without a graph, backward by recomputing it from its inputs."""

    @staticmethod
    def forward(ctx: Any, call: "_Call", dummy: torch.Tensor, *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.call = call
        ctx.save_for_backward(*tensors)
        outs = call.forward(tensors)
        ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: Optional[torch.Tensor]) -> Tuple[Optional[torch.Tensor], ...]:
        inputs = ctx.saved_tensors
        return (None, None) + ctx.call.backward(inputs, grads, ctx.needs_input_grad[2:])


class _Call:
    """What one block call needs to run again: the block, its forward, where its tensors sit among the inputs."""

    def __init__(self, probe: "StreamProbe", group: _Group, forward: Callable[..., Any], args: Tuple[Any, ...],
                 kwargs: Dict[str, Any]) -> None:
        self.probe = probe
        self.group = group
        self.fn = forward
        self.leaves, self.spec = pytree.tree_flatten((args, kwargs))
        self.slots = [i for i, v in enumerate(self.leaves) if isinstance(v, torch.Tensor)]
        self.out_leaves: List[Any] = []
        self.out_spec: Any = None
        self.out_slots: List[int] = []

    def tensors(self) -> List[torch.Tensor]:
        return [self.leaves[i] for i in self.slots]

    def _inputs(self, tensors: Sequence[torch.Tensor], recompute: bool) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        leaves = list(self.leaves)
        for i, t in zip(self.slots, tensors):
            leaves[i] = t
        if recompute:  # a cache filled by the first pass would change a recomputed attention
            leaves = [None if _is_cache(v) else v for v in leaves]
        return pytree.tree_unflatten(leaves, self.spec)

    def forward(self, tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        args, kwargs = self._inputs(tensors, recompute=False)
        out = self.fn(*args, **kwargs)
        self.out_leaves, self.out_spec = pytree.tree_flatten(out)
        self.out_slots = [i for i, v in enumerate(self.out_leaves) if isinstance(v, torch.Tensor)]
        return [self.out_leaves[i] for i in self.out_slots]

    def output(self, tensors: Sequence[torch.Tensor]) -> Any:
        leaves = list(self.out_leaves)
        for i, t in zip(self.out_slots, tensors):
            leaves[i] = t
        self.out_leaves = []  # the block's outputs live on in the caller, not here
        return pytree.tree_unflatten(leaves, self.out_spec)

    def backward(self, inputs: Sequence[torch.Tensor], grads: Sequence[Optional[torch.Tensor]],
                 needs: Sequence[bool]) -> Tuple[Optional[torch.Tensor], ...]:
        return self.probe.recompute(self, inputs, grads, needs)


def _is_cache(value: Any) -> bool:
    return any(c.__name__ == "Cache" and "transformers" in c.__module__ for c in type(value).__mro__)


class StreamProbe:
    """Runs the probe through a capture while blocks come and go."""

    def __init__(self, cap: Capture, plan: Plan, mat: Materialiser, device: torch.device, backward: bool,
                 progress: Optional[Callable[[BlockProgress], None]]) -> None:
        self.cap, self.plan, self.mat, self.device = cap, plan, mat, device
        self.backward_wanted = backward
        self.c = _Collector()
        self.names = {id(p): n for n, p in cap.model.named_parameters()}
        self.active: List[_Group] = []
        self.uses: Dict[str, int] = {}
        self.pending: Dict[str, torch.Tensor] = {}
        self.stats_done: Set[str] = set()
        self.wanted: Optional[Set[str]] = None
        self.dummy: Optional[torch.Tensor] = None
        self.progress = progress
        self.start = time.perf_counter()
        self.counts = {"forward": 0, "backward": 0}
        self.totals = {"forward": len(plan.units), "backward": 0}
        self.peak_block = max((g.nbytes for g in plan.units), default=0)
        self.work = {"done": 0.0, "total": sum(_work(g) for g in plan.units) * (2 if backward else 1)}
        mat.forget = self._forget

    def _forget(self, t: torch.Tensor) -> None:
        # The runtime capture follows tensors through weak references; a released tensor is
        # not the one those entries saw, and swap_tensors refuses a weakly referenced tensor.
        for table in ("producers", "param_views"):
            entries = getattr(self.cap, table, None)
            if isinstance(entries, dict):
                entries.pop(id(t), None)

    # -- wrappers
    def install(self) -> List[Tuple[nn.Module, bool, Any]]:
        undo = []
        for group in self.plan.units:
            module = group.module
            had = "forward" in module.__dict__
            orig = module.__dict__.get("forward", None)
            bound = module.forward

            def forward(*args: Any, _g: _Group = group, _f: Callable[..., Any] = bound, **kwargs: Any) -> Any:
                return self.call(_g, _f, args, kwargs)

            module.forward = forward
            undo.append((module, had, orig))
        return undo

    @staticmethod
    def uninstall(undo: List[Tuple[nn.Module, bool, Any]]) -> None:
        for module, had, orig in undo:
            if had:
                module.forward = orig
            else:
                del module.forward

    def enter(self, group: _Group) -> None:
        """Make ``group`` the block that holds values (with the blocks whose call is still running)."""
        for other in list(self.mat.live_groups):
            if other is not group and other not in self.active and other.kind == "unit":
                self.mat.release(other)
        self.mat.ensure(group)

    def call(self, group: _Group, fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        with torch._C.DisableTorchFunction():  # initlint's own work is not the model's: the capture must not see it
            self.enter(group)
        self.active.append(group)
        try:
            for t in group.tensors:
                name = self.names.get(id(t))
                if name is not None:
                    self.uses[name] = self.uses.get(name, 0) + 1
            if not (self.backward_wanted and torch.is_grad_enabled()):
                out = fn(*args, **kwargs)
            else:
                call = _Call(self, group, fn, args, kwargs)
                outs = _UnitCall.apply(call, self.dummy, *call.tensors())
                out = call.output(outs if isinstance(outs, tuple) else (outs,))
            with torch._C.DisableTorchFunction():
                self._param_stats(group)
        finally:
            self.active.remove(group)
        self._tick("forward", group)
        return out

    # -- statistics
    def _param_stats(self, group: Optional[_Group]) -> None:
        """Weights of the layers the rules judge, once each, while they hold values."""
        used = used_params(self.cap.graph)
        tensors = group.tensors if group is not None else [t for g in self.plan.groups for t in g.tensors]
        by_name = {self.names[id(t)]: t for t in tensors if id(t) in self.names and id(t) in self.mat.live}
        todo = [(n, by_name[n]) for n in used if n in by_name and n not in self.stats_done]
        todo = [(n, p) for n, p in todo if p.is_floating_point() and p.numel() > 0]
        if todo:
            _param_stats(self.c, todo, weight_units(self.cap.graph, self.cap.model, dict(todo), self.c.shapes),
                         extremes=False)
            confirm_duplicates_now(self.c)  # the block's weights are freed before the one transfer
            confirm_extremes(self.c)
            self.stats_done.update(n for n, _ in todo)

    def _wanted(self) -> Set[str]:
        if self.wanted is None:
            named = dict(self.cap.model.named_parameters())
            self.wanted = {n for op in self.cap.graph if op.kind in O.WEIGHT_KINDS for role, n in op.params.items()
                           if role == "weight" and n in named and named[n].requires_grad}
        return self.wanted

    def _grad(self, name: str, g: Optional[torch.Tensor], tied: bool) -> None:
        """Add one block call's gradient; summarise when the weight's last call is done (tied
        weights at the very end: their blocks' contributions are summed first)."""
        if g is not None:
            self.pending[name] = g if name not in self.pending else self.pending[name] + g
        if tied or name not in self.uses:
            return
        self.uses[name] -= 1
        if self.uses[name] <= 0 and name in self.pending:
            self._summarise_grad(name, self.pending.pop(name))

    def _summarise_grad(self, name: str, g: torch.Tensor) -> None:
        summarise(self.c, "grads", [(name, g)], mean=True, extremes=GRAD_EXTREMES)

    def _observer(self) -> StatsObserver:
        return StatsObserver(lambda: self.cap.graph, self.c)

    def _cotangent(self, main: torch.Tensor) -> torch.Tensor:
        """The backward probe's output direction, as :func:`initlint.probe.run.run_probe` draws it."""
        return draw.randn(main.shape, draw.generator(main.device, 0), main.device, main.dtype)

    def _finish(self, result: ProbeResult) -> None:
        self.c.finish(result)
        for name in self.c.confirmed:  # the device-side candidate count, already settled per block
            result.params.get(name, {}).pop("dup_candidates", None)

    # -- backward
    def recompute(self, call: _Call, inputs: Sequence[torch.Tensor], grads: Sequence[Optional[torch.Tensor]],
                  needs: Sequence[bool]) -> Tuple[Optional[torch.Tensor], ...]:
        group = call.group
        weights = [(self.names[id(t)], t) for t in group.tensors
                   if self.names.get(id(t)) in self._wanted() and id(t) not in self.plan.kept]
        kept = [(self.names[id(t)], t) for t in self._kept_in(group) if self.names.get(id(t)) in self._wanted()]
        if not any(needs) and not weights and not kept:
            self._tick("backward", group)  # nothing to recompute: no gradient flows into or out of it
            return tuple(None for _ in inputs)
        self.enter(group)
        with torch.enable_grad(), DropoutOff():
            detached = [t.detach().requires_grad_(need and t.is_floating_point()) for t, need in zip(inputs, needs)]
            args, kwargs = call._inputs(detached, recompute=True)
            out = call.fn(*args, **kwargs)
            outs = [v for v in pytree.tree_flatten(out)[0] if isinstance(v, torch.Tensor)]
            pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
            wrt = [d for d in detached if d.requires_grad] + [p for _, p in weights] + [p for _, p in kept]
            found = grad_without_dropout([o for o, _ in pairs], wrt, [g for _, g in pairs]) \
                if pairs and wrt else [None] * len(wrt)
            del out, outs, pairs
        found = list(found)
        input_grads = iter(found[:sum(d.requires_grad for d in detached)])
        rest = found[len(found) - len(weights) - len(kept):]
        for (name, _), g in zip(weights, rest):
            self._grad(name, g, False)
        for (name, _), g in zip(kept, rest[len(weights):]):
            self._grad(name, g, True)
        self._tick("backward", group)
        return tuple(next(input_grads) if d.requires_grad else None for d in detached)

    def _kept_in(self, group: _Group) -> List[torch.Tensor]:
        modules = group.module.modules() if group.kind == "unit" else [group.module]
        found = {id(t): t for m in modules for _, _, t in _direct(m) if id(t) in self.plan.kept}
        return list(found.values())

    # -- progress
    def _tick(self, phase: str, group: _Group) -> None:
        self.counts[phase] += 1
        self.work["done"] += _work(group)
        if self.progress is None:
            return
        seconds = time.perf_counter() - self.start
        done, total = self.work["done"], max(self.work["total"], self.work["done"])
        remaining = seconds * (total - done) / done if done > 0 else None
        self.progress(BlockProgress(phase, self.counts[phase], max(self.totals[phase], self.counts[phase]),
                                    group.path or "<model>", seconds, remaining))

    # -- the run
    def run(self, args: Tuple[Any, ...], kwargs: Dict[str, Any], logits: Optional[bool]) -> ProbeResult:
        result = ProbeResult()
        observer = self._observer()
        named = dict(self.cap.model.named_parameters())
        grad_wanted = self.backward_wanted and any(p.requires_grad for p in named.values())
        self.backward_wanted = grad_wanted
        self.dummy = torch.zeros((), device=self.device, requires_grad=True)
        for group in self.plan.groups:
            if group.kind == "loose":  # a module's own tensors outside any block: held for the whole run
                self.mat.ensure(group)
        undo = self.install()
        try:
            with torch.set_grad_enabled(grad_wanted):
                out = self.cap.run(args, kwargs, observer)
                self.cap.finish()  # the graph is complete: read-only from here on
                result.forward_ran = True
                self.totals["backward"] = self.counts["forward"]
                main = primary_output(out)
                put_logits(self.c, self.cap, out, main, logits, result)
                self._param_stats(None)
                if grad_wanted:
                    self._backward(main, result)
                del out, main
        finally:
            self.uninstall(undo)
        self._finish(result)
        return result

    def _backward(self, main: Optional[torch.Tensor], result: ProbeResult) -> None:
        if not backward_possible(main, result) or not self._wanted():
            return
        named = dict(self.cap.model.named_parameters())
        # weights that hold values outside any block call (tied or loose) take part in the outer graph
        outside = [n for n in self._wanted() if id(named[n]) in self.mat.live and
                   (id(named[n]) in self.plan.kept or id(_holder(self.plan, named[n])) not in self.plan.unit_of)]
        grads = grad_without_dropout([main], [self.dummy] + [named[n] for n in outside], [self._cotangent(main)])
        for name, g in zip(outside, grads[1:]):
            self._grad(name, g, True)
        with torch._C.DisableTorchFunction():
            for name in list(self.pending):
                self._summarise_grad(name, self.pending.pop(name))
        result.backward_ran = True


def _work(group: _Group) -> float:
    """A block's share of a streamed audit's time, for the estimate of what is left: its bytes (drawn, then
    read by the forward or the backward), and one megabyte for the fixed cost of any block."""
    return float(group.nbytes) + 1e6


def _holder(plan: Plan, t: torch.Tensor) -> nn.Module:
    return plan.holders[id(t)][0][0]


# ----------------------------------------------------------------------------- entry point
def stream_probe(model: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], *, device: torch.device,
                 init: Optional[InitFn], seed: int, logits: bool, backward: bool, notes: List[str],
                 progress: Optional[Callable[[BlockProgress], None]] = None) -> Tuple[Capture, ProbeResult]:
    """Capture and probe a ``meta``-device model block by block on ``device``; the model itself stays on meta.

    Returns the capture (whose model is a meta copy of ``model``) and the probe statistics.
    """
    if init is not None and not callable(init):
        raise StreamError(f"init must be a function of one module, got {type(init).__name__}")
    progress = progress if progress is not None else _terminal_progress()
    run = dict(device=device, init=init, seed=seed, logits=logits, backward=backward, progress=progress)
    while True:  # out of memory: the whole streamed run again with half the batch, as the in-memory probe does
        try:
            return fx_then_runtime(model, copy.deepcopy(model), lambda cap: _attempt(cap, args, kwargs, notes, **run),
                                   args, kwargs, notes, out_of_memory=True)
        except _OutOfMemory:
            smaller = _halve_batch(args, kwargs)
            if smaller is None:
                raise LoadError(_out_of_memory_at_smallest(device, backward, _batch_of(args, kwargs))) from None
            args, kwargs = smaller
            notes.append(f"the probe ran out of memory; retried with a batch of {_batch_of(args, kwargs)}")


class _OutOfMemory(Exception):
    """An attempt ran out of memory: the caller may retry with a smaller batch."""


def fx_then_runtime(model: nn.Module, work: nn.Module, attempt: Callable[[Capture], ProbeResult],
                    args: Tuple[Any, ...], kwargs: Dict[str, Any], notes: List[str],
                    out_of_memory: bool = False) -> Tuple[Capture, ProbeResult]:
    """``attempt`` on the fx capture of ``work``, else on its runtime capture; one sentence if both fail.
    With ``out_of_memory``, running out of memory is not a reason to fall back: it raises
    :class:`_OutOfMemory` for the caller to retry with a smaller batch.

    In a distributed job every rank fails alike (same model, same code), so all fall back together."""
    cap = capture(work)
    while True:
        try:
            return cap, attempt(cap)
        except (LoadError, KeyboardInterrupt):
            raise
        except Exception as exc:
            if out_of_memory and _out_of_memory(exc):
                raise _OutOfMemory() from None
            failed = ForwardFailed(exc, cap.name)
        if cap.name != "fx":
            raise failed.as_load_error(model, args, kwargs)
        notes.append(f"the fx-traced graph failed to run ({failed.reason}); used the runtime capture")
        cap = RuntimeCapture(work)


def _attempt(cap: Capture, args: Tuple[Any, ...], kwargs: Dict[str, Any], notes: List[str], *, device: torch.device,
             init: Optional[InitFn], seed: int, logits: bool, backward: bool,
             progress: Optional[Callable[[BlockProgress], None]]) -> ProbeResult:
    plan = Plan(cap.model, _fx_called(cap), init)
    mat = Materialiser(plan, device, init, seed)
    probe = StreamProbe(cap, plan, mat, device, backward, progress)
    try:
        with _seeded(cap.model, seed, device):
            result = probe.run(args, kwargs, logits)
    finally:
        mat.release_all()
    result.drawn = mat.drawn
    notes.append(f"the model is on the meta device: audited block by block on {device} ({len(plan.units)} blocks, "
                 f"the largest {_size(probe.peak_block)}), initialised with {_init_name(plan, init)}")
    if mat.left_unset:
        names = list(mat.left_unset)
        notes.append(f"init= leaves {len(names)} weight(s) unset ({', '.join(names[:3])}"
                     f"{', ...' if len(names) > 3 else ''}): they hold {_init_name(plan, None)}'s values")
    whole = _whole_model_init(plan.model) if init is None and not plan.hf else None
    if whole is not None:
        notes.append(f"the model declares its init in {whole}, which initialises the whole model at once and cannot "
                     f"run one block at a time: the audit judged PyTorch's defaults instead; pass init= with what "
                     f"it does per module to audit the declared init")
    return result


@contextmanager
def _seeded(model: nn.Module, seed: int, device: torch.device) -> Iterator[None]:
    """The probe's random state and train mode, as :func:`initlint.probe.guard.guarded` sets them; the
    working copy is thrown away afterwards, so only the random state and grad mode are restored."""
    restore = saved_rng()
    grad_mode = torch.is_grad_enabled()
    try:
        seed_devices(seed)
        model.train()
        for module in model.modules():  # the stream recomputes each block itself: no activation checkpointing
            if vars(module).get("gradient_checkpointing") is True:
                module.gradient_checkpointing = False
        yield
    finally:
        restore()
        torch.set_grad_enabled(grad_mode)


def _fx_called(cap: Capture) -> Optional[Set[str]]:
    """Modules the fx interpreter calls as a whole (leaves whose tensors nothing reads directly);
    None for the runtime capture, which runs the model's own forward and so calls every module."""
    if cap.name != "fx":
        return None
    graph = getattr(cap, "fx_graph", None)  # none for a plain nn.Sequential, whose children are all called
    read = {str(n.target).rpartition(".")[0] for n in graph.nodes if n.op == "get_attr"} if graph is not None else set()
    return set(cap.module_kinds) - read


def _init_name(plan: Plan, init: Optional[InitFn]) -> str:
    if init is not None:
        return f"init={getattr(init, '__qualname__', type(init).__name__)}"
    root = plan.hf.get(id(plan.model)) if plan.hf else None
    if root is not None:
        return f"{type(root).__name__}._init_weights" if _is_hf(root) else \
            f"each module's reset_parameters(), then {type(root).__name__}._init_weights"
    return "each module's reset_parameters()"


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def _duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``2.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _terminal_progress() -> Optional[Callable[[BlockProgress], None]]:
    """Block-by-block progress on stderr when it is a terminal (see :func:`initlint.inputs.config.show_progress`), once
    the audit has run for a while."""
    from ..inputs.config import show_progress

    if not show_progress():
        return None

    def show(event: BlockProgress) -> None:
        if event.seconds >= _PROGRESS_AFTER:
            left = f", about {_duration(event.remaining)} left" if event.remaining is not None else ""
            print(f"initlint: {event.phase} {event.index}/{event.total} {event.block} ({event.seconds:.0f} s{left})",
                  file=sys.stderr, flush=True)

    return show
