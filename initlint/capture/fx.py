"""Capture with ``torch.fx`` symbolic tracing: static, keeps module calls as ops."""
from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.fx as fx
import torch.nn as nn

from . import nested
from . import ops as O
from .base import (AttentionSpy, Capture, CaptureError, DropoutOff, Observer, attention_inputs,
                   in_reentrant_checkpoint, param_roles, user_call_site, without_dropout)



def untraceable(model: nn.Module) -> Optional[str]:
    """Why ``torch.fx`` cannot trace ``model``, known without trying; None when only a trace can tell.

    A Hugging Face ``transformers`` model (a ``PreTrainedModel``): its forward takes ``**kwargs: Unpack[...]``,
    which fx cannot bind, or branches on its inputs' shapes (every one of the real-size zoo's 23 failed,
    after 2-13 ms and a state guard); transformers ships a tracer of its own for that reason."""
    if any(cls.__name__ == "PreTrainedModel" and cls.__module__.startswith("transformers.")
           for cls in type(model).__mro__):
        return "a Hugging Face transformers model (PreTrainedModel) is not symbolically traceable"
    return None


class FxCapture(Capture):
    """Symbolic trace converted op by op; the probe runs through an ``fx.Interpreter``."""

    name = "fx"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        known = untraceable(model)
        if known is not None:
            raise CaptureError(known)
        tracer = _Tracer()
        self.node_ops: Dict[fx.Node, int] = {}
        self.module_kinds: Dict[str, str] = {}
        self.placeholders: List[Any] = []
        self.steps: Optional[List[Tuple[nn.Module, Any]]] = None
        """For a plain ``nn.Sequential`` of leaf modules: each child and its op, run in turn without an fx graph."""
        self.fx_graph: Optional[fx.Graph] = None
        children = _plain_sequence(model, tracer)
        if children is not None and self._convert_sequence(children):
            return
        try:
            self.fx_graph = _sequential_graph(model, tracer)
            if self.fx_graph is None:
                with torch.enable_grad():  # grad mode while tracing is then the model's own (its no_grad blocks)
                    self.fx_graph = tracer.trace(model)
        except Exception as exc:  # fx raises many exception types on untraceable code
            raise CaptureError(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
        self._convert()

    def _convert_sequence(self, children: List[Tuple[str, nn.Module]]) -> bool:
        """The graph a trace gives a plain ``nn.Sequential`` (one input through each child in turn), built from
        its children, with the children as :attr:`steps`: no fx graph to build and no interpreter to run it
        (about 70 us a layer in fx's node and argument handling, a tenth of a 50-layer MLP's audit). False,
        and nothing built, where a child's kind needs the interpreter's handling (attention, a recurrent layer)."""
        kinds = [O.module_kind(child) for _, child in children]
        if any(kind in ("attention", "rnn") for kind in kinds):
            return False
        for (name, child), kind in zip(children, kinds):
            if kind is None and any(True for _ in child.parameters()):
                raise CaptureError(f"fx kept {type(child).__name__} at '{name}' as one opaque call")
        op = self.graph.add("input", "input", "", [])
        self.graph.inputs.append(op.id)
        self.placeholders.append("input")
        self.steps = []
        for (name, child), kind in zip(children, kinds):
            kind = kind or "other"
            op = self.graph.add(kind, f"nn.{type(child).__name__}", name, [op.id],
                                params=self.module_params(name, child), attrs=O.module_attrs(kind, child))
            op.attrs["module_op"] = True
            self.module_kinds[name] = kind
            self.steps.append((child, op))
        self.graph.outputs = [op.id]
        return True

    # ---------------------------------------------------------------- conversion
    def _convert(self) -> None:
        modules = dict(self.model.named_modules())
        attr_names: Dict[fx.Node, str] = {}
        for node in self.fx_graph.nodes:
            if node.op == "get_attr":
                attr_names[node] = node.target
            elif node.op == "placeholder":
                self.placeholders.append(node)
                op = self.graph.add("input", node.target, "", [])
                self.node_ops[node] = op.id
                self.graph.inputs.append(op.id)
            elif node.op == "output":
                self.graph.outputs = [self.node_ops[n] for n in _nodes_in(node.args) if n in self.node_ops]
            elif node.op == "call_module":
                self._add_module_op(node, modules[node.target])
            else:
                self._add_call_op(node, attr_names)

    def _inputs(self, node: fx.Node) -> List[int]:
        return [self.node_ops[n] for n in _nodes_in((node.args, node.kwargs)) if n in self.node_ops]

    def _add_module_op(self, node: fx.Node, module: nn.Module) -> None:
        kind = O.module_kind(module)
        if kind is None:
            if any(True for _ in module.parameters()):
                raise CaptureError(f"fx kept {type(module).__name__} at '{node.target}' as one opaque call")
            kind = "other"
        op = self.graph.add(
            kind, f"nn.{type(module).__name__}", node.target, self._inputs(node),
            params=self.module_params(node.target, module), attrs=O.module_attrs(kind, module),
        )
        op.attrs["module_op"] = True
        self.node_ops[node] = op.id
        self.module_kinds[node.target] = kind

    def _add_call_op(self, node: fx.Node, attr_names: Dict[fx.Node, str]) -> None:
        name = O.call_name(node.target)
        kind = O.kind_of_name(name)
        named = []
        for n in _nodes_in((node.args, node.kwargs)):
            if n in attr_names:
                value = _fetch(self.model, attr_names[n])
                if isinstance(value, nn.Parameter) and id(value) in self.param_names:
                    named.append((self.param_names[id(value)], value))
        if kind == "matmul" and named:
            kind = "linear"
        plain_args = tuple(a if not isinstance(a, fx.Node) else None for a in node.args)
        attrs = O.call_attrs(kind, name, plain_args, dict(node.kwargs))
        if kind == "linear":
            attrs["layout"] = O.weight_layout(name)
        module = _owner(node)
        target = f"{'Tensor.' if node.op == 'call_method' else _prefix(node.target)}{name}"
        op = self.graph.add(kind, target, module, self._inputs(node), params=param_roles(kind, named),
                            attrs=attrs, location=_stack_location(node))
        self.node_ops[node] = op.id

    # ---------------------------------------------------------------- execution
    def run(self, args: Tuple[Any, ...], kwargs: Dict[str, Any], observe: Observer) -> Any:
        positional = _bind(self.model, self.placeholders, args, kwargs)
        if self.steps is not None:
            return self._run_steps(positional[0], observe)
        interp = _Observed(self.model, self, observe)
        return interp.run(*positional)

    def _run_steps(self, value: Any, observe: Observer) -> Any:
        """:attr:`steps` in turn, observed as :class:`_Observed` observes the nodes of their graph."""
        observe_product = getattr(observe, "weight_product", None)
        observe(self.graph[self.graph.inputs[0]], value)
        for module, op in self.steps:  # type: ignore[union-attr]
            if op.kind == "dropout":
                continue  # dropout is off for the probe
            out = module(value)
            observe(op, out)
            if observe_product is not None and op.kind in ("linear", "embedding", "conv"):
                _observe_module_product(self, observe_product, module, op, value, out)
            value = out
        return value

    def producer_of(self, tensor: Any, out: Any) -> Optional[int]:
        # the traced output node lists the returned values in the order nested.tensors finds them
        found = [i for i, t in enumerate(nested.tensors(out)) if t is tensor]
        outputs = self.graph.outputs
        if found and len(nested.tensors(out)) == len(outputs):
            return outputs[found[0]]
        return None


class _Tracer(fx.Tracer):
    """Keeps hand-written norms and activations (``T5LayerNorm``, ``NewGELUActivation``) as one call."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return super().is_leaf_module(m, module_qualified_name) or O.handwritten_kind(m) is not None

    def create_node(self, kind: str, *args: Any, **kwargs: Any) -> fx.Node:
        # fx's own record_stack_traces imports torch._dynamo (seconds); a frame walk is enough,
        # and only functional calls need it (module calls are located from the source).
        node = super().create_node(kind, *args, **kwargs)
        if not torch.is_grad_enabled() and not in_reentrant_checkpoint():
            # inside the model's own no_grad: fx keeps no trace of it, the replay does. Reentrant activation
            # checkpointing's no_grad is not the model's: its backward differentiates the block, so the replay
            # runs the block with autograd on, as a non-reentrant checkpoint does
            node.meta["initlint_no_grad"] = True
        if kind in ("call_function", "call_method"):
            node.meta["initlint_location"] = user_call_site(2)
        return node


def _plain_sequence(model: nn.Module, tracer: _Tracer) -> Optional[List[Tuple[str, nn.Module]]]:
    """The children of a plain ``nn.Sequential`` of leaf modules (one input through each in turn); None for any
    other model. Hooks need no care: a trace never runs them, the replay does."""
    if type(model) is not nn.Sequential or len(model) == 0 or type(model).forward is not nn.Sequential.forward:
        return None
    children = list(model.named_children())
    return children if all(tracer.is_leaf_module(child, name) for name, child in children) else None


def _sequential_graph(model: nn.Module, tracer: _Tracer) -> Optional[fx.Graph]:
    """The graph a trace of a plain ``nn.Sequential`` of leaf modules gives, built without tracing; None for any
    other model. A trace costs about 70 us a layer in fx's argument handling, a tenth of a 50-layer MLP's audit."""
    children = _plain_sequence(model, tracer)
    if children is None:
        return None
    graph = fx.Graph()
    value = graph.placeholder("input")
    for name, _ in children:
        value = graph.call_module(name, (value,))
    graph.output(value)
    return graph


class _Observed(fx.Interpreter):
    """Runs the traced graph against the user's own module (no generated code needed)."""

    def __init__(self, model: nn.Module, cap: FxCapture, observe: Observer) -> None:
        super().__init__(model, graph=cap.fx_graph)
        self.cap = cap
        self.observe = observe
        self.attention: Optional[O.AttentionCall] = None

    def call_function(self, target: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        name = O.call_name(target)
        if O.kind_of_name(name) in ("attention", "rnn"):
            _, args, kwargs = without_dropout(name, tuple(args), dict(kwargs))
        if O.kind_of_name(name) == "attention":
            self.attention = O.attention_call(name, tuple(args), dict(kwargs))
        return super().call_function(target, args, kwargs)

    def call_module(self, target: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        kind = self.cap.module_kinds.get(target)
        if kind == "attention":
            spy = AttentionSpy()  # dropout off, and the F.multi_head_attention_forward call kept
            with spy:
                out = super().call_module(target, args, kwargs)
            self.attention = spy.call
            return out
        if kind == "rnn":
            with DropoutOff():  # dropout inside nn.LSTM(dropout=p)
                return super().call_module(target, args, kwargs)
        return super().call_module(target, args, kwargs)

    def run_node(self, n: fx.Node) -> Any:
        op_id = self.cap.node_ops.get(n)
        if op_id is not None and self.cap.graph[op_id].kind == "dropout":
            args, _ = self.fetch_args_kwargs_from_env(n)
            return args[0]  # dropout is off for the probe
        self.attention = None
        if n.meta.get("initlint_no_grad"):
            with torch.no_grad():  # the model's own no_grad block, which the trace does not keep
                return self._run_node(n)
        return self._run_node(n)

    def _run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        op_id = self.cap.node_ops.get(n)
        if op_id is not None:
            op = self.cap.graph[op_id]
            self.observe(op, out)
            if self.attention is not None:
                self._observe_attention(n, op, self.attention)
            if op.kind in ("linear", "embedding", "conv"):
                self._observe_product(n, op, out)
        return out

    def _observe_product(self, node: fx.Node, op: Any, out: Any) -> None:
        """A weight product's or lookup's input, for its weight's gradient (``observe.weight_product``)."""
        observe_product = getattr(self.observe, "weight_product", None)
        if observe_product is None:
            return
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        if node.op == "call_module":
            _observe_module_product(self.cap, observe_product, self.fetch_attr(node.target), op,
                                    args[0] if args else kwargs.get("input"), out)
        else:
            _observe_operands(self.cap, observe_product, op,
                              O.weight_operands(op.kind, O.call_name(node.target), tuple(args), dict(kwargs)), out)

    def _observe_attention(self, node: fx.Node, op: Any, call: O.AttentionCall) -> None:
        """The queries and keys of an attention node, by the fx nodes that produced them."""
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        tensors = {id(v): self.cap.node_ops.get(a) for a, v in zip(node.args, args) if isinstance(a, fx.Node)}
        tensors.update({id(v): self.cap.node_ops.get(node.kwargs[k]) for k, v in kwargs.items()
                        if isinstance(node.kwargs.get(k), fx.Node)})
        if node.op == "call_module" and args:
            # nn.MultiheadAttention transposes batch-first inputs before the call: map by position
            tensors[id(call.q)] = self.cap.node_ops.get(node.args[0]) if isinstance(node.args[0], fx.Node) else None
            if len(node.args) > 1 and isinstance(node.args[1], fx.Node):
                tensors[id(call.k)] = self.cap.node_ops.get(node.args[1])
        if not self.cap.graph.frozen:  # a second run (a retry with a smaller batch) finds them recorded
            op.attrs.update(attention_inputs(call, lambda t: tensors.get(id(t))))
        observe_attention = getattr(self.observe, "attention", None)
        if observe_attention is not None:
            observe_attention(op, call)


def _observe_module_product(cap: FxCapture, observe_product: Any, module: nn.Module, op: Any, x: Any, out: Any) -> None:
    """The weight product or lookup of a module call (``nn.Linear``, a zero-padded ``nn.Conv2d``,
    ``nn.Embedding`` with their own forwards), handed to ``observe_product``."""
    found = None
    if type(module).forward is nn.Linear.forward:
        found = (x, module.weight, False, None, None)
    elif type(module).forward is nn.Conv2d.forward and module.padding_mode == "zeros":
        found = O.weight_operands("conv", "conv2d", (x, module.weight, module.bias, module.stride,
                                                     module.padding, module.dilation, module.groups), {})
    elif type(module).forward is nn.Embedding.forward:
        found = O.weight_operands("embedding", "embedding", (x, module.weight, module.padding_idx,
                                                             module.max_norm, module.norm_type,
                                                             module.scale_grad_by_freq, module.sparse), {})
    _observe_operands(cap, observe_product, op, found, out)


def _observe_operands(cap: FxCapture, observe_product: Any, op: Any, found: Any, out: Any) -> None:
    if found is not None and isinstance(found[1], nn.Parameter) \
            and cap.param_names.get(id(found[1])) == op.params.get("weight") \
            and id(found[0]) not in cap.param_names:
        observe_product(op, found[0], out, *found[2:])


def _nodes_in(obj: Any) -> List[fx.Node]:
    found: List[fx.Node] = []
    fx.node.map_arg(obj, lambda n: found.append(n))
    return found


def _fetch(root: nn.Module, target: str) -> Any:
    value: Any = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _owner(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if stack:
        last = list(stack.values())[-1]
        path = last[0] if isinstance(last, tuple) else str(last)
        return "" if path in ("", "L['self']") else path
    return ""


def _prefix(target: Any) -> str:
    mod = getattr(target, "__module__", "") or ""
    if mod.startswith("torch.nn.functional"):
        return "F."
    if mod.startswith("torch") or mod == "":
        return "torch."
    return "operator." if mod == "_operator" else f"{mod}."


def _stack_location(node: fx.Node) -> Optional[Tuple[str, int]]:
    return node.meta.get("initlint_location")


def _bind(model: nn.Module, placeholders: List[fx.Node], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Any]:
    """Order positional and keyword probe inputs as the traced placeholders expect."""
    if not kwargs and len(args) == len(placeholders):
        return list(args)
    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs)
    except TypeError as exc:
        raise CaptureError(f"inputs do not match forward(): {exc}") from None
    bound.apply_defaults()
    values = list(bound.arguments.values())
    if len(values) != len(placeholders):
        raise CaptureError("forward() takes variadic arguments")
    return values
