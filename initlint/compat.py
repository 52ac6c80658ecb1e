"""The torch versions initlint runs on, and the one place for APIs newer than the oldest of them.

initlint supports torch :data:`MIN_TORCH` and newer. Importing this module on an older torch
raises :class:`~initlint.errors.UnsupportedTorch`, one sentence naming the minimum; every
module that reaches torch through the pipeline imports it first (``initlint.audit``, ``fix``,
``sweep`` and the command line do). Each fallback below says the version that made it
necessary; the newer API is used wherever it exists.
"""
from __future__ import annotations

from typing import Any, Sequence, Tuple

import torch
from torch.utils import _pytree as pytree

from .errors import UnsupportedTorch

MIN_TORCH = (2, 4)
"""The oldest torch initlint supports: ``torch.OutOfMemoryError``, ``torch.amp.is_autocast_available``
and ``torch.get_autocast_dtype`` are 2.4's; ``tree_map(is_leaf=)``, ``fx.Interpreter(graph=)`` and
``torch.get_default_device`` 2.3's."""


def torch_version(version: str = torch.__version__) -> Tuple[int, int]:
    """``(major, minor)`` of a torch version string (``"2.4.1+cu121"`` -> ``(2, 4)``)."""
    parts = version.split("+")[0].split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def unsupported(version: str = torch.__version__) -> str:
    """Why initlint cannot run on torch ``version`` (one sentence), or ``""`` when it can."""
    if torch_version(version) >= MIN_TORCH:
        return ""
    minimum = ".".join(map(str, MIN_TORCH))
    return (f"initlint needs torch >= {minimum}, and this environment has torch {version}; "
            f"upgrade it with pip install 'torch>={minimum}'")


_TOO_OLD = unsupported()
if _TOO_OLD:
    raise UnsupportedTorch(_TOO_OLD)

_VERSION = torch_version()


def inplace_from_schema(op: Any) -> bool:
    """Whether the aten overload ``op`` is an in-place variant (``add_``, ``mul_.Scalar``), from its schema:
    it writes its first, positional argument (``self``). On torch 2.13 this agrees with
    ``torch.Tag.inplace`` on every pointwise aten op (``tests/test_compat.py``)."""
    args = op._schema.arguments
    return bool(args) and args[0].alias_info is not None and args[0].alias_info.is_write and not args[0].kwarg_only


# torch.Tag.inplace: 2.13.
if hasattr(torch.Tag, "inplace"):
    def is_inplace(op: Any) -> bool:
        """Whether the aten overload ``op`` is an in-place variant (``add_``, ``mul_.Scalar``)."""
        return torch.Tag.inplace in op.tags
else:
    is_inplace = inplace_from_schema


# torch.utils._pytree.tree_is_leaf: 2.8 (``_is_leaf`` before, the same test).
tree_is_leaf = getattr(pytree, "tree_is_leaf", None) or pytree._is_leaf


def set_version_counters(tensors: Sequence[torch.Tensor], versions: Sequence[int]) -> None:
    """Set each tensor's autograd version counter (views share their base's counter)."""
    setter = torch._C._autograd._unsafe_set_version_counter
    if _VERSION >= (2, 7):  # 2.7: tuples of tensors and versions, set together
        setter(tuple(tensors), tuple(versions))
        return
    for t, v in zip(tensors, versions):
        setter(t, v)


def out_of_memory(exc: BaseException) -> bool:
    """CUDA/MPS raise ``torch.OutOfMemoryError``; the CPU allocator a plain RuntimeError, saying so or
    passing on C++'s ``std::bad_alloc``; Python's own allocations a MemoryError."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and ("DefaultCPUAllocator: can't allocate memory" in str(exc)
                                           or "std::bad_alloc" in str(exc)))
