"""Counting the audit's host synchronisations on any device, CPU included.

On CUDA, a host synchronisation is a call that makes the host wait for the device: a value read on
the host (``.item()``, ``float(t)``, ``bool(t)``, ``if t.any():``, ``.tolist()``, ``.cpu()``,
``.numpy()``), an op whose output's size depends on the data (``nonzero``, ``masked_select``, a
boolean index, ``unique``, ``torch.equal``, ``bincount``), a linear-algebra routine's error check, or a
blocking copy of host memory to the device (``torch.tensor(data, device=...)``, ``t.to(device)`` of a
tensor made on the host, ``t[[0, 2]]`` or ``t[idx] = v`` with a list or a host tensor as the index). :class:`HostSyncs` counts those calls as they are made, with a
``TorchFunctionMode`` for the tensor methods that leave torch's dispatcher (``tolist``, ``cpu``,
``numpy``) and for the copies, and a ``TorchDispatchMode`` for the rest, so that the count on CPU is the
one a GPU run would make. A tensor counts as made on the host when a factory made it without a
``device=`` (or with ``"cpu"`` spelled out) from no generator or a CPU one, or when an op made it of
such tensors only; a ``device=`` given as a ``torch.device`` is taken as the audit's device. What only a
GPU run's code paths do (the model's own, torch's) is not seen.
"""
from __future__ import annotations

import os
import traceback
import weakref
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_SYNCING_OPS = frozenset({
    "aten::_local_scalar_dense", "aten::nonzero", "aten::equal", "aten::masked_select", "aten::unique_dim",
    "aten::_unique", "aten::_unique2", "aten::unique_consecutive", "aten::is_nonzero", "aten::bincount",
    "aten::_linalg_check_errors",
})
"""Ops whose result the host waits for: a scalar read (``item``, ``float``, ``bool``, ``int``), an output
whose size depends on the values, or a linear-algebra routine's error check (``torch.linalg.eigh``, ...)."""
_SYNCING_METHODS = frozenset({"tolist", "cpu", "numpy"})
"""Tensor methods that copy to the host without passing the dispatcher as an op."""
_FROM_DATA = frozenset({"tensor", "as_tensor", "from_numpy"})
"""Tensors made from host data: with a ``device=`` they are copied to it (a synchronous copy on CUDA)."""
_FACTORIES = frozenset({"randn", "rand", "randint", "randperm", "normal", "zeros", "ones", "full", "empty", "arange",
                        "linspace", "eye", "randn_like", "rand_like"})
"""Factories that make a tensor on the host when given no ``device=``."""
_MOVES = frozenset({"to", "cuda", "copy_"})
_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "initlint")
_CAPTURE = os.path.join(_ROOT, "capture")
_TORCH = os.path.dirname(torch.__file__)


def _where() -> str:
    """Who made the call: ``initlint/FILE:LINE``, or ``model FILE:LINE`` for the model's own code (its calls
    pass through the capture, whose frames are skipped, as torch's are)."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        path = frame.filename
        if path.startswith(_TORCH) or path == __file__ or path.startswith(_CAPTURE):
            continue
        if path.startswith(_ROOT):
            return f"{os.path.relpath(path, os.path.dirname(_ROOT))}:{frame.lineno}"
        return f"model {os.path.basename(path)}:{frame.lineno}"
    return "model"


class _Functions(TorchFunctionMode):
    def __init__(self, owner: "HostSyncs") -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Optional[Dict] = None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _SYNCING_METHODS:
            self.owner.record(name)
        elif name in _MOVES and self.owner.is_host_born(args[1] if name == "copy_" else args[0]) \
                and (name != "to" or _names_device(args[1:], kwargs)):
            self.owner.record(f"{name} of a host tensor")
        elif name in _FROM_DATA and kwargs.get("device") is not None:
            self.owner.record(f"torch.{name}(device=)")
        elif name in ("__getitem__", "__setitem__") and not self.owner.is_host_born(args[0]) \
                and self._host_index(args[1]):
            self.owner.record(f"{name} at host indices")
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and ((name in _FROM_DATA and kwargs.get("device") is None)
                                              or (name in _FACTORIES and _on_host(kwargs))
                                              or (name not in _MOVES and self._from_host(args))):
            self.owner.host_born(out)
        return out

    def _host_index(self, index: Any) -> bool:
        """Whether an index is copied from the host to the device: a list of integers or a tensor made on the host."""
        parts = index if isinstance(index, tuple) else (index,)
        return any(isinstance(p, list) or (isinstance(p, torch.Tensor) and p.dim() > 0 and self.owner.is_host_born(p))
                   for p in parts)

    def _from_host(self, args: Tuple[Any, ...]) -> bool:
        """Whether an op's tensor arguments all live on the host: then so does its output."""
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        return bool(tensors) and all(self.owner.is_host_born(t) for t in tensors)


class _Dispatch(TorchDispatchMode):
    def __init__(self, owner: "HostSyncs") -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Optional[Dict] = None):
        name = func._schema.name
        if name in _SYNCING_OPS or (name in ("aten::index", "aten::index_put", "aten::index_put_")
                                    and _bool_index(args)) \
                or (name == "aten::repeat_interleave" and isinstance(args[0], torch.Tensor)
                    and (kwargs or {}).get("output_size") is None and len(args) < 3):
            self.owner.record(name.replace("aten::", ""))
        return func(*args, **(kwargs or {}))


def _names_device(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    """Whether a ``Tensor.to`` call names a device (a device, a device string, or a tensor to follow)."""
    first = args[0] if args else None
    return kwargs.get("device") is not None or isinstance(first, (torch.device, str, torch.Tensor))


def _on_host(kwargs: Dict[str, Any]) -> bool:
    """Whether a factory makes its tensor on the host: no ``device=`` (or the literal ``"cpu"``) and no
    generator of another device. A ``device=`` naming a ``torch.device`` is taken as the audit's device."""
    device, gen = kwargs.get("device"), kwargs.get("generator")
    if device is not None:
        return isinstance(device, str) and device.startswith("cpu")
    return gen is None or gen.device.type == "cpu"


def _bool_index(args: Tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (indices or ()))


class HostSyncs:
    """``with HostSyncs() as syncs: ...``; then ``syncs.count`` and ``syncs.sites`` (where they were made)."""

    def __init__(self) -> None:
        self.events: List[Tuple[str, str]] = []
        self._modes: List[Any] = []
        self._host: Dict[int, Any] = {}

    def host_born(self, t: torch.Tensor) -> None:
        self._host[id(t)] = weakref.ref(t)

    def is_host_born(self, t: Any) -> bool:
        ref = self._host.get(id(t)) if isinstance(t, torch.Tensor) else None
        return ref is not None and ref() is t

    def record(self, what: str) -> None:
        self.events.append((what, _where()))

    @property
    def count(self) -> int:
        return len(self.events)

    @property
    def own(self) -> int:
        """Synchronisations initlint's own code made (not the model's forward)."""
        return sum(1 for _, where in self.events if where.startswith("initlint"))

    @property
    def sites(self) -> Counter:
        return Counter(f"{what} at {where}" for what, where in self.events)

    def __enter__(self) -> "HostSyncs":
        self._modes = [_Functions(self), _Dispatch(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
