"""The state guard: whatever the capture and the probe do to a model, it is undone.

:func:`guarded` saves, before anything runs, everything a forward pass can touch, and puts
it back in ``finally``, on success, on any exception and on ``KeyboardInterrupt``:

* every tensor of the model (parameters, buffers, tensor-valued plain attributes) and of
  the probe inputs keeps its object and its bits: for the guarded run its data is swapped
  for a stand-in (for parameters and inputs a copy-on-write one, ``torch._lazy_clone``:
  nothing is copied unless the forward writes), so an in-place write (a running average, ``clamp_``,
  a spectral-norm power iteration, an observer's min/max, ``Embedding(max_norm=...)``)
  lands in the stand-in and the original storage is never written. Afterwards the
  original data is swapped back and the version counters are set to what they were, so an
  autograd graph the caller keeps across the audit still backpropagates;
* each module's attributes: the ``_parameters``, ``_buffers`` and ``_modules`` dicts and
  the hook dicts (restored in place, the same dict objects), plain values and tensors
  reassigned or added by the forward (``self.calls = self.calls + 1``, a buffer registered
  on the first call, an fx ``Proxy`` left behind by tracing), lists, dicts and sets held
  as attributes (their contents), the module's class and its ``training`` flag;
* ``requires_grad`` and ``.grad`` of every leaf tensor;
* global state: the RNG of the CPU, of every initialised CUDA device, of MPS, of Python's
  ``random`` and of NumPy; the grad mode; the default dtype and device;
  deterministic-algorithm and matmul-precision settings; the intra-op thread count;
  ``torch.backends`` flags; anomaly detection; the parametrization cache; the global
  module hooks.

Inside the guard every module has ``training = True``, set directly: a user's ``train()``
override (which may freeze layers or flip ``requires_grad``) is not called.
"""
from __future__ import annotations

import operator
import random
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from ..capture import nested
from ..compat import set_version_counters


@contextmanager
def guarded(model: nn.Module, seed: int, inputs: Any = None, copy_on_write: bool = True) -> Iterator[None]:
    """Run the body with ``model`` in train mode and the RNG seeded with ``seed``; undo everything after.

    The tensors in ``inputs`` (any nesting of tuples, lists and dicts) get stand-ins too, so a
    forward that writes into its input (an in-place activation first) leaves the caller's alone.
    Parameters and inputs get copy-on-write stand-ins (free unless written); buffers and
    other tensors, which forwards do write and which some fused kernels cannot take as
    copy-on-write (fake quantisation), get real copies; ``copy_on_write=False`` copies all.
    """
    state = _Saved(model, inputs, copy_on_write)
    try:
        state.enter(seed)
        with torch.inference_mode(False):
            yield
    except BaseException as exc:
        try:
            state.restore()
        except Exception as failed:  # noqa: BLE001 - the exception under way says more about the cause
            note = f"initlint could not restore the model's state: {type(failed).__name__}: {failed}"
            if hasattr(exc, "add_note"):  # Python 3.11+
                exc.add_note(note)
            else:
                exc.__notes__ = [*getattr(exc, "__notes__", []), note]
        raise
    state.restore()


class _Tensor:
    """One tensor of the model: its original data, version, ``requires_grad`` and ``.grad``."""

    __slots__ = ("tensor", "lazy", "data", "version", "requires_grad", "grad", "leaf", "backup")

    def __init__(self, t: torch.Tensor, lazy: bool) -> None:
        self.tensor = t
        self.lazy = lazy
        self.leaf = t.is_leaf
        self.requires_grad = t.requires_grad
        self.grad = t.grad if self.leaf else None
        self.version = _version(t)
        self.data: Optional[torch.Tensor] = None
        self.backup: Optional[torch.Tensor] = None

    def stand_in(self) -> None:
        """Swap in a copy of the data; the original storage is kept aside, never written (under no_grad)."""
        t = self.tensor
        if t.is_meta or isinstance(t, nn.parameter.UninitializedTensorMixin):
            return
        data = t.data
        try:
            t.data = _lazy_copy(data) if self.lazy else data.clone()
        except (RuntimeError, TypeError, NotImplementedError):
            self.backup = data.clone()  # a kind whose data cannot be swapped: written back if it changes
            return
        self.data = data

    def restore(self) -> None:
        """Under no_grad."""
        t = self.tensor
        if self.data is not None:
            t.data = self.data
        elif self.backup is not None and _version(t) != self.version:
            t.copy_(self.backup)
        if self.leaf:
            if t.grad_fn is not None:
                # an in-place op recorded into it with autograd on (fx drops the forward's no_grad blocks)
                t.detach_()
            if t.requires_grad != self.requires_grad:
                t.requires_grad_(self.requires_grad)
            if t.grad is not self.grad:
                t.grad = self.grad


def _lazy_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy-on-write copy: storage is shared until either side is written."""
    if t.layout == torch.strided and not t.is_nested:
        try:
            return torch._lazy_clone(t)
        except (RuntimeError, NotImplementedError):
            pass
    return t.clone()


def _version(t: torch.Tensor) -> Optional[int]:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter
        return None


_CONTAINERS = (dict, list, set)
_PLAIN = frozenset({bool, int, float, str, type(None)})
"""Attribute types that need no look inside (most of a module's attributes)."""


class _Attributes:
    """A module's ``__dict__``: the values (by identity), the contents of its containers, its class."""

    __slots__ = ("module", "cls", "values", "empty", "contents")

    def __init__(self, module: nn.Module, tensors: List[torch.Tensor]) -> None:
        """Also appends to ``tensors`` the tensors held directly or one container level down
        (the ``_parameters`` and ``_buffers`` dicts, lists and dicts of tensors)."""
        self.module = module
        self.cls = type(module)
        self.values = dict(vars(module))
        self.empty: List[Any] = []  # most hook dicts: nothing to copy, only to empty again
        self.contents: List[Tuple[Any, Any]] = []
        for value in self.values.values():
            if type(value) in _PLAIN:
                continue
            if isinstance(value, _CONTAINERS):
                if not value:
                    self.empty.append(value)
                    continue
                self.contents.append((value, _copy(value)))
                if not isinstance(value, set):
                    tensors.extend(v for v in (value.values() if isinstance(value, dict) else value)
                                   if isinstance(v, torch.Tensor))
            elif isinstance(value, torch.Tensor):
                tensors.append(value)
            elif isinstance(value, tuple) and value:
                tensors.extend(v for v in value if isinstance(v, torch.Tensor))

    def restore(self) -> None:
        attrs = vars(self.module)
        if list(attrs) != list(self.values) or not all(map(operator.is_, attrs.values(), self.values.values())):
            attrs.clear()  # rebuilt whole: the same keys in the same order, the same objects
            attrs.update(self.values)
        if any(self.empty):
            for container in self.empty:
                container.clear()
        for container, saved in self.contents:
            if not _unchanged(container, saved):
                _refill(container, saved)
        if type(self.module) is not self.cls:
            self.module.__class__ = self.cls


def _copy(container: Any) -> Any:
    """A shallow copy as a plain dict, list or set (a subclass's own copy might do more)."""
    if isinstance(container, dict):
        return dict(container)
    return list(container) if isinstance(container, list) else set(container)


def _unchanged(current: Any, saved: Any) -> bool:
    """Same items by identity, in the same order (sets: equal)."""
    if len(current) != len(saved):
        return False
    if not saved:
        return True
    if isinstance(current, dict):
        return all(map(operator.is_, current, saved)) and all(map(operator.is_, current.values(), saved.values()))
    if isinstance(current, list):
        return all(map(operator.is_, current, saved))
    return current == saved


def _refill(container: Any, saved: Any) -> None:
    """Put ``saved`` back into ``container`` in place (the same container object stays referenced)."""
    if isinstance(container, list):
        container[:] = saved
    else:
        container.clear()
        container.update(saved)


class _Saved:
    """Everything :func:`guarded` restores, taken before anything runs."""

    def __init__(self, model: nn.Module, inputs: Any, copy_on_write: bool) -> None:
        self.modules = list(model.modules())
        found: List[torch.Tensor] = []
        self.attributes = [_Attributes(m, found) for m in self.modules]
        given = nested.tensors(inputs)
        found += given
        # copy-on-write for parameters and inputs, which forwards seldom write; buffers get real copies
        lazy = {id(p) for m in self.modules for p in m._parameters.values() if p is not None} | set(map(id, given))
        unique = {id(t): t for t in found}
        grads = [g for t in unique.values() if t.is_leaf and (g := t.grad) is not None]
        unique.update((id(g), g) for g in grads)
        self.tensors = [_Tensor(t, copy_on_write and key in lazy) for key, t in unique.items()]
        self.globals = _global_state()

    def enter(self, seed: int) -> None:
        with torch.no_grad():
            for entry in self.tensors:
                entry.stand_in()
        for module in self.modules:
            object.__setattr__(module, "training", True)  # directly: no user train() override runs
            if _reentrant_checkpointing(module):
                object.__setattr__(module, "gradient_checkpointing", False)
        seed_devices(seed)

    def restore(self) -> None:
        """Every step runs even when an earlier one fails; the first failure is raised at the end."""
        first: Optional[BaseException] = None
        with torch.no_grad():
            for step in [a.restore for a in self.attributes] + [t.restore for t in self.tensors] + [self._versions]:
                try:
                    step()
                except Exception as exc:  # noqa: BLE001 - the other steps must still run
                    first = first or exc
        try:
            self.globals()  # after no_grad has exited: it restores the grad mode
        except Exception as exc:  # noqa: BLE001
            first = first or exc
        if first is not None:
            raise first

    def _versions(self) -> None:
        changed = [(e.tensor, e.version) for e in self.tensors
                   if e.version is not None and _version(e.tensor) != e.version]
        if changed:
            # The original storage was never written, so the caller's saved tensors are valid:
            # the counters go back to what they were (views share their base's counter).
            set_version_counters([t for t, _ in changed], [v for _, v in changed])


def _reentrant_checkpointing(module: nn.Module) -> bool:
    """Whether ``module`` checkpoints its forward the Hugging Face way (``gradient_checkpointing_enable()``)
    with reentrant checkpointing (``use_reentrant=True``, or a checkpoint function that does not say). A
    reentrant checkpoint runs its forward without autograd and its backward only through ``.backward()``,
    which would write every parameter's ``.grad``: the probe runs such a block's forward plainly (the
    attribute is restored with the others). Non-reentrant checkpointing stays on (its recomputation runs
    in the backward probe with dropout off, as the forward did)."""
    if vars(module).get("gradient_checkpointing") is not True:
        return False
    keywords = getattr(vars(module).get("_gradient_checkpointing_func"), "keywords", None) or {}
    return keywords.get("use_reentrant", True) is not False


# ------------------------------------------------------------------------------ global state
def seed_devices(seed: int) -> None:
    """Seed the generators :func:`saved_rng` saves: the CPU's, CUDA's once it is initialised, MPS's.
    Not ``torch.manual_seed``: for an accelerator that is not initialised yet it queues the seed, to be
    applied when the user first uses the device, in place of the user's own (and it costs
    milliseconds per call, formatting the stack for that queue)."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)
    if _mps_available():
        torch.mps.manual_seed(seed)


def _lazy_seeds() -> Callable[[], None]:
    """The seeds ``torch.manual_seed`` queued for accelerators not initialised yet (torch applies them when
    the device is first used): put back as they were, should anything in the audit call it."""
    saved = []
    for backend in ("cuda", "xpu", "mtia"):
        tracker = getattr(getattr(torch, backend, None), "_lazy_seed_tracker", None)
        if tracker is not None and hasattr(tracker, "__dict__"):
            saved.append((tracker, {k: list(v) if isinstance(v, list) else v for k, v in vars(tracker).items()}))

    def undo() -> None:
        for tracker, fields in saved:
            for name, value in fields.items():
                setattr(tracker, name, list(value) if isinstance(value, list) else value)
    return undo


def _mps_available() -> bool:
    return sys.platform == "darwin" and torch.backends.mps.is_available()


def _global_state() -> Callable[[], None]:
    """Save the process-wide state a forward can change; return the function that restores it."""
    restorers = [saver() for saver in _SAVERS]

    def restore() -> None:
        first: Optional[BaseException] = None
        for undo in restorers:
            try:
                undo()
            except Exception as exc:  # noqa: BLE001 - restore the rest first
                first = first or exc
        if first is not None:
            raise first
    return restore


def saved_rng() -> Callable[[], None]:
    """Save every random state the audit may draw from or seed; return the function that puts it back."""
    lazy = _lazy_seeds()
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    mps = torch.mps.get_rng_state() if _mps_available() else None
    python = random.getstate()
    numpy = sys.modules.get("numpy")
    np_state = numpy.random.get_state() if numpy is not None else None

    def undo() -> None:
        lazy()
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if mps is not None:
            torch.mps.set_rng_state(mps)
        random.setstate(python)
        if np_state is not None:
            numpy.random.set_state(np_state)
    return undo


def _modes() -> Callable[[], None]:
    grad = torch.is_grad_enabled()
    dtype = torch.get_default_dtype()
    device = torch.get_default_device()
    anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    precision = torch.get_float32_matmul_precision()
    threads = torch.get_num_threads()

    def undo() -> None:
        torch.set_grad_enabled(grad)
        if torch.get_default_dtype() != dtype:
            torch.set_default_dtype(dtype)
        if torch.get_default_device() != device:
            torch.set_default_device(device)
        if (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()) != anomaly:
            torch.set_anomaly_enabled(*anomaly)
        if (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled()) != deterministic:
            torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        if torch.get_float32_matmul_precision() != precision:
            torch.set_float32_matmul_precision(precision)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
    return undo


_BACKEND_FLAGS: Tuple[Tuple[Any, str], ...] = (
    (torch.backends.cudnn, "enabled"), (torch.backends.cudnn, "benchmark"),
    (torch.backends.cudnn, "deterministic"), (torch.backends.cudnn, "allow_tf32"),
    (torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),
    (torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"),
)


def _backend_flags() -> Callable[[], None]:
    saved = [(owner, name, getattr(owner, name)) for owner, name in _BACKEND_FLAGS if hasattr(owner, name)]

    def undo() -> None:
        for owner, name, value in saved:
            if getattr(owner, name) != value:
                setattr(owner, name, value)
    return undo


def _module_globals() -> Callable[[], None]:
    """Global module hooks (``torch.nn.modules.module._global_*``) and the parametrization cache."""
    from torch.nn.modules import module as module_globals
    from torch.nn.utils import parametrize

    owners = [(module_globals, [n for n in vars(module_globals) if n.startswith("_global_")]),
              (parametrize, ["_cache_enabled", "_cache"])]
    values = [(owner, name, getattr(owner, name)) for owner, names in owners for name in names if hasattr(owner, name)]
    contents = [(v, _copy(v)) for _, _, v in values if isinstance(v, _CONTAINERS)]

    def undo() -> None:
        for owner, name, value in values:
            if getattr(owner, name) is not value:
                setattr(owner, name, value)
        for container, saved in contents:
            if not _unchanged(container, saved):
                _refill(container, saved)
    return undo


_SAVERS = (saved_rng, _modes, _backend_flags, _module_globals)
