"""Capture by recording the dataflow while the probe batch runs.

Module pre/post hooks keep a stack of the module paths being executed; a
``TorchFunctionMode`` sees every torch function and tensor method call, and links
calls by the identity of the tensors they pass each other. Handles in-place ops
(the written tensor gets a new producer), parameter views (``W.t()``), modules
called several times (one op per call) and hand-written normalisation modules
(recorded as one op, their internals skipped).
"""
from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from . import ops as O
from .graph import Op
from .nested import tensors as _tensors
from .base import Capture, Observer, attention_inputs, param_roles, user_call_site, without_dropout

_NOT_RECORDED = frozenset({"__get__", "__set__", "size", "dim", "numel", "__len__", "__bool__", "__format__",
                           "__repr__", "__hash__", "is_floating_point", "is_complex", "item", "tolist",
                           "data_ptr", "stride", "storage_offset", "element_size", "is_contiguous",
                           "requires_grad_", "retain_grad", "get_device", "_is_view", "__reduce_ex__",
                           "__deepcopy__", "__iter__", "__contains__", "register_hook"})
_PROPERTIES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data"})
_WHOLE_VIEWS = frozenset({"view", "reshape", "flatten", "permute", "transpose", "t", "contiguous", "unsqueeze",
                          "squeeze", "to", "float", "half", "double", "bfloat16", "type_as", "type", "view_as",
                          "reshape_as", "movedim", "swapaxes", "unflatten", "cuda", "cpu", "clone", "T", "mT"})
"""Views of a parameter that hold each of its entries once, and pass the gradient back unchanged (a cast
rounds it): a product with such a view has the weight gradient of a product with the parameter."""


class RuntimeCapture(Capture):
    """Works for any module that runs; the graph is filled during :meth:`run`."""

    name = "runtime"

    def run(self, args: Tuple[Any, ...], kwargs: Dict[str, Any], observe: Observer) -> Any:
        self._reset(observe)
        handles = []
        try:
            for module in self.model.modules():
                if isinstance(module, torch.jit.ScriptModule):
                    continue  # TorchScript runs outside Python: no hooks, no recorded ops inside
                handles.append(module.register_forward_pre_hook(self._enter))
                handles.append(module.register_forward_hook(self._leave))
            for value in _tensors((args, kwargs)):
                op = self.graph.add("input", "input", "", [], attrs={"shape": tuple(value.shape)})
                self.graph.inputs.append(op.id)
                self._record_outputs(op, value)
            with _Recorder(self):
                out = self.model(*args, **kwargs)
            self.graph.outputs = sorted({i for t in _tensors(out) if (i := self.producer(t)) is not None})
            return out
        finally:
            for h in handles:
                h.remove()

    def _reset(self, observe: Observer) -> None:
        types, self.graph = self.graph.module_types, type(self.graph)()
        self.graph.module_types = types
        self.observe = observe
        self.stack: List[Tuple[str, bool]] = []  # (module path, is opaque)
        self.opaque_depth = 0
        self.producers: Dict[int, Tuple[Any, int]] = {}
        self.param_views: Dict[int, Tuple[Any, str, bool, bool]] = {}
        """id -> (weak reference, parameter name, transposed, whole: every entry once, see :data:`_WHOLE_VIEWS`)."""
        self.pending_inputs: List[List[int]] = []

    # ------------------------------------------------------------- tensor identity
    def _produced(self, t: torch.Tensor, op_id: int) -> None:
        self.producers[id(t)] = (weakref.ref(t), op_id)

    def producer(self, t: torch.Tensor) -> Optional[int]:
        """Op that last wrote ``t`` (None for parameters, buffers and constants)."""
        entry = self.producers.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        return None

    def producer_of(self, tensor: torch.Tensor, out: Any) -> Optional[int]:
        return self.producer(tensor)

    def param_of(self, t: torch.Tensor) -> Optional[Tuple[str, bool]]:
        """(name, transposed) when ``t`` is a parameter or a view of one."""
        name = self.param_names.get(id(t))
        if name is not None and isinstance(t, nn.Parameter):
            return (name, False)
        entry = self.param_views.get(id(t))
        if entry is not None and entry[0]() is t:
            return (entry[1], entry[2])
        return None

    def _whole(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is a parameter, or a view of one that holds each of its entries once."""
        if isinstance(t, nn.Parameter) and id(t) in self.param_names:
            return True
        entry = self.param_views.get(id(t))
        return entry is not None and entry[0]() is t and entry[3]

    # ------------------------------------------------------------- module hooks
    def _enter(self, module: nn.Module, args: Tuple[Any, ...]) -> None:
        path = self.module_paths.get(id(module), "?")
        opaque = self.opaque_depth == 0 and O.handwritten_kind(module) is not None
        self.stack.append((path, opaque))
        if opaque:
            self.pending_inputs.append([i for t in _tensors(args) if (i := self.producer(t)) is not None])
            self.opaque_depth += 1

    def _leave(self, module: nn.Module, args: Tuple[Any, ...], output: Any) -> None:
        if not self.stack:
            return
        path, opaque = self.stack.pop()
        if not opaque:
            return
        self.opaque_depth -= 1
        kind = O.handwritten_kind(module) or "other"
        op = self.graph.add(kind, type(module).__name__, path, self.pending_inputs.pop(),
                            params=self.module_params(path, module), attrs={"module_op": True})
        self._record_outputs(op, output)

    def current_module(self) -> str:
        return self.stack[-1][0] if self.stack else ""

    # ------------------------------------------------------------- calls
    def on_call(self, func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        name = O.call_name(func)
        if name == "__get__":
            name = getattr(getattr(func, "__self__", None), "__name__", name)
            if name not in _PROPERTIES:
                return func(*args, **kwargs)
        elif name in _NOT_RECORDED:
            return func(*args, **kwargs)
        kind = O.kind_of_name(name)
        if kind in ("dropout", "attention", "rnn"):
            skipped, args, kwargs = without_dropout(name, args, kwargs)
            if skipped is not None:
                return skipped
        out = func(*args, **kwargs)
        if self.opaque_depth:
            return out
        if kind == "attention":
            self._record_attention(func, name, args, kwargs, out)
            return out
        if name == "__setitem__":
            target = args[0]
            prev = self.producer(target)
            op = self.graph.add("other", "Tensor.__setitem__", self.current_module(),
                                [] if prev is None else [prev])
            self._record_outputs(op, target)
            return out
        self._record_call(func, name, kind, args, kwargs, out)
        return out

    def _record_call(self, func: Any, name: str, kind: str, args: Tuple[Any, ...], kwargs: Dict[str, Any], out: Any) -> None:
        outs = _tensors(out)
        if not outs:
            return
        inputs: List[int] = []
        named: List[Tuple[str, torch.Tensor]] = []
        transposed = False
        for t in _tensors(args) + (_tensors(kwargs) if kwargs else []):
            p = self.param_of(t)
            if p is not None:
                named.append((p[0], t))
                transposed = transposed or p[1]
                continue
            src = self.producer(t)
            if src is not None and src not in inputs:
                inputs.append(src)
        if named and not inputs and kind == "view":
            # W.t(), W.to(dtype): keep following the parameter, not a graph op.
            flip = name in ("t", "transpose", "T", "mT", "swapaxes", "permute")
            whole = name in _WHOLE_VIEWS and len(outs) == 1 and self._whole(named[0][1]) \
                and outs[0].numel() == named[0][1].numel()
            for t in outs:
                self.param_views[id(t)] = (weakref.ref(t), named[0][0], transposed != flip, whole)
            return
        attrs = O.call_attrs(kind, name, args, kwargs)
        if kind == "matmul" and named and len(named) == 1 and _is_second_operand(args, named[0][1]):
            kind = "linear"
        if kind == "linear":
            layout = O.weight_layout(name)
            attrs["layout"] = {"in_out": "out_in", "out_in": "in_out"}[layout] if transposed else layout
        elif kind == "matmul" and named:
            kind = "other"
        op = self.graph.add(kind, _display(func, name), self.current_module(), inputs,
                            params=param_roles(kind, named), attrs=attrs)
        if kind not in ("view", "other", "add", "mul", "div", "cat"):
            op.location = user_call_site(2)
        self._record_outputs(op, out)
        if kind in ("linear", "embedding", "conv") and isinstance(out, torch.Tensor):
            self._observe_product(op, name, args, kwargs, out)

    def _observe_product(self, op: Op, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                         out: torch.Tensor) -> None:
        """A weight product's or lookup's input, for its weight's gradient (``observe.weight_product``)."""
        observe_product = getattr(self.observe, "weight_product", None)
        if observe_product is None:
            return
        found = O.weight_operands(op.kind, name, args, kwargs)
        if found is None or not isinstance(found[0], torch.Tensor) or not isinstance(found[1], torch.Tensor) \
                or self.param_of(found[0]) is not None or not self._whole(found[1]):
            return
        if self.param_of(found[1])[0] == op.params.get("weight"):  # type: ignore[index]
            with torch._C.DisableTorchFunction():
                observe_product(op, found[0], out, *found[2:])

    def _record_attention(self, func: Any, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                          out: Any) -> None:
        """An attention call: the op, which inputs are its queries and keys, and the statistics of
        its attention rows (the observer sees q, k and the mask, not only the output)."""
        call = O.attention_call(name, args, kwargs)
        before = len(self.graph)
        self._record_call(func, name, "attention", args, kwargs, out)
        if call is None or len(self.graph) == before:
            return
        op = self.graph[len(self.graph) - 1]
        op.attrs.update(attention_inputs(call, self.producer))
        observe_attention = getattr(self.observe, "attention", None)
        if observe_attention is not None:
            with torch._C.DisableTorchFunction():
                observe_attention(op, call)

    def _record_outputs(self, op: Op, out: Any) -> None:
        outs = _tensors(out)
        for t in outs:
            self._produced(t, op.id)
        if outs:
            with torch._C.DisableTorchFunction():  # the observer's own ops are not the model's
                self.observe(op, outs[0] if len(outs) == 1 else out)


class _Recorder(TorchFunctionMode):
    def __init__(self, cap: RuntimeCapture) -> None:
        super().__init__()
        self.cap = cap

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D401 - torch protocol
        return self.cap.on_call(func, args, kwargs or {})


def _is_second_operand(args: Tuple[Any, ...], weight: torch.Tensor) -> bool:
    return len(args) >= 2 and args[-1] is weight or (len(args) == 3 and args[2] is weight)


def _display(func: Any, name: str) -> str:
    """``F.relu``, ``torch.tanh``, ``Tensor.relu_`` as the user wrote it."""
    module = getattr(func, "__module__", None) or ""
    if module.startswith("torch.nn.functional"):
        return f"F.{name}"
    qual = getattr(func, "__qualname__", "") or ""
    if qual.startswith(("Tensor.", "TensorBase.", "_TensorBase.")) or module == "torch._tensor":
        return f"Tensor.{name}"
    return f"torch.{name}"
