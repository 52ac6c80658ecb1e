"""The first step: one real step of the user's optimizer, taken on a private copy.

``initlint.audit(model, x, optimizer=...)`` hands the probe a :class:`StepRequest`. The backward
probe then differentiates the training loss (:func:`objective`) with respect to every parameter
that requires grad, and :func:`first_step` builds a fresh optimizer of the user's class with the
user's param groups (every hyperparameter as it is) and a deep copy of its state, over clones of
the parameters, gives the clones those gradients and calls ``step()`` once. The user's model,
parameters, ``.grad``, optimizer (``state_dict()``) and RNG states are not touched: the optimizer
is only read (``optimizer.state.get``, never ``optimizer.state[p]``, which would insert an entry).

The result is a typed :class:`StepStats`: per parameter the rms of the update and of the weight
and their ratio, per param group its lr, weight decay, size and median ratio, and the membership
facts IL016 reads (parameters no group holds, held twice, frozen ones held, held ones the model
no longer has).
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from ..errors import UsageError
from . import draw

HALF = (torch.float16, torch.bfloat16)


@dataclass
class ParamStep:
    """One parameter's first update."""

    name: str
    group: int
    """Index of the param group that holds it."""
    lr: Optional[float]
    update_rms: float
    weight_rms: float
    ratio: Optional[float]
    """``update_rms / weight_rms`` (None for a weight of rms 0: see IL015 for its reference scale)."""
    shape: Tuple[int, ...] = ()
    dtype: str = "float32"
    sampled: int = 0
    """Elements stepped, when the optimizer is elementwise and the tensor larger than
    :data:`SAMPLE` (the update's rms is estimated from them); 0: every element."""
    lost: float = 0.0
    """Stored in float16/bfloat16: the share of the elements with a nonzero gradient whose (nonzero) float32
    update leaves the stored value unchanged (the update is below half a unit in the last place); 0 for float32.
    Elements without a gradient (rows the batch does not use) move by weight decay alone and are not counted."""


@dataclass
class GroupStep:
    """One param group of the optimizer."""

    index: int
    lr: Optional[float]
    weight_decay: Optional[float]
    tensors: int
    """Parameters of the model it holds."""
    elements: int
    median_ratio: Optional[float]
    """Median update ratio over its weight tensors (ndim >= 2) of nonzero rms; None when it has none."""


@dataclass
class StepStats:
    """What one step of the user's optimizer does to the model (see :func:`first_step`)."""

    optimizer: str
    """The optimizer's class name."""
    loss: str
    """Which loss gave the gradients: ``loss(output, inputs)``, ``the model's loss``,
    ``cross-entropy against random labels`` or ``the probe's random direction`` (as a loss averaged over the
    output's elements: the gradients are the backward probe's divided by the output's size)."""
    params: Dict[str, ParamStep] = field(default_factory=dict)
    groups: List[GroupStep] = field(default_factory=list)
    unheld: Dict[str, float] = field(default_factory=dict)
    """Parameters that require grad and get a nonzero gradient but no param group holds: name -> gradient rms."""
    doubly_held: Dict[str, List[int]] = field(default_factory=dict)
    """Parameters held more than once: name -> the indexes of the groups holding it (a group repeated)."""
    frozen_held: Dict[str, int] = field(default_factory=dict)
    """Parameters with ``requires_grad=False`` a group holds: name -> group index."""
    stale: List[Tuple[int, Tuple[int, ...]]] = field(default_factory=list)
    """Tensors a group holds that are not parameters of the model: (group index, shape)."""
    unused: List[str] = field(default_factory=list)
    """Parameters that require grad and that the loss does not reach (their gradient is None)."""
    grads_taken: bool = False
    """The backward probe took the loss's gradients of every parameter that requires grad."""
    stepped: bool = False
    """False when the step could not be taken (the notes say why); the membership facts still hold."""
    clipping: str = ""
    """How the gradients were clipped before the step, as training clips them (empty: not clipped)."""
    clip_factor: Optional[float] = 1.0
    """The factor norm clipping scaled the gradients by (1: not scaled); None where each element was clamped
    (``clip_grad_value_``), which no one factor describes."""
    batches_per_step: int = 1
    """The run's step averages the gradients of this many batches like the probe's (its global batch over the
    probe's batch; in the training callbacks, gradient accumulation steps x data-parallel ranks)."""
    linear: bool = False
    """The step is proportional to the gradient (``torch.optim.SGD``, ``ASGD``): its size on one batch includes that
    batch's gradient noise, ``sqrt(batches_per_step)`` times the noise of the run's step on the mean of its batches."""
    notes: List[str] = field(default_factory=list)

    def lines(self) -> List[str]:
        """The text report's lines: the optimizer and loss, then one line per param group."""
        batches = f"; the run steps on the mean of {self.batches_per_step} such batches"
        out = [f"first step: {self.optimizer}, gradients of {self.loss}" + (f", {self.clipping}" if self.clipping else "")
               + (batches if self.batches_per_step > 1 else "") + ("" if self.stepped else " (not taken)")]
        for g in self.groups:
            out.append(f"param group {g.index}: lr {_short(g.lr)}, weight decay {_short(g.weight_decay)}, {g.tensors} "
                       f"tensors ({g.elements:,} parameters), median update ratio {_short(g.median_ratio)}")
        return out

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready form."""
        from dataclasses import asdict

        return asdict(self)


@dataclass
class StepRequest:
    """What the probe needs for the first step: the user's optimizer (read only), the loss, the names."""

    optimizer: torch.optim.Optimizer
    names: Dict[int, str]
    """``id(parameter of the user's model)`` -> its qualified name."""
    loss: Optional[Callable[[Any, Any], Any]] = None
    seed: int = 0
    clip_norm: Optional[float] = None
    """Training clips the gradients' total norm to this (``torch.nn.utils.clip_grad_norm_``) before each step."""
    clip_value: Optional[float] = None
    """Training clamps every gradient element to ``[-clip_value, clip_value]`` (``clip_grad_value_``)."""
    batches_per_step: int = 1
    """The run's step averages the gradients of this many batches like the probe's."""
    grads: Dict[str, Optional[torch.Tensor]] = field(default_factory=dict)
    """Filled by the backward probe: every parameter that requires grad -> its gradient (None: unreached)."""
    loss_kind: str = ""
    ran: bool = False
    """The backward probe took the gradients."""


# ----------------------------------------------------------------------------- the user's optimizer
def resolve_optimizer(optimizer: Any, model: nn.Module) -> Optional[torch.optim.Optimizer]:
    """The optimizer to audit with: ``optimizer`` itself, or what the callable returns for ``model``.

    :class:`UsageError` (one sentence) for anything else, for a callable that raises, for an optimizer
    that holds none of the model's parameters and for a non-finite or negative lr."""
    if optimizer is None:
        return None
    given = optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        if not callable(optimizer) or isinstance(optimizer, (type, nn.Module)):
            raise UsageError(f"optimizer must be a torch.optim.Optimizer over the model's parameters or a callable "
                             f"model -> Optimizer, not {type(given).__name__}")
        try:
            with torch.random.fork_rng(devices=[]):  # a callable that builds a module draws from the RNG
                optimizer = optimizer(model)
        except UsageError:
            raise
        except Exception as exc:  # the user's code may fail in any way
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise UsageError(f"optimizer(model) raised {type(exc).__name__}{': ' + first if first else ''}") from None
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise UsageError(f"optimizer(model) returned {type(optimizer).__name__}, not a torch.optim.Optimizer")
    own = {id(p) for p in model.parameters()}
    if not any(id(p) in own for g in optimizer.param_groups for p in g["params"]):
        raise UsageError(f"the optimizer ({type(optimizer).__name__}) holds none of the model's parameters; build it "
                         f"over model.parameters()")
    for i, group in enumerate(optimizer.param_groups):
        lr = real_number(group.get("lr"))
        if lr is not None and not (math.isfinite(lr) and lr >= 0):
            raise UsageError(f"the optimizer's param group {i} has lr {lr}; it must be a finite number of at least 0")
    return optimizer


def request_for(optimizer: torch.optim.Optimizer, model: nn.Module, loss: Any, seed: int,
                clip_grad_norm: Optional[float] = None, clip_grad_value: Optional[float] = None,
                batches_per_step: int = 1) -> StepRequest:
    """The probe's request for ``optimizer`` over the user's ``model``."""
    if loss is not None and not callable(loss):
        raise UsageError(f"loss must be a callable (output, inputs) -> scalar tensor, not {type(loss).__name__}")
    names: Dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)
    return StepRequest(optimizer=optimizer, names=names, loss=loss, seed=seed, clip_norm=clip_grad_norm,
                       clip_value=clip_grad_value, batches_per_step=batches_per_step)


def check_clipping(clip_grad_norm: Any, clip_grad_value: Any) -> Tuple[Optional[float], Optional[float]]:
    """The gradient clipping training uses, as numbers: each a finite number above 0, or None; not both.
    :class:`UsageError` (one sentence) otherwise."""
    out: List[Optional[float]] = []
    for name, value in (("clip_grad_norm", clip_grad_norm), ("clip_grad_value", clip_grad_value)):
        if value is None:
            out.append(None)
            continue
        number = real_number(value)
        if number is None or not (math.isfinite(number) and number > 0):
            raise UsageError(f"{name} must be a finite number above 0 (the clipping training uses), not {shown(value)}")
        out.append(number)
    if out[0] is not None and out[1] is not None:
        raise UsageError("clip_grad_norm= and clip_grad_value= were both given; training clips one way: give one")
    return out[0], out[1]


# ----------------------------------------------------------------------------- the loss
def objective(request: StepRequest, out: Any, main: Optional[torch.Tensor], logits: Optional[torch.Tensor],
              args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[torch.Tensor]:
    """The scalar the backward probe differentiates for the step: the user's loss, else the model's own
    ``.loss``, else cross-entropy against seeded random labels when the output is logits, else None (the
    probe's random direction). Sets ``request.loss_kind``."""
    if request.loss is not None:
        inputs = as_given(args, kwargs)
        try:
            value = request.loss(out, inputs)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise UsageError(f"loss(output, inputs) raised {type(exc).__name__}{': ' + first if first else ''}") from None
        if not (isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point()):
            raise UsageError(f"loss(output, inputs) must return a scalar floating-point tensor, not "
                             f"{type(value).__name__}{tuple(value.shape) if isinstance(value, torch.Tensor) else ''}")
        request.loss_kind = "loss(output, inputs)"
        return value.reshape(())
    own = _model_loss(out)
    if own is not None:
        request.loss_kind = "the model's loss"
        return own
    if logits is not None and logits.dim() >= 2 and logits.shape[-1] >= 2:
        rows = logits.reshape(-1, logits.shape[-1])
        labels = draw.randint(rows.shape[-1], (rows.shape[0],), draw.generator(rows.device, request.seed), rows.device)
        request.loss_kind = "cross-entropy against random labels"
        return torch.nn.functional.cross_entropy(rows.float(), labels)
    request.loss_kind = "the probe's random direction"
    return None


def as_given(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """The example inputs in the form ``audit`` took them: a tensor, a dict of keyword inputs, or a tuple."""
    if kwargs and not args:
        return kwargs
    if len(args) == 1 and not kwargs:
        return args[0]
    return (args, kwargs) if kwargs else args


def _model_loss(out: Any) -> Optional[torch.Tensor]:
    value = getattr(out, "loss", None)
    if value is None and isinstance(out, dict):
        value = out.get("loss")
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.requires_grad:
        return value.reshape(())
    return None


# ----------------------------------------------------------------------------- the step
def first_step(request: StepRequest, model: nn.Module) -> StepStats:
    """Take the first step on a private copy and measure it (``model``: the audited copy, whose
    parameters have the user's names and values)."""
    opt = request.optimizer
    named = dict(model.named_parameters())
    stats = StepStats(optimizer=type(opt).__name__, loss=request.loss_kind or "the probe's random direction",
                      batches_per_step=request.batches_per_step,
                      linear=isinstance(opt, (torch.optim.SGD, torch.optim.ASGD)))
    held: Dict[str, List[int]] = {}
    for gi, group in enumerate(opt.param_groups):
        for p in group["params"]:
            name = request.names.get(id(p))
            if name is None or name not in named:
                stats.stale.append((gi, tuple(p.shape)))
            else:
                held.setdefault(name, []).append(gi)
    stats.doubly_held = {n: g for n, g in held.items() if len(g) > 1}
    stats.frozen_held = {n: g[0] for n, g in held.items() if not named[n].requires_grad}
    grads = request.grads
    stats.grads_taken = request.ran
    stats.unused = [n for n, p in named.items() if p.requires_grad and request.ran and grads.get(n) is None]
    unheld = [n for n, p in named.items() if p.requires_grad and n not in held and grads.get(n) is not None]
    if unheld:
        norms = _host([torch.linalg.vector_norm(grads[n].detach().float()) / math.sqrt(max(grads[n].numel(), 1))
                       for n in unheld])
        stats.unheld = {n: v for n, v in zip(unheld, norms) if v != 0}
    if not request.ran:
        stats.notes.append("the first step was not taken: the backward probe did not run")
        _groups(stats, opt, held, named)
        return stats
    try:
        _step(request, stats, held, named)
    except UsageError:
        raise
    except Exception as exc:  # a third-party optimizer that cannot be copied or stepped this way
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        stats.notes.append(f"the first step of {stats.optimizer} could not be taken on a copy ({type(exc).__name__}: "
                           f"{first}); the rules that read the step did not run")
        stats.params = {}
    _groups(stats, opt, held, named)
    if stats.params and all(g.lr == 0 for g in stats.groups if g.tensors):
        stats.notes.append(f"every param group of {stats.optimizer} that holds the model's parameters has lr 0 (as at "
                           f"the start of a warm-up): the first step moves no weight, and the update-scale rule had "
                           f"nothing to judge; pass the optimizer at the learning rate it will train at")
    return stats


ELEMENTWISE = ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam", "ASGD", "Rprop", "Adadelta")
"""``torch.optim`` classes whose step updates each element from that element's parameter, gradient and
state alone: stepping a sample of the elements gives exactly the full step's update at those elements."""
SAMPLE = 16384
"""Elements stepped per tensor of an :data:`ELEMENTWISE` optimizer (all of a smaller tensor): the update's
rms is estimated from them (relative error about ``1/sqrt(2 * SAMPLE)`` = 0.6% for Adam's first step,
whose entries are +-lr), the weight's rms is taken exactly over the whole tensor."""


@dataclass
class _Clone:
    name: str
    group: int
    tensor: torch.Tensor
    """What the private optimizer steps: a copy of the parameter, or of a sample of its elements (float32
    for a half parameter)."""
    before: torch.Tensor
    dtype: torch.dtype
    shape: Tuple[int, ...]
    weight_norm: torch.Tensor
    """Norm of the whole parameter (float32)."""
    numel: int


def sampled(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt``'s step may be taken on a sample of each tensor's elements (see :data:`ELEMENTWISE`)."""
    cls = type(opt)
    return cls.__module__.startswith("torch.optim") and cls.__name__ in ELEMENTWISE


def _clipped(request: StepRequest, stats: StepStats) -> Callable[[torch.Tensor], torch.Tensor]:
    """The gradients as training's clipping leaves them: the total norm over every gradient the backward probe
    took (as ``clip_grad_norm_(model.parameters(), max_norm)`` takes it) scaled down to ``clip_norm``, or every
    element clamped to ``clip_value``; said in ``stats.clipping``."""
    if request.clip_value is not None:
        value = request.clip_value
        stats.clipping = f"clamped to +-{_short(value)} (clip_grad_value_)"
        stats.clip_factor = None
        return lambda g: g.clamp(-value, value)
    if request.clip_norm is None:
        return lambda g: g
    grads = [g.detach() for g in request.grads.values() if g is not None]
    norms = [torch.linalg.vector_norm(g, dtype=torch.float32).to(grads[0].device) for g in grads]
    total = _host([torch.linalg.vector_norm(torch.stack(norms))])[0] if norms else 0.0
    factor = min(1.0, request.clip_norm / (total + 1e-6))  # clip_grad_norm_'s own formula
    stats.clip_factor = factor
    stats.clipping = (f"clipped to norm {_short(request.clip_norm)} (their total norm {_short(total)}: "
                      + (f"scaled by {_short(factor)})" if factor < 1 else "not scaled)"))
    return (lambda g: g * factor) if factor < 1 else (lambda g: g)


def _step(request: StepRequest, stats: StepStats, held: Dict[str, List[int]], named: Dict[str, nn.Parameter]) -> None:
    opt = request.optimizer
    sample = SAMPLE if sampled(opt) else None
    clip = _clipped(request, stats)
    gens: Dict[torch.device, Optional[torch.Generator]] = {}  # one stream per device, as the parameters come
    groups: List[Dict[str, Any]] = []
    clones: List[_Clone] = []
    state: Dict[torch.Tensor, Dict[str, Any]] = {}
    seen = set()
    for gi, group in enumerate(opt.param_groups):
        params = []
        for p in group["params"]:
            name = request.names.get(id(p))
            if name is None or name not in named or name in seen:
                continue  # a stale tensor, or one held twice: stepped once, in its first group
            seen.add(name)
            source = named[name].detach()
            gen = gens.get(source.device)
            if source.device not in gens:
                gen = gens[source.device] = draw.generator(source.device, request.seed)
            pick = _picker(source, sample, gen)
            clone = pick(source).to(torch.float32 if source.dtype in HALF else source.dtype, copy=True)
            grad = request.grads.get(name)
            clone.grad = None if grad is None or not named[name].requires_grad else \
                clip(pick(grad.detach()).to(clone.dtype))
            saved = opt.state.get(p)  # .get: indexing the defaultdict would add an entry to the user's state
            if saved:
                state[clone] = _private_state(saved, clone, source.shape, pick)
            params.append(clone)
            clones.append(_Clone(name, gi, clone, clone.detach().clone(), source.dtype, tuple(source.shape),
                                 torch.linalg.vector_norm(source, dtype=torch.float32), source.numel()))
        groups.append({**{k: _private_value(v) for k, v in group.items() if k != "params"}, "params": params})
    fresh = _fresh(type(opt), groups, opt.defaults)
    for clone, s in state.items():
        fresh.state[clone] = s
    devices = sorted({c.tensor.device.index or 0 for c in clones if c.tensor.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices), torch.no_grad(), _without_global_step_hooks():
        fresh.step()
    _measure(stats, clones, opt)
    stats.stepped = True


@contextlib.contextmanager
def _without_global_step_hooks() -> Iterator[None]:
    """The private step runs no hook registered for every optimizer (``register_optimizer_step_pre_hook`` and
    ``_post_hook``: a user's logging or a framework's bookkeeping); they are put back, in order, after it."""
    from torch.optim import optimizer as module

    tables = [t for t in (getattr(module, "_global_optimizer_pre_hooks", None),
                          getattr(module, "_global_optimizer_post_hooks", None)) if isinstance(t, dict)]
    saved = [dict(t) for t in tables]
    for t in tables:
        t.clear()
    try:
        yield
    finally:
        for t, kept in zip(tables, saved):
            added = dict(t)  # registered during the step (none expected): kept after the user's
            t.clear()
            t.update(kept)
            t.update(added)


def _picker(source: torch.Tensor, sample: Optional[int],
            gen: Optional[torch.Generator]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The elements stepped of a tensor shaped like ``source``: all of them, or ``sample`` drawn at random
    (seeded; the same positions for the parameter, its gradient and its state)."""
    if sample is None or source.numel() <= sample:
        return lambda t: t
    index = draw.randint(source.numel(), (sample,), gen, source.device)
    return lambda t: t.reshape(-1)[index]


def _fresh(cls: type, groups: List[Dict[str, Any]], defaults: Dict[str, Any]) -> torch.optim.Optimizer:
    """A new optimizer of the user's class over the clones: the groups carry every hyperparameter; the
    constructor also gets the defaults it accepts (a class may require some)."""
    try:
        signature = inspect.signature(cls.__init__)
        takes_any = any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())
        kwargs = {k: v for k, v in defaults.items() if takes_any or k in signature.parameters}
    except (TypeError, ValueError):
        kwargs = {}
    return cls(groups, **{k: _private_value(v) for k, v in kwargs.items()})


def _private_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    try:
        return copy.deepcopy(value)
    except Exception:  # an object that cannot be copied is only read by the step
        return value


def _private_state(saved: Dict[str, Any], clone: torch.Tensor, shape: torch.Size,
                   pick: Callable[[torch.Tensor], torch.Tensor]) -> Dict[str, Any]:
    """A deep copy of one parameter's state; tensors shaped like the parameter are taken at the stepped
    elements and follow the clone's device and (float32, for a half parameter) dtype."""
    out: Dict[str, Any] = {}
    for key, value in saved.items():
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if value.shape == shape and value.is_floating_point():
                value = pick(value).to(clone.device, clone.dtype, copy=True)
            else:
                value = value.clone() if value.numel() <= 1 else value.to(clone.device, copy=True)
        else:
            value = _private_value(value)
        out[key] = value
    return out


def _measure(stats: StepStats, clones: List[_Clone], opt: torch.optim.Optimizer) -> None:
    """rms of each update (over the stepped elements) and weight (whole), one host transfer for all; the
    lost share of half parameters."""
    values: List[torch.Tensor] = []
    for c in clones:
        update = c.tensor.detach() - c.before
        values.append(torch.linalg.vector_norm(update, dtype=torch.float32) / math.sqrt(max(update.numel(), 1)))
        values.append(c.weight_norm.to(update.device) / math.sqrt(max(c.numel, 1)))
        if c.dtype in HALF:
            # the elements the gradient moves: an element without one (an embedding row the batch does not use)
            # moves by its weight decay alone, a slow pull whose rounding is not the gradient's step lost
            grad = c.tensor.grad
            moved = (update != 0) if grad is None else (update != 0) & (grad != 0)
            kept = (c.before + update).to(c.dtype) == c.before.to(c.dtype)
            values.append((moved & kept).sum().float() / moved.sum().clamp_min(1).float())
        else:
            values.append(torch.zeros((), device=update.device))
    host = _host(values)
    for i, c in enumerate(clones):
        upd, w, lost = host[3 * i: 3 * i + 3]
        lr = real_number(opt.param_groups[c.group].get("lr"))
        stats.params[c.name] = ParamStep(name=c.name, group=c.group, lr=lr,
                                         update_rms=upd, weight_rms=w, ratio=upd / w if w > 0 else None,
                                         shape=c.shape, dtype=str(c.dtype).replace("torch.", ""), lost=lost,
                                         sampled=c.tensor.numel() if c.tensor.numel() < c.numel else 0)


def _groups(stats: StepStats, opt: torch.optim.Optimizer, held: Dict[str, List[int]],
            named: Dict[str, nn.Parameter]) -> None:
    for gi, group in enumerate(opt.param_groups):
        names = [n for n, g in held.items() if g[0] == gi]
        ratios = [s.ratio for s in (stats.params.get(n) for n in names)
                  if s is not None and s.ratio is not None and len(s.shape) >= 2]
        stats.groups.append(GroupStep(index=gi, lr=real_number(group.get("lr")),
                                      weight_decay=real_number(group.get("weight_decay")), tensors=len(names), elements=sum(named[n].numel() for n in names),
                                      median_ratio=statistics.median(ratios) if ratios else None))


def _short(x: Optional[float]) -> str:
    if x is None:
        return "n/a"
    return "0" if x == 0 else f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2g}"


def real_number(value: Any) -> Optional[float]:
    """A real number given as a Python, NumPy or one-element tensor number, as a float (NaN stays NaN; ``inf``
    past float's range); None for anything else (a bool, a string, a sequence)."""
    import numbers

    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        return None
    if isinstance(value, torch.Tensor):
        return float(value) if value.numel() == 1 and not value.is_complex() else None
    if not isinstance(value, numbers.Real) or type(value).__name__ == "bool_":
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def whole_number(value: Any) -> Optional[int]:
    """A whole number of at least 1 given as a Python, NumPy or one-element tensor number (:func:`real_number`), as
    an int; None for anything else."""
    number = real_number(value)
    if number is None or not math.isfinite(number) or number < 1 or number != int(number):
        return None
    return int(number)


def shown(value: Any, most: int = 40) -> str:
    """``repr(value)`` as a refusal quotes it: cut to ``most`` characters."""
    text = repr(value)
    return text if len(text) <= most else text[:most - 3] + "..."


def _host(values: List[torch.Tensor]) -> List[float]:
    if not values:
        return []
    device = values[0].device
    return torch.stack([v.to(device).float() for v in values]).tolist()
