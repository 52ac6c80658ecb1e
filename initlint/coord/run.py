"""``initlint.sweep``: build the model at several widths and depths, take a few optimizer steps on one
batch, and measure each layer's scale at every size (a coordinate check).

Per size: seed, build, move to the device, then ``steps + 1`` forward and backward passes on the same
probe batch (the optimizer steps between them). Forward hooks on every module that holds parameters
record its output rms; the attention logits ``q . k * scale`` are measured where the model calls
``scaled_dot_product_attention`` or a softmax over square score matrices; the norm of the input
layer's gradient is read after each backward. The model is freed before the next size is built.
"""
from __future__ import annotations

import gc
import inspect
import math
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..api import resolve_device
from ..capture import nested
from ..errors import LoadError, UsageError
from ..inputs.load import DEFAULT_BATCH, infer_inputs, move_inputs, normalise_inputs
from ..inputs.usercode import seed_everything, user_code, user_frame
from ..probe.coords import INPUT_GRAD, LOGITS, OUTPUT, STREAM, Axis, Curve, SweepData
from ..probe.guard import _global_state, guarded

Progress = Callable[[int, int, str], None]
"""``progress(done, total, label)``, called after each build (``label``: ``d_model=128``)."""

_MEMORY_FACTOR = 7
"""Bytes a parameter costs while it trains, in units of its own size: the weight, the copy the state guard
keeps once the optimizer writes it, its gradient, two Adam moments, and two more for activations and the
allocator's slack."""


@dataclass
class Plan:
    """What a sweep is asked to do, checked."""

    factory: Callable[..., nn.Module]
    name: str
    axes: List[Tuple[str, str, List[int]]]
    """``(kind, keyword, sizes)`` per axis."""
    fixed: Dict[str, Any] = field(default_factory=dict)
    """Keywords given to every build."""
    notes: List[str] = field(default_factory=list)


def sweep(factory: Any, width: Optional[Mapping[str, Sequence[int]]] = None,
          depth: Optional[Mapping[str, Sequence[int]]] = None, example_inputs: Any = None,
          optimizer: Optional[Callable[[nn.Module], torch.optim.Optimizer]] = None, steps: int = 3,
          loss: Optional[Callable[[Any, Any], torch.Tensor]] = None, seed: int = 0, device: Optional[str] = None,
          target_width: Optional[int] = None, *, fixed: Optional[Mapping[str, Any]] = None,
          logits: Optional[bool] = None, rule_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
          progress: Optional[Progress] = None) -> "SweepReport":
    """Build the model at each size, take ``steps`` optimizer steps, and judge how its scales move with size.

    - ``factory(**kwargs) -> nn.Module`` builds the model; a Hugging Face config class (``GPT2Config``)
      works too (built with ``AutoModelForCausalLM.from_config``).
    - ``width`` and ``depth`` each map one keyword of the factory to the sizes to try
      (``{"d_model": [64, 128, 256, 512]}``); width sizes are built at the factory's default depth and
      the other way round. ``fixed``: keywords given to every build (``{"vocab_size": 512}``).
    - ``example_inputs``: a tensor, a tuple, a dict of keyword inputs, or a callable ``model -> inputs``;
      inferred as :func:`initlint.audit` does when left out. The same batch is used at every step.
    - ``optimizer``: a callable ``model -> Optimizer`` (default Adam at lr 1e-3).
    - ``loss(output, inputs)``: default the model's own ``.loss``, else cross-entropy against random
      labels for logits (``logits``: None decides from the output and the inputs), else the mean square
      error against a fixed random target.
    - ``target_width``: the width the findings extrapolate to (default 8x the largest width tried).
    - ``rule_options``: options of the sweep rules by code or name (``{"width-unstable": {"limit": 0.4}}``).

    Raises :class:`UsageError` for bad arguments or a factory that rejects a keyword, and
    :class:`LoadError` when no size could be measured; a size that fails (forward error, out of memory)
    is reported in the :class:`SweepReport` and the sweep goes on.
    """
    from .report import SweepReport

    plan = make_plan(factory, width, depth, fixed)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise UsageError(f"steps must be a whole number >= 0, got {steps!r}")
    if target_width is not None and (not isinstance(target_width, int) or target_width < 1):
        raise UsageError(f"target_width must be a positive whole number, got {target_width!r}")
    rules = _rules(rule_options or {})
    total = sum(len(sizes) for _, _, sizes in plan.axes)
    data = SweepData(target_width=target_width)
    started = time.perf_counter()
    restore = _global_state()
    try:
        done = 0
        for kind, keyword, sizes in plan.axes:
            axis = Axis(kind=kind, keyword=keyword, sizes=list(sizes), steps=steps)
            data.axes.append(axis)
            meter = _Meter(axis)
            for size in sizes:
                _measure_size(plan, axis, meter, size, example_inputs, optimizer, steps, loss, seed, device, logits)
                done += 1
                if progress is not None:
                    progress(done, total, f"{keyword}={size}")
            axis.curves = meter.curves()
    finally:
        restore()
    if not any(axis.measured for axis in data.axes):
        reasons = "; ".join(f"{a.keyword}={s}: {why}" for a in data.axes for s, why in a.failed.items())
        raise LoadError(f"no size of {plan.name} could be measured ({reasons})")
    if data.target_width is None and data.axis("width") is not None:
        data.target_width = 8 * max(data.axis("width").measured)
    findings, flagged = [], set()
    for rule, judge in rules:
        for curve, finding in judge(data):
            findings.append(finding)
            flagged.add((rule.axis, curve.layer, curve.quantity))
    return SweepReport(model=plan.name, data=data, findings=findings, flagged=flagged, notes=plan.notes, steps=steps,
                       seconds=time.perf_counter() - started)


# ----------------------------------------------------------------------------- arguments
def make_plan(factory: Any, width: Optional[Mapping[str, Sequence[int]]], depth: Optional[Mapping[str, Sequence[int]]],
              fixed: Optional[Mapping[str, Any]] = None) -> Plan:
    """The factory and the axes, checked: :class:`UsageError` (one sentence) for anything that cannot be swept."""
    axes = [(kind, *_axis(kind, given)) for kind, given in (("width", width), ("depth", depth)) if given is not None]
    if not axes:
        raise UsageError("give width={'keyword': [sizes]} or depth={'keyword': [sizes]} (or both) to sweep")
    if len(axes) == 2 and axes[0][1] == axes[1][1]:
        raise UsageError(f"width and depth both name the keyword '{axes[0][1]}'; name the width's and the depth's own")
    fixed = dict(fixed or {})
    notes: List[str] = []
    config = _config_class(factory)
    if config is not None:
        build, name = _config_factory(config), config.__name__
        defaults = config()
        for keyword in [k for _, k, _ in axes] + list(fixed):
            if not hasattr(defaults, keyword):
                sizes = sorted(k for k, v in vars(defaults).items() if type(v) is int and not k.startswith("_")
                               and not k.endswith("_id"))
                raise UsageError(f"{name} has no field '{keyword}'; its whole-number fields are {', '.join(sizes)}")
        _fit_heads(defaults, axes, fixed, notes)
    elif callable(factory) and not isinstance(factory, nn.Module):
        build, name = factory, getattr(factory, "__name__", type(factory).__name__)
        for keyword in [k for _, k, _ in axes] + list(fixed):
            if not _accepts(factory, keyword):
                raise UsageError(f"{name} takes no keyword '{keyword}' (it takes: {', '.join(_keywords(factory)) or 'none'})")
    else:
        raise UsageError(f"sweep needs a factory that builds the model from keywords (such as a function "
                         f"make_model(d_model=...) or a model class), not {type(factory).__name__}")
    return Plan(factory=build, name=name, axes=axes, fixed=fixed, notes=notes)


def _axis(kind: str, given: Any) -> Tuple[str, List[int]]:
    if not isinstance(given, Mapping) or len(given) != 1:
        raise UsageError(f"{kind} must map one keyword of the factory to its sizes, such as "
                         f"{{'{'d_model' if kind == 'width' else 'n_layer'}': [64, 128, 256]}}")
    (keyword, sizes), = given.items()
    try:
        values = sorted({int(s) for s in sizes})
        if any(int(s) != s for s in sizes):
            raise ValueError
    except (TypeError, ValueError):
        raise UsageError(f"{kind} sizes of '{keyword}' must be whole numbers, got {sizes!r}") from None
    if len(values) < 2 or values[0] < 1:
        raise UsageError(f"{kind} '{keyword}' needs at least two different sizes >= 1 to fit a trend, got {list(sizes)}")
    return str(keyword), values


def _accepts(factory: Any, keyword: str) -> bool:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return True  # a builtin or C extension: the call will tell
    return any(p.kind == p.VAR_KEYWORD for p in params) or any(
        p.name == keyword and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)


def _keywords(factory: Any) -> List[str]:
    try:
        return [p.name for p in inspect.signature(factory).parameters.values()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    except (TypeError, ValueError):
        return []


def _config_class(factory: Any) -> Optional[type]:
    """``factory`` when it is a Hugging Face config class (``GPT2Config``), else None."""
    transformers = sys.modules.get("transformers")
    if transformers is None or not isinstance(factory, type):
        return None
    return factory if issubclass(factory, transformers.PretrainedConfig) else None


def _config_factory(config: type) -> Callable[..., nn.Module]:
    def build(**kwargs: Any) -> nn.Module:
        from transformers import AutoModel, AutoModelForCausalLM

        cfg = config(**kwargs)
        try:
            return AutoModelForCausalLM.from_config(cfg)
        except ValueError:  # not a causal language model (an encoder, a vision model)
            return AutoModel.from_config(cfg)

    build.__name__ = config.__name__
    return build


_HEADS = ("n_head", "num_attention_heads", "num_heads")
_HIDDEN = ("n_embd", "hidden_size", "d_model", "dim", "embed_dim")


def _fit_heads(defaults: Any, axes: List[Tuple[str, str, List[int]]], fixed: Dict[str, Any], notes: List[str]) -> None:
    """A config's default head count must divide every width swept (and a width given with ``fixed``): when it
    does not, the largest head count up to the default that does is given to every build (the heads stay
    fixed, their width grows)."""
    widths = [s for kind, keyword, sizes in axes if kind == "width" and keyword in _HIDDEN for s in sizes]
    widths += [v for k, v in fixed.items() if k in _HIDDEN and isinstance(v, int)]
    heads = next((h for h in _HEADS if isinstance(getattr(defaults, h, None), int)), None)
    if not widths or heads is None or heads in fixed:
        return
    common = math.gcd(*widths)
    default = getattr(defaults, heads)
    if common % default == 0:
        return
    chosen = max(h for h in range(1, default + 1) if common % h == 0)
    fixed[heads] = chosen
    notes.append(f"{heads}={chosen} at every size: the default {default} does not divide every width")


def _rules(options: Mapping[str, Mapping[str, Any]]) -> List[Tuple[Any, Callable[[SweepData], Iterable[Tuple[Curve, Any]]]]]:
    """The sweep rules with the user's options, each with the function that judges a sweep."""
    from ..rules.il005_signal_drift import SignalDrift
    from ..rules.il018_width_unstable import WidthUnstable
    from ..rules.il019_depth_unstable import DepthUnstable

    def given(cls: type) -> Dict[str, Any]:
        return {**options.get(cls.name, {}), **options.get(cls.code, {})}

    known = {c.code for c in (SignalDrift, WidthUnstable, DepthUnstable)} | \
        {c.name for c in (SignalDrift, WidthUnstable, DepthUnstable)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"options given for '{unknown[0]}', which is not a sweep rule "
                         f"({WidthUnstable.code} {WidthUnstable.name}, {DepthUnstable.code} {DepthUnstable.name})")
    for cls in (SignalDrift, WidthUnstable, DepthUnstable):
        for option, value in given(cls).items():
            low, high = cls.option_ranges.get(option, (None, None))
            if isinstance(value, (int, float)) and ((low is not None and value < low) or (high is not None and value > high)):
                raise UsageError(f"{cls.code} ({cls.name}) option {option} must be at least {low}"
                                 f"{'' if high is None else f' and at most {high}'}, not {value}")
    try:
        width, depth = WidthUnstable(**given(WidthUnstable)), DepthUnstable(**given(DepthUnstable))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    drift = given(SignalDrift).get("max-scale-ratio")
    return [(width, width.judge), (depth, lambda data: depth.judge(data, drift))]


# ----------------------------------------------------------------------------- one size
def _measure_size(plan: Plan, axis: Axis, meter: "_Meter", size: int, example_inputs: Any, optimizer: Any,
                  steps: int, loss: Any, seed: int, device: Optional[str], logits: Optional[bool]) -> None:
    """Build, train ``steps`` steps and measure one size; a failure is written into ``axis.failed``."""
    too_big = _too_big(axis, size, device)
    if too_big:
        axis.failed[size] = too_big
        return
    kwargs = {**plan.fixed, axis.keyword: size}
    model = opt = None
    try:
        seed_everything(seed)
        model = _build(plan, kwargs)
        axis.params[size] = sum(p.numel() for p in model.parameters())
        dev = resolve_device(device, model)
        # the guard puts everything back afterwards, should the factory hand out a model someone else holds
        with guarded(model, seed):
            model.to(dev)
            inputs = _inputs(model, example_inputs, seed, dev)
            opt = optimizer(model) if optimizer is not None else torch.optim.Adam(model.parameters(), lr=1e-3)
            recorder = _Recorder(model)
            try:
                rows = recorder.run(model, opt, inputs, steps, loss, seed, logits)
            finally:
                recorder.remove()
        meter.add(size, rows, recorder)
    except UsageError:
        raise
    except (MemoryError, torch.OutOfMemoryError) as exc:
        axis.failed[size] = f"out of memory ({_first_line(exc)})"
    except LoadError as exc:
        axis.failed[size] = str(exc)
    except Exception as exc:  # the user's model failing at this size: reported for the size, the sweep goes on
        axis.failed[size] = _failure(exc)
    finally:
        del model, opt
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def _build(plan: Plan, kwargs: Dict[str, Any]) -> nn.Module:
    try:
        with user_code(f"building {plan.name}"):
            model = plan.factory(**kwargs)
    except TypeError as exc:
        if "unexpected keyword" in str(exc) or "got an unexpected" in str(exc):
            raise UsageError(f"{plan.name} rejected its keywords: {_first_line(exc)}") from None
        raise
    if not isinstance(model, nn.Module):
        raise UsageError(f"{plan.name}({_call(kwargs)}) returned {type(model).__name__}, not an nn.Module")
    return model


def _inputs(model: nn.Module, example: Any, seed: int, device: torch.device) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    if callable(example) and not isinstance(example, torch.Tensor):
        example = example(model)
    args, kwargs = normalise_inputs(example) if example is not None else \
        infer_inputs(model, DEFAULT_BATCH, seed, device)
    return move_inputs(args, device), move_inputs(kwargs, device)


def _too_big(axis: Axis, size: int, device: Optional[str]) -> str:
    """Why ``size`` would not fit in memory, from the parameter counts of the smaller builds ("" if it fits)."""
    known = sorted((s, n) for s, n in axis.params.items() if s < size and n > 0)
    if not known:
        return ""
    if len(known) >= 2:
        (s0, n0), (s1, n1) = known[-2], known[-1]
        power = math.log(n1 / n0) / math.log(s1 / s0) if n1 > n0 else 1.0
    else:
        s1, n1 = known[-1]
        power = 2.0 if axis.kind == "width" else 1.0
    estimate = n1 * (size / s1) ** max(power, 1.0)
    need = estimate * 4 * _MEMORY_FACTOR
    free = _free_bytes(device)
    if free is None or need <= free:
        return ""
    return (f"not built: about {estimate:.3g} parameters (extrapolated from the smaller builds) need about "
            f"{need / 2 ** 30:.1f} GiB to train, and {free / 2 ** 30:.1f} GiB are free")


def _free_bytes(device: Optional[str]) -> Optional[float]:
    if device is not None and str(device).startswith("cuda") and torch.cuda.is_available():
        return float(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _failure(exc: BaseException) -> str:
    text = _first_line(exc)
    if "out of memory" in text.lower() or "can't allocate memory" in text.lower():
        return f"out of memory ({text})"
    return f"{type(exc).__name__}: {text}{user_frame(exc)}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _call(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


# ----------------------------------------------------------------------------- measuring
Row = Dict[Tuple[str, str], float]
"""``(layer, quantity)`` -> the value measured in one forward and backward pass (raw module paths)."""


class _Recorder:
    """Hooks on one model: the output rms of every module holding parameters, the attention logits and the
    residual stream; removed by :meth:`remove`."""

    def __init__(self, model: nn.Module) -> None:
        self.handles: List[Any] = []
        self.sums: Dict[Tuple[str, str], List[Tuple[torch.Tensor, int]]] = {}
        self.stack: List[str] = []
        self.order: List[str] = []
        self.outputs: Dict[str, torch.Tensor] = {}
        self.pooled = pooled_paths(model)
        self.stack_path, last = main_stack(model)
        modules = dict(model.named_modules())
        for path, module in modules.items():
            self.handles.append(module.register_forward_pre_hook(self._enter(path)))
            self.handles.append(module.register_forward_hook(self._leave(path), always_call=True))
            if any(True for _ in module.parameters(recurse=False)):
                self.handles.append(module.register_forward_hook(self._record(path, OUTPUT)))
        self.stream: List[Tuple[torch.Tensor, int]] = []
        if last is not None:  # the stream: the input of a norm after the stack, else the last block's output
            self.handles.append(modules[last].register_forward_hook(
                lambda module, args, output: self._stream(output)))
            for path in final_norms(model, self.stack_path or ""):
                self.handles.append(modules[path].register_forward_pre_hook(lambda module, args: self._stream(args)))
        if not any(True for _ in model.parameters(recurse=False)):  # the model's output, after any multiplier
            self.handles.append(model.register_forward_hook(self._record("", OUTPUT)))
        self.readout: Optional[str] = None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def _enter(self, path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            self.stack.append(path)
        return hook

    def _leave(self, path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.stack and self.stack[-1] == path:
                self.stack.pop()
        return hook

    def _record(self, path: str, quantity: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            t = next((t for t in nested.tensors(output) if t.is_floating_point()), None)
            if t is None or t.numel() == 0:
                return
            if quantity == OUTPUT:
                if path not in self.outputs:
                    self.order.append(path)
                self.outputs[path] = t
            self.add(path, quantity, t)
        return hook

    def _stream(self, value: Any) -> None:
        t = next((t for t in nested.tensors(value) if t.is_floating_point()), None)
        if t is not None and t.numel():
            with torch.no_grad():
                self.stream.append((t.detach().float().pow(2).sum(), t.numel()))

    def add(self, path: str, quantity: str, t: torch.Tensor) -> None:
        with torch.no_grad():
            self.sums.setdefault((path, quantity), []).append((t.detach().float().pow(2).sum(), t.numel()))

    def logits(self, scores: torch.Tensor) -> None:
        """Attention scores seen by :class:`_Scores`, put on the innermost running module."""
        with torch.no_grad():
            kept = scores.detach().float()
            kept = kept[torch.isfinite(kept) & (kept > -1e4)]  # masked positions are -inf or a large negative
        if kept.numel():
            self.add(self.stack[-1] if self.stack else "", LOGITS, kept)

    def run(self, model: nn.Module, opt: torch.optim.Optimizer, inputs: Tuple[Tuple[Any, ...], Dict[str, Any]],
            steps: int, loss: Any, seed: int, logits: Optional[bool]) -> List[Row]:
        """``steps + 1`` forward and backward passes, an optimizer step between two; one row per pass."""
        args, kwargs = inputs
        rows: List[Row] = []
        torch.manual_seed(seed)  # the same dropout masks at every size
        for step in range(steps + 1):
            opt.zero_grad(set_to_none=True)
            self.sums.clear()
            self.outputs.clear()
            self.stack.clear()
            self.stream.clear()
            with _Scores(self):
                out = model(*args, **kwargs)
            value = loss_of(out, args, kwargs, loss, seed, logits)
            if step == 0:
                self.readout = readout_of(out, {p: t for p, t in self.outputs.items() if p})
                if self.readout is None and "" in self.outputs:
                    self.readout = ""  # no layer's output is the model's: the output is its own curve
            value.backward()
            row = self._row()
            if self.readout:
                row.pop(("", OUTPUT), None)  # the same values as the readout layer's
            grad = self._input_grad(model)
            if grad is not None:
                row[(self.order[0], INPUT_GRAD)] = grad
            rows.append(row)
            if step < steps:
                opt.step()
        return rows

    def _row(self) -> Row:
        if self.stream:  # the last point of the stream the forward passed (the final norm's input)
            self.sums[(self.stack_path or "", STREAM)] = [self.stream[-1]]
        keys = list(self.sums)
        if not keys:
            return {}
        totals = torch.stack([torch.stack([s for s, _ in self.sums[k]]).sum() for k in keys]).double().tolist()
        counts = [sum(n for _, n in self.sums[k]) for k in keys]
        return {k: math.sqrt(t / n) for k, t, n in zip(keys, totals, counts)}

    def _input_grad(self, model: nn.Module) -> Optional[float]:
        if not self.order:
            return None
        module = model.get_submodule(self.order[0])
        grads = [p.grad.detach().float().pow(2).sum() for p in module.parameters(recurse=False) if p.grad is not None]
        return math.sqrt(float(torch.stack(grads).sum())) if grads else None


class _Scores(TorchFunctionMode):
    """Sees each attention computation: ``scaled_dot_product_attention`` (its scores are recomputed as
    ``q @ k^T * scale``) and softmax over square score matrices ``[..., T, T]`` (the explicit form)."""

    _SOFTMAX = (F.softmax, torch.softmax, torch.Tensor.softmax)

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and len(args) >= 2:
            q, k = args[0], args[1]
            scale = kwargs.get("scale")
            scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
            with torch.no_grad():
                if q.dim() >= 3 and k.dim() == q.dim() and k.size(-3) != q.size(-3) and q.size(-3) % k.size(-3) == 0:
                    k = k.repeat_interleave(q.size(-3) // k.size(-3), dim=-3)  # grouped-query attention
                self.recorder.logits(q @ k.transpose(-2, -1) * scale)
        elif func is F.multi_head_attention_forward:  # its own softmax runs with this mode switched off
            with torch.no_grad():
                scores = _mha_scores(*args, **kwargs)
            if scores is not None:
                self.recorder.logits(scores)
        elif func in self._SOFTMAX and args and isinstance(args[0], torch.Tensor):
            x = args[0]
            if x.dim() >= 3 and x.size(-1) == x.size(-2) > 1:
                self.recorder.logits(x)
        return func(*args, **kwargs)


def _mha_scores(query: torch.Tensor, key: torch.Tensor, value: Any, embed_dim: int, num_heads: int,
                in_proj_weight: Optional[torch.Tensor], in_proj_bias: Optional[torch.Tensor], *args: Any,
                use_separate_proj_weight: bool = False, q_proj_weight: Optional[torch.Tensor] = None,
                k_proj_weight: Optional[torch.Tensor] = None, **kwargs: Any) -> Optional[torch.Tensor]:
    """The scores ``q . k / sqrt(head_dim)`` of ``F.multi_head_attention_forward`` (inputs ``(L, N, E)`` or ``(L, E)``)."""
    if use_separate_proj_weight:
        if q_proj_weight is None or k_proj_weight is None:
            return None
        wq, wk = q_proj_weight, k_proj_weight
    elif in_proj_weight is not None:
        wq, wk = in_proj_weight[:embed_dim], in_proj_weight[embed_dim:2 * embed_dim]
    else:
        return None
    bq, bk = (in_proj_bias[:embed_dim], in_proj_bias[embed_dim:2 * embed_dim]) if in_proj_bias is not None \
        else (None, None)
    q, k = F.linear(query, wq, bq), F.linear(key, wk, bk)
    if q.dim() == 2:
        q, k = q.unsqueeze(1), k.unsqueeze(1)
    head = q.size(-1) // num_heads
    q = q.reshape(q.size(0), q.size(1), num_heads, head).permute(1, 2, 0, 3)
    k = k.reshape(k.size(0), k.size(1), num_heads, head).permute(1, 2, 0, 3)
    return q @ k.transpose(-2, -1) / math.sqrt(head)


def loss_of(out: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], loss: Any, seed: int,
            logits: Optional[bool]) -> torch.Tensor:
    """The scalar to backpropagate: the user's ``loss(output, inputs)``, else the model's own ``.loss``,
    else cross-entropy against random labels for logits, else the mean square error against a random target."""
    if loss is not None:
        inputs = kwargs if not args else (args[0] if len(args) == 1 and not kwargs else (args, kwargs))
        value = loss(out, inputs)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise UsageError(f"loss(output, inputs) must return a scalar tensor, got {type(value).__name__}")
        return value.reshape(())
    own = _field(out, "loss")
    if isinstance(own, torch.Tensor) and own.numel() == 1 and own.requires_grad:
        return own.reshape(())
    named = _field(out, "logits")
    y = named if isinstance(named, torch.Tensor) else next(
        (t for t in nested.tensors(out) if t.is_floating_point() and t.requires_grad), None)
    if y is None:
        raise LoadError(f"the model's output ({type(out).__name__}) holds no floating-point tensor to compute a loss "
                        f"from; pass loss=...")
    is_logits = logits if logits is not None else (isinstance(named, torch.Tensor) or _token_inputs(args, kwargs))
    gen = torch.Generator().manual_seed(seed + 1)
    if is_logits and y.dim() >= 2 and y.size(-1) > 1:
        labels = torch.randint(0, y.size(-1), y.shape[:-1], generator=gen).to(y.device)
        return F.cross_entropy(y.reshape(-1, y.size(-1)).float(), labels.reshape(-1))
    target = torch.randn(y.shape, generator=gen).to(y.device)
    return F.mse_loss(y.float(), target)


def _field(out: Any, name: str) -> Any:
    if isinstance(out, Mapping):
        return out.get(name)
    return getattr(out, name, None) if not isinstance(out, torch.Tensor) else None


def _token_inputs(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    """Whether the model reads token ids (an integer tensor among its inputs): its output is then logits."""
    return any(not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool
               for t in nested.tensors((args, kwargs)))


def readout_of(out: Any, outputs: Dict[str, torch.Tensor]) -> Optional[str]:
    """The module whose output is the model's output (its logits, or its first tensor)."""
    named = _field(out, "logits")
    y = named if isinstance(named, torch.Tensor) else next(iter(nested.tensors(out)), None)
    if y is None:
        return None
    return next((path for path, t in outputs.items() if t is y), None) or next(
        (path for path, t in outputs.items() if t.shape == y.shape and t.data_ptr() == y.data_ptr()), None)


# ----------------------------------------------------------------------------- layers across sizes
_NUMBER = re.compile(r"^\d+$")


def pooled_paths(model: nn.Module) -> Dict[str, str]:
    """Module path -> its path with the numbers of blocks replaced by ``{i}``: ``transformer.h.3.mlp.c_fc``
    -> ``transformer.h.{i}.mlp.c_fc``. Numbered single layers (``net.2`` in a Sequential of Linear and ReLU)
    and one-off modules in a Sequential keep their number: they differ in role."""
    blocks = {f"{path}.{name}" if path else name
              for path, module in model.named_modules() for name in _blocks(module)}
    out = {}
    for path in dict(model.named_modules()):
        parts = path.split(".") if path else []
        out[path] = ".".join("{i}" if ".".join(parts[:i + 1]) in blocks else part for i, part in enumerate(parts))
    return out


def _blocks(container: nn.Module) -> List[str]:
    """The names of ``container``'s numbered children that are blocks of a stack: modules holding modules, in a
    ModuleList of one class, or next to another numbered child of the same class (a Sequential of blocks, the
    attention and feed-forward blocks alternating in one list)."""
    if not isinstance(container, (nn.ModuleList, nn.Sequential)):
        return []
    numbered = [(name, child) for name, child in container.named_children()
                if _NUMBER.match(name) and any(True for _ in child.children())]
    kinds = [type(child) for _, child in numbered]
    stack = isinstance(container, nn.ModuleList) and len(set(kinds)) == 1  # a stack of one block is still a stack
    return [name for name, child in numbered if stack or kinds.count(type(child)) > 1]


def main_stack(model: nn.Module) -> Tuple[Optional[str], Optional[str]]:
    """The model's main stack of blocks (the container with the most blocks, :func:`_blocks`) and its last
    block's path; ``(None, None)`` when it has none."""
    best: Tuple[int, Optional[str], Optional[str]] = (0, None, None)
    for path, module in model.named_modules():
        names = _blocks(module)
        if len(names) > best[0]:
            best = (len(names), path, f"{path}.{names[-1]}" if path else names[-1])
    return best[1], best[2]


def final_norms(model: nn.Module, stack: str) -> List[str]:
    """Normalisation modules outside the blocks of the main stack ``stack`` (LayerNorm, RMSNorm and the like,
    by class name): the one that runs after the stack (a pre-norm transformer's final norm) reads the stream."""
    pooled = pooled_paths(model)
    return [path for path, module in model.named_modules()
            if path and "norm" in type(module).__name__.lower() and "{i}" not in pooled[path]
            and not (path == stack or path.startswith(stack + "."))]


class _Meter:
    """The rows of every size of one axis, pooled by role and gathered into curves."""

    def __init__(self, axis: Axis) -> None:
        self.axis = axis
        self.by_size: Dict[int, List[Dict[Tuple[str, str], float]]] = {}

    def add(self, size: int, rows: List[Row], recorder: _Recorder) -> None:
        pooled_rows = []
        for row in rows:
            groups: Dict[Tuple[str, str], List[float]] = {}
            for (path, quantity), value in row.items():
                layer = path if quantity == STREAM else recorder.pooled.get(path, path)
                groups.setdefault((layer, quantity), []).append(value)
            pooled_rows.append({k: sum(v) / len(v) for k, v in groups.items()})
        self.by_size[size] = pooled_rows
        if self.axis.readout is None and recorder.readout is not None:
            self.axis.readout = recorder.pooled.get(recorder.readout, recorder.readout)
        if self.axis.input_layer is None and recorder.order:
            self.axis.input_layer = recorder.pooled.get(recorder.order[0], recorder.order[0])

    def curves(self) -> Dict[Tuple[str, str], Curve]:
        keys: List[Tuple[str, str]] = []
        for rows in self.by_size.values():
            for key in rows[0] if rows else {}:
                if key not in keys:
                    keys.append(key)
        sizes = self.axis.sizes
        out = {}
        for key in keys:
            values = [[self.by_size[s][step].get(key) if s in self.by_size else None for s in sizes]
                      for step in range(self.axis.steps + 1)]
            out[key] = Curve(layer=key[0], quantity=key[1], sizes=list(sizes), values=values)
        return out
