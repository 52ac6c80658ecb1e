"""What every capture backend shares: the interface, parameter naming, call sites."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.utils.checkpoint
from torch.overrides import TorchFunctionMode

from .graph import Graph, Op
from . import ops as O

Observer = Callable[[Op, Any], None]


class CaptureError(Exception):
    """A backend cannot capture this model; the next backend is tried."""


class Capture:
    """Base class: a graph plus a way to run the model once while observing ops."""

    name = "?"

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.graph = Graph()
        self.fallback_reasons: List[str] = []
        self.param_names: Dict[int, str] = {id(p): n for n, p in model.named_parameters()}
        self.module_paths: Dict[int, str] = {id(m): n for n, m in model.named_modules()}
        for path, module in model.named_modules():
            self.graph.module_types[path] = type(module).__name__

    def run(self, args: Tuple[Any, ...], kwargs: Dict[str, Any], observe: Observer) -> Any:
        """Execute the model on the probe inputs, calling ``observe`` after each op."""
        raise NotImplementedError

    def finish(self) -> Graph:
        """End the capture: record where each module was constructed, then make the graph read-only."""
        from .locate import ModuleLocations

        if not self.graph.frozen:
            self.graph.module_locations = ModuleLocations(self.model)
        return self.graph.freeze()

    def producer_of(self, tensor: torch.Tensor, out: Any) -> Optional[int]:
        """The op that produced ``tensor``, one of the tensors in the model output ``out``."""
        return None

    def module_params(self, path: str, module: nn.Module) -> Dict[str, str]:
        """Parameters of a module op as qualified names: ``weight``/``bias`` roles for layers
        that have them, every parameter under its own name otherwise (RNNs, attention)."""
        found = {}
        for role in ("weight", "bias"):
            p = getattr(module, role, None)
            if isinstance(p, nn.Parameter) and id(p) in self.param_names:
                found[role] = self.param_names[id(p)]
        if not found:
            for name, p in module.named_parameters():
                if id(p) in self.param_names:
                    found[name] = self.param_names[id(p)]
        return found


def param_roles(kind: str, names: List[Tuple[str, torch.Tensor]]) -> Dict[str, str]:
    """Assign roles to the parameters a call received: the matrix is ``weight``, a vector ``bias``."""
    roles: Dict[str, str] = {}
    extra = 0
    for name, tensor in names:
        if kind in ("linear", "conv", "conv_transpose", "embedding") and tensor.dim() >= 2 and "weight" not in roles:
            roles["weight"] = name
        elif kind in O.NORM_KINDS and "weight" not in roles:
            roles["weight"] = name
        elif tensor.dim() == 1 and "bias" not in roles and kind != "embedding":
            roles["bias"] = name
        else:
            roles[f"param{extra}"] = name
            extra += 1
    return roles


_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP_DIRS = (_TORCH_DIR, _OWN_DIR)


def user_call_site(start_depth: int = 2) -> Optional[Tuple[str, int]]:
    """File and line of the innermost frame outside torch and initlint (the user's call)."""
    frame = sys._getframe(start_depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIP_DIRS) and not filename.startswith("<"):
            return (filename, frame.f_lineno)
        frame = frame.f_back
    return None


def _checkpoint_forward() -> Any:
    function = getattr(torch.utils.checkpoint, "CheckpointFunction", None)
    return getattr(getattr(function, "forward", None), "__code__", None)


_REENTRANT_FORWARD = _checkpoint_forward()


def in_reentrant_checkpoint(start_depth: int = 2) -> bool:
    """Whether the caller runs inside the forward of reentrant activation checkpointing
    (``torch.utils.checkpoint.checkpoint(..., use_reentrant=True)``), which runs the checkpointed function
    with autograd off and differentiates it only in its own backward. Asked only where autograd is off:
    this no_grad is checkpointing's, not the model's."""
    if _REENTRANT_FORWARD is None:
        return False
    frame = sys._getframe(start_depth)
    while frame is not None:
        if frame.f_code is _REENTRANT_FORWARD:
            return True
        frame = frame.f_back
    return False


def without_dropout(name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]):
    """Dropout off for the probe: ``(input, ...)`` for dropout calls, zeroed ``dropout_p`` for attention."""
    if O.kind_of_name(name) == "dropout":
        return (args[0] if args else kwargs.get("input")), args, kwargs
    if name == "scaled_dot_product_attention":
        if len(args) > 4:  # (query, key, value, attn_mask, dropout_p, ...): given by position
            args = args[:4] + (0.0,) + args[5:]
        else:
            kwargs = dict(kwargs, dropout_p=0.0)
    elif O.kind_of_name(name) == "rnn" and name in ("lstm", "gru", "rnn_tanh", "rnn_relu") and len(args) > 6:
        # (input, hx, params, has_biases, num_layers, dropout, ...) or, packed,
        # (data, batch_sizes, hx, params, has_biases, num_layers, dropout, ...)
        index = 5 if isinstance(args[3], bool) else 6
        args = args[:index] + (0.0,) + args[index + 1:]
    elif name == "multi_head_attention_forward":
        kwargs = dict(kwargs)
        if "dropout_p" in kwargs:
            kwargs["dropout_p"] = 0.0
        elif len(args) > 10:
            args = args[:10] + (0.0,) + args[11:]
    return None, args, kwargs


class DropoutOff(TorchFunctionMode):
    """Disables dropout (functional, module and inside attention) while the probe runs."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D401 - torch protocol
        kwargs = kwargs or {}
        name = O.call_name(func)
        if O.kind_of_name(name) in ("dropout", "attention", "rnn"):
            skipped, args, kwargs = without_dropout(name, args, kwargs)
            if skipped is not None:
                return skipped
        return func(*args, **kwargs)


def grad_without_dropout(outputs: List[torch.Tensor], inputs: List[Any],
                         grad_outputs: Optional[List[torch.Tensor]] = None) -> Tuple[Optional[torch.Tensor], ...]:
    """``torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=True)`` with dropout still off
    (:class:`DropoutOff`) inside the backward. Activation checkpointing (``torch.utils.checkpoint``, Hugging
    Face's ``gradient_checkpointing_enable()``) runs the checkpointed part of the forward again there, and it
    must find what the probe's forward saved: dropout on in that second run draws masks (and takes SDPA's
    path for dropout) that the first did not, and checkpointing refuses the mismatch.

    ``torch.autograd.grad`` would not do: a torch-function mode is switched off while it handles a call, and it
    handles ``grad`` itself, so the backward ran with no mode at all. The engine is called as ``grad`` calls it
    (``torch.autograd.graph._engine_run_backward``, in every supported torch), which no mode intercepts."""
    if grad_outputs is None:
        grad_outputs = [torch.ones_like(o, memory_format=torch.preserve_format) for o in outputs]
    run = getattr(torch.autograd.graph, "_engine_run_backward", None)
    with DropoutOff():
        if run is None:
            return torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=True)
        return run(tuple(outputs), tuple(grad_outputs), False, False, tuple(inputs), True, accumulate_grad=False)


def attention_inputs(call: "O.AttentionCall", producer: Callable[[torch.Tensor], Optional[int]]) -> Dict[str, Any]:
    """Graph attributes of an attention op: the ops that produced its queries, keys and values (``q_input``,
    ``k_input``, ``v_input``; rules follow them back to the projections), and its scale when one was given."""
    attrs: Dict[str, Any] = {"head_dim": call.head_dim}
    for role, tensor in (("q_input", call.q), ("k_input", call.k), ("v_input", call.v)):
        if tensor is None:
            continue
        op_id = producer(tensor)
        if op_id is not None:
            attrs[role] = op_id
    if call.scale is not None:
        attrs["scale"] = call.scale
    return attrs


class AttentionSpy(DropoutOff):
    """:class:`DropoutOff` that also keeps the arguments of the attention call made inside a module
    (``nn.MultiheadAttention`` calls ``F.multi_head_attention_forward``)."""

    def __init__(self) -> None:
        super().__init__()
        self.call: Optional[O.AttentionCall] = None

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D401 - torch protocol
        kwargs = kwargs or {}
        name = O.call_name(func)
        if O.kind_of_name(name) == "attention":
            _, args, kwargs = without_dropout(name, args, kwargs)
            self.call = O.attention_call(name, args, kwargs)
        return super().__torch_function__(func, types, args, kwargs)
