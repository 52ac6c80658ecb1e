"""Tensors inside nested inputs and outputs.

Containers are opened the way ``torch.utils._pytree`` opens them (tuples, named tuples, lists,
dicts, and whatever a library registers, such as Hugging Face ``ModelOutput``). Two kinds it
leaves closed are opened here as well: subclasses of dict, list and tuple nobody registered,
and dataclass-like objects (anything with ``__dataclass_fields__``).
"""
from __future__ import annotations

from typing import Any, Callable, List, Sequence

import torch
from torch.nn.utils.rnn import PackedSequence
from torch.utils import _pytree as pytree

from ..compat import tree_is_leaf

# Containers deeper than this are not opened: a guard against objects that reach themselves.
MAX_DEPTH = 6


def tensors(obj: Any) -> List[torch.Tensor]:
    """Every tensor inside ``obj``, in order (a tensor held twice is listed twice)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    found: List[torch.Tensor] = []
    _gather(obj, found, 0)
    return found


def _gather(obj: Any, found: List[torch.Tensor], depth: int) -> None:
    if isinstance(obj, torch.Tensor):
        found.append(obj)
    elif depth <= MAX_DEPTH:
        for child in _children(obj):
            _gather(child, found, depth + 1)


def _children(obj: Any) -> Sequence[Any]:
    """What a container holds directly; nothing for anything else."""
    if type(obj) in (tuple, list):  # what pytree would give, without its cost on every recorded call
        return obj
    if type(obj) is dict:
        return list(obj.values())
    if not tree_is_leaf(obj):
        opened = False

        def closed(_: Any) -> bool:  # open the container itself, none of its children
            nonlocal opened
            was, opened = opened, True
            return was

        return pytree.tree_leaves(obj, is_leaf=closed)
    if isinstance(obj, (list, tuple)):
        return obj
    if isinstance(obj, dict):
        return list(obj.values())
    if hasattr(obj, "__dataclass_fields__"):
        return [getattr(obj, key, None) for key in obj.__dataclass_fields__]
    return ()


def map_tensors(fn: Callable[[Any], Any], obj: Any) -> Any:
    """``obj`` rebuilt with ``fn`` applied to every tensor, keeping container types.

    A ``PackedSequence`` reaches ``fn`` whole: its fields belong together (``.to(device)``
    moves its data and indices but keeps ``batch_sizes`` on the CPU, as packing needs).
    A dict, list or tuple subclass pytree does not know comes back as a plain one;
    other objects are kept as they are."""
    def leaf(value: Any) -> Any:
        if isinstance(value, (torch.Tensor, PackedSequence)):
            return fn(value)
        if isinstance(value, dict):
            return {k: map_tensors(fn, v) for k, v in value.items()}
        if isinstance(value, tuple):
            return tuple(map_tensors(fn, v) for v in value)
        if isinstance(value, list):
            return [map_tensors(fn, v) for v in value]
        return value

    return pytree.tree_map(leaf, obj, is_leaf=lambda x: isinstance(x, PackedSequence))
