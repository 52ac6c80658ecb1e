"""IL014 init-not-applied."""
from __future__ import annotations

import inspect
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from ..capture import ops as O
from ..probe.declared import (BLOCK, DECLARED_DIGITS, HUGE, Draw, declare_applied, declare_called,
                              defined_outside_torch, draws_of, element_count, join_path, largest_finite,
                              may_be_unwritten, one_thread, own_random_stream, post_order, same,
                              scan_memory)
from ..report.findings import Finding
from ..compat import out_of_memory
from .base import AuditContext, Example, RepairPlan, Rule, fmt, py_path, to_host
from .il008_symmetric_init import feeds_weight_layer


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.proj(torch.relu(self.fc(x)))


class _TinyLM(nn.Module):
    def __init__(self, vocab: int = 512, width: int = 64, layers: int = 2, init: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(_Block(width) for _ in range(layers))
        self.head = nn.Linear(width, vocab, bias=False)
        if init:
            self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def model_whose_declared_init_never_ran():
    model = _TinyLM(init=False)  # self.apply(self._init_weights) is missing
    return model, torch.randint(0, 512, (4, 16))


def model_whose_declared_init_ran():
    model = _TinyLM()
    nn.init.kaiming_normal_(model.blocks[0].fc.weight, nonlinearity="relu")  # a deliberate re-init: not flagged
    return model, torch.randint(0, 512, (4, 16))


class InitNotApplied(Rule):
    """## What it does
    Compares every parameter with what the model's own declared init would make it. The
    declared init is found in the model: a Hugging Face ``PreTrainedModel``'s
    ``_init_weights``, applied to each module the way the installed transformers applies it
    (children first, the nearest ``PreTrainedModel`` dispatching); a ``_init_weights(module)``
    method applied through ``self.apply`` (nanoGPT); an ``init_weights()`` or
    ``reset_parameters()`` written for the model or one of its blocks (torchtitan,
    Megatron-style code). It is run on private copies of the modules, one block at a time,
    from a random stream of its own: the model, its parameters and the global random state
    are not touched, and the extra memory is at most one block. A private parameter holds the
    original's values only once the init reads them, and a random fill of a large one stands for
    the whole tensor with 65521 values, drawn only if a later step of the init reads them (a
    smaller one is drawn in full, and only then: a fill that a second fill overwrites is never
    drawn); a parameter that only a ``normal_`` or ``uniform_`` fill wrote is compared with that
    distribution's exact statistics. So the declared init costs neither a copy nor a draw of
    the model. An init that writes a tensor outside its private copy (a layer the model keeps
    in a plain list, reached through the original module) is stopped before the write and
    declares nothing.

    A parameter is flagged when the declared init would change it (its std, mean, fraction
    of exact zeros and ones, or distribution family: uniform and normal are told apart by
    their kurtosis) and it is still where the declared init was meant to take it from:

    - **PyTorch's default**: it matches the module's own ``reset_parameters()`` (``Linear``:
      uniform, std ``1/sqrt(3 fan_in)``; ``Embedding``: normal, std 1) where the model
      declares, say, ``normal(std=0.02)``;
    - **the init of its own module without the scaling a block applies**: GPT-2's
      ``_init_weights`` draws every ``Conv1D`` at std 0.02 and then rescales each block's
      ``c_proj`` to ``0.02 / sqrt(2 n_layer)``; a ``c_proj`` at 0.02 lost the scaling;
    - **never initialised**: denormal values, or magnitudes of ``1e20`` and more, that no
      init draws (the memory of ``torch.empty`` / ``module.to_empty()``; a huge value is found
      through the tensor's norm, denormals through a sample of 16384 elements in 256 runs,
      and a tensor showing either is then read in full), or exact zeros
      where the declared init draws at random and the layer's output feeds further weight
      layers (a zero-initialised residual output or head is deliberate; see IL008).
      Non-finite values are left to IL009.

    A parameter that differs from both the default and the declared init (re-initialised on
    purpose after ``post_init``, nanoGPT's ``c_proj`` rescaled after ``self.apply``) is not
    flagged. Tensors on the ``meta`` device hold no values and are not judged.

    ## Why is this bad?
    The model trains, but not with the init its authors validated. A custom Hugging Face
    model without ``post_init()`` keeps PyTorch's defaults (a width-128 ``Linear`` at std
    0.051 instead of 0.02, its embedding at std 1 instead of 0.02); a nanoGPT whose
    ``self.apply(self._init_weights)`` line is missing ends 150 AdamW steps at a loss of
    6.16-6.19 against 3.30-3.38 with its declared init (``benchmarks/declared_training.py``,
    ``ln V = 6.24``); a model moved with ``to_empty()`` and never initialised holds zeros or
    stale memory (denormals, values up to 3e38, NaN).

    ## Fix
    Run the declared init on the flagged modules, with the scalings it applies at block
    level: ``model.transformer.h[0].attn.apply(model._init_weights)`` (the Hugging Face
    ``_init_weights`` of the model that owns them), ``model.layers[0].init_weights()``, or
    call ``post_init()`` at the end of a custom ``PreTrainedModel.__init__`` and
    ``model.init_weights()`` after ``to_empty()``. ``initlint fix`` does this for you.

    ## Options
    - ``std-tolerance`` (default ``0.05``): two draws have the same std when the ratio is
      within ``1 +- std-tolerance`` (on top of the sampling noise of the tensors' sizes).
      Two draws of one init differ by sampling noise only; ``xavier_uniform_`` on a 4x
      wider layer is 9.5% away from PyTorch's ``Linear`` default, which 0.05 tells apart.
      PyTorch's ``Linear`` default and ``normal(std=0.02)`` differ by 4% at width 768: the
      distribution family, not the std, tells those apart.
    """

    code = "IL014"
    name = "init-not-applied"
    severity = "warning"
    needs = frozenset({"graph"})
    summary = "parameters still at PyTorch's default, or never initialised, where the model declares an init of its own"
    role = "cause"
    options = {"std-tolerance": 0.05}
    option_ranges = {"std-tolerance": (0.01, 1.0)}
    bad = (Example(model_whose_declared_init_never_ran,
                   expect={"embed", "blocks.0.fc", "blocks.0.proj", "blocks.1.fc", "blocks.1.proj", "head"}),)
    good = (Example(model_whose_declared_init_ran),)

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        tol = float(self.opts["std-tolerance"])
        by_module: Dict[str, List[Verdict]] = {}
        skipped: List[str] = []
        with one_thread():
            verdicts = list(judge(audit.model, tol, drawn=audit.probe.drawn, norms=_probe_norms(audit), skipped=skipped))
        for path in skipped:
            yield self.finding(audit, path, f"the declared init of {path or '<model>'} ran out of memory on its private "
                               f"copy: its parameters are not judged", "run the audit where there is memory for one "
                               f"more copy of this module's parameters", severity="info")
        for verdict in verdicts:
            if verdict.kind == "zeros" and not _random_zero_is_a_bug(audit, verdict.name):
                continue
            by_module.setdefault(verdict.module, []).append(verdict)
        for module, verdicts in by_module.items():
            yield self._finding(audit, module, verdicts)

    def _finding(self, audit: AuditContext, module: str, verdicts: List[Verdict]) -> Finding:
        parts = [v.describe() for v in verdicts]
        first = verdicts[0]
        message = f"{'; '.join(parts)}"
        audit.memo.setdefault("declared_calls", {})[module] = [v.call for v in verdicts]
        declared = float(f"{first.declared.std:.{DECLARED_DIGITS}g}") if first.declared else 0.0
        calls = list(dict.fromkeys(v.call.source() for v in verdicts))
        return self.finding(audit, module, message, f"help: {'; '.join(calls)}", value=first.actual.std,
                            threshold=declared)

    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        """The model's own declared init on the module the finding names (``DeclaredCall``): ``code()``
        writes that call, and block-level scalings come back as the model applies them."""
        verdicts = plan.ctx.memo.get("declared_verdicts")
        if verdicts is None:
            with one_thread():
                verdicts = plan.ctx.memo["declared_verdicts"] = list(
                    judge(plan.ctx.model, float(self.opts["std-tolerance"])))
        for verdict in verdicts:
            if verdict.module == module and verdict.call.method:
                plan.call(verdict.call, [v.name for v in verdicts if v.call == verdict.call], self.code,
                          f"the declared init did not run: {verdict.call.source()}", module=verdict.call.target)

    def repair_model(self, model: nn.Module, modules: Iterable[str], seed: int = 0,
                     calls: Optional[Dict[str, List["DeclaredCall"]]] = None) -> List[str]:
        """Repair the findings at ``modules``: the model's own declared init, called on the modules they name
        (``model.h[0].attn.apply(model._init_weights)``, ``model.init_weights()``), so block-level scalings
        (GPT-2's ``c_proj``) are applied as the model applies them. Draws come from a stream seeded with
        ``seed``; the global random state is left alone. Returns the code of the calls it ran.

        ``calls``: what :meth:`check` kept in ``audit.memo["declared_calls"]`` (module -> calls); without
        it the model is judged again. ``initlint fix`` makes the same calls through :meth:`repair`
        (``RepairPlan.call``), and its ``code()`` writes them."""
        if calls is None:
            calls = {}
            with one_thread():
                for verdict in judge(model, float(self.opts["std-tolerance"])):
                    calls.setdefault(verdict.module, []).append(verdict.call)
        wanted = dict.fromkeys(c for m in modules for c in calls.get(m, []))
        lines = []
        for call in wanted:
            call.apply(model, seed)
            lines.append(call.code(seed))
        return lines


def _probe_norms(audit: AuditContext) -> Dict[str, float]:
    """The norms of the weights the probe measured (rms x sqrt(numel)), so their pass is not made twice."""
    named = dict(audit.model.named_parameters())
    out = {}
    for name, stats in audit.probe.params.items():
        rms = stats.get("rms") if name in named else None
        if rms is not None:
            out[name] = rms * math.sqrt(named[name].numel())
    return out


def _random_zero_is_a_bug(audit: AuditContext, name: str) -> bool:
    """Exact zeros where the declared init draws at random: a bug unless the zeros are a deliberate pattern
    (a zero-initialised residual output or head, whose output feeds no further weight layer)."""
    for op in audit.graph:
        if name in op.params.values():
            if op.kind == "embedding":
                return True
            if op.kind in O.WEIGHT_KINDS and op.params.get("weight") == name:
                return feeds_weight_layer(audit.graph, op)
    return False


def _draw_text(draw: Draw, digits: int = 3) -> str:
    """A draw as the rule's messages say it: ``std 0.02, normal``, ``all 0``."""
    if draw.std == 0:
        return f"all {fmt(draw.mean)}"
    return f"std {_round(draw.std, digits)}, {draw.family()}"


def _round(x: float, digits: int) -> str:
    return fmt(float(f"{x:.{digits}g}"))


# ----------------------------------------------------------------------------- the declared init
@dataclass(frozen=True)
class DeclaredCall:
    """The model's own init called on one module: ``target.apply(owner._init_weights)`` when ``owner`` is set,
    else ``target.method()`` (``init_weights()``, ``reset_parameters()``)."""

    target: str
    owner: Optional[str]
    method: str

    def source(self, ref: str = "model") -> str:
        if not self.method:
            return f"initialise {py_path(self.target, ref)} (no init of its own)"
        if self.owner is not None:
            return f"{py_path(self.target, ref)}.apply({py_path(self.owner, ref)}.{self.method})"
        return f"{py_path(self.target, ref)}.{self.method}()"

    def code(self, seed: int) -> str:
        """The call as code that draws from its own seeded stream."""
        return (f"with torch.random.fork_rng():\n    torch.manual_seed({seed})\n    with torch.no_grad():\n"
                f"        {self.source()}")

    def apply(self, model: nn.Module, seed: int = 0) -> None:
        if not self.method:
            return
        target = model.get_submodule(self.target) if self.target else model
        with own_random_stream(seed):
            if self.owner is None:
                getattr(target, self.method)()
            else:
                owner = model.get_submodule(self.owner) if self.owner else model
                target.apply(getattr(owner, self.method))


@dataclass
class Verdict:
    """One parameter that is not what the declared init makes it."""

    name: str
    module: str
    kind: str
    """``default`` (PyTorch's default), ``unscaled`` (its module's init without a block's scaling),
    ``zeros`` (exact zeros where the init draws at random) or ``empty`` (memory nobody wrote)."""
    actual: Draw
    declared: Optional[Draw]
    declared_by: str
    call: "DeclaredCall"
    """The model's own init on the modules that hold this parameter: the repair."""
    detail: str = ""

    def describe(self) -> str:
        short = self.name.rsplit(".", 1)[-1]
        if self.kind == "empty":
            return (f"{short} holds {self.detail} that no init draws: never initialised (the memory of torch.empty "
                    f"or to_empty())")
        declared = _draw_text(self.declared, DECLARED_DIGITS) if self.declared is not None else "n/a"
        if self.kind == "zeros":
            return (f"{short} is exactly zero, as never-initialised memory often is, where {self.declared_by} "
                    f"draws it at random ({declared})")
        if self.kind == "unscaled":
            return (f"{short} ({_draw_text(self.actual)}) has its own module's init without the scaling "
                    f"{self.detail} applies: {self.declared_by} declares {declared}")
        return (f"{short} ({_draw_text(self.actual)}) is still at PyTorch's default for {self.detail}: "
                f"{self.declared_by} declares {declared}")


@dataclass
class _Owner:
    path: str
    module: nn.Module
    hf: bool


def _hf_base() -> Optional[type]:
    """transformers' ``PreTrainedModel`` when transformers is imported (never imported here)."""
    mod = sys.modules.get("transformers.modeling_utils")
    return getattr(mod, "PreTrainedModel", None)




def _arity(fn: Callable[..., Any]) -> Optional[int]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return sum(1 for p in sig.parameters.values()
               if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _applied_owners(model: nn.Module) -> Dict[int, _Owner]:
    """Module id -> whose ``_init_weights(module)`` applies to it: the nearest Hugging Face model (as
    ``initialize_weights`` dispatches), else the nearest module defining ``_init_weights(module)``."""
    hf = _hf_base()
    owners: Dict[int, _Owner] = {}

    def walk(path: str, m: nn.Module, current: Optional[_Owner]) -> None:
        if hf is not None and isinstance(m, hf):
            current = _Owner(path, m, True)
        elif (current is None or not current.hf) and defined_outside_torch(m, "_init_weights") \
                and _arity(m._init_weights) == 1:
            current = _Owner(path, m, False)
        if current is not None:
            owners[id(m)] = current
        for name, child in m.named_children():
            walk(join_path(path, name), child, current)

    walk("", model, None)
    return owners


_CALLED = ("init_weights", "reset_parameters", "_init_weights")


def _called_method(m: nn.Module) -> Optional[str]:
    """The no-argument init method a (non Hugging Face) module declares for its subtree."""
    for method in _CALLED:
        fn = getattr(m, method, None)
        if fn is not None and callable(fn) and defined_outside_torch(m, method) and _arity(fn) == 0:
            return method
    return None

def _units(m: nn.Module, path: str, budget: int) -> Iterator[Tuple[str, nn.Module, bool]]:
    """Subtrees of at most ``budget`` elements (whole), and the own tensors of larger modules (not whole;
    also when they have none: :func:`judge` checks whether their own init reaches into their children)."""
    if element_count(m) <= budget:
        yield path, m, True
        return
    yield path, m, False
    for name, child in m.named_children():
        yield from _units(child, join_path(path, name), budget)


WHOLE_CAP = 1 << 28
"""Elements of the largest split module replayed whole when its own init reaches into its children (1 GiB
in float32)."""


def _inside(path: str, ancestor: str) -> bool:
    return path != ancestor and (ancestor == "" or path.startswith(ancestor + "."))


def _replayable_apart(model: nn.Module, path: str, unit: nn.Module, owners: Dict[int, "_Owner"],
                      every: Optional[List[nn.Module]]) -> bool:
    """Whether the declared init of ``unit``'s own tensors runs on a copy that holds none of its children."""
    return declare_applied(model, unit, False, path, [unit], owners, lambda name, draw: False, every) is not None


def _module_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def judge(model: nn.Module, tol: float, budget: int = BLOCK, drawn: Optional[Dict[str, Draw]] = None,
          norms: Optional[Dict[str, float]] = None, skipped: Optional[List[str]] = None) -> Iterator[Verdict]:
    """Every parameter of ``model`` that is not what its declared init makes it, or that no init wrote.

    ``drawn``: the statistics a streamed audit recorded for parameters that are back on the meta device;
    ``norms``: parameters' norms already measured (the probe's weights); ``skipped``: where given, the units
    whose declared init ran out of memory on its private copy are listed there and not judged (else the
    error is raised)."""
    drawn = drawn or {}
    params = {n: p for n, p in model.named_parameters()
              if (p.device.type != "meta" or n in drawn) and p.is_floating_point() and p.layout == torch.strided}
    actual = _Actual(params, drawn)
    scanned = set(drawn)
    empty: Dict[str, Verdict] = {}
    judged: set = set()

    def scan(names: List[str]) -> None:
        """Every element of these parameters read once, on the device, in one transfer."""
        names = [n for n in names if n not in scanned]
        scanned.update(names)
        actual.ensure(names)
        rows = to_host([torch.stack([v.double() for v in scan_memory(params[n])]) for n in names])
        for n, (absmax, denormal, finite) in zip(names, rows):
            absmax = absmax if absmax >= 0 else largest_finite(params[n])
            a = actual[n]
            a.absmax, a.denormal, a.finite = max(a.absmax, absmax), int(denormal), bool(finite)

    def never_written(name: str) -> bool:
        """Every element read (once, and only for a parameter the declared init does not explain)."""
        scan([name])
        a = actual[name]
        return bool(a.denormal or a.absmax >= HUGE)

    params = _Params(params, never_written)
    owners = _applied_owners(model)
    every = list(model.modules())  # listed once: each unit's private copy leaves the others alone
    # outside Hugging Face, `self.encoder.apply(self._init_weights)` may leave other modules at PyTorch's
    # default on purpose: an owner's "still at the default" verdicts count only when none of its other
    # parameters matched its declared init (a missing `self.apply` line leaves all at the default)
    matched: set = set()
    deferred: Dict[str, List[Verdict]] = {}
    if owners:
        units = [(path, unit, whole) for path, unit, whole in _units(model, "", budget)
                 if any(id(m) in owners for m in unit.modules())]
        # what every such unit holds, drawn at once: one reduction per few samples and one transfer,
        # not one of each per unit (a 32-layer Llama has 160 units)
        try:
            actual.ensure(join_path(path, n) for path, unit, whole in units
                          for n, _ in unit.named_parameters(recurse=whole))
        except Exception as exc:  # noqa: BLE001 - drawn unit by unit below instead
            if skipped is None or not out_of_memory(exc):
                raise
        # a module split into its children (larger than the budget) is replayed apart from them, its own
        # tensors alone; when its own init reaches into its children (Mamba2's mixer re-initialises its conv1d
        # and out_proj after their own _init_weights drew them) that fails, and its subtree is replayed whole
        # instead, up to WHOLE_CAP elements: judged apart, the children would be compared with a draw their
        # parent overwrites
        rejoined: List[str] = []
        for path, unit, whole in units:
            if any(_inside(path, r) for r in rejoined):
                continue
            if not whole and element_count(unit) <= WHOLE_CAP:
                apart = _unless_out_of_memory(path, unit, True, judged, skipped,
                                              lambda: [_replayable_apart(model, path, unit, owners, every)])
                if not apart:  # out of memory: the unit is skipped
                    continue
                if not apart[0]:
                    whole = True
                    rejoined.append(path)
            if _wanted(path, unit, whole, params, judged):
                yield from _unless_out_of_memory(
                    path, unit, whole, judged, skipped,
                    lambda: list(_judge_applied(model, path, unit, whole, owners, params, actual, judged, empty, tol,
                                                matched, deferred, every)))
    for path, scope, method in _called_scopes(model, owners, budget):
        if _wanted(path, scope, True, params, judged):
            yield from _unless_out_of_memory(
                path, scope, True, judged, skipped,
                lambda: list(_judge_called(model, path, scope, method, params, actual, judged, empty, tol, every)))
    for owner_path, verdicts in deferred.items():
        if owner_path not in matched:
            yield from verdicts
    rest = [n for n in params if n not in judged and n not in scanned]
    known = [(norms or {}).get(n) for n in rest]
    suspects = {n for n, maybe in zip(rest, may_be_unwritten([params[n] for n in rest], known)) if maybe} | scanned
    scan(sorted(suspects))
    for name in params:
        if name not in judged and name in suspects and never_written(name):
            empty[name] = _empty(model, name, actual[name], None)
    yield from empty.values()


def _unless_out_of_memory(path: str, unit: nn.Module, whole: bool, judged: set, skipped: Optional[List[str]],
                          run: Callable[[], List[Any]]) -> List[Any]:
    """``run()``'s verdicts; where its private copy runs out of memory and ``skipped`` is given, none: the unit
    is listed there and its parameters count as judged (no verdict of "never written" for them either)."""
    try:
        return run()
    except Exception as exc:  # noqa: BLE001
        if skipped is None or not out_of_memory(exc):
            raise
    skipped.append(path)
    judged.update(join_path(path, n) for n, _ in unit.named_parameters(recurse=whole))
    return []


class _Actual(dict):
    """The statistics of what each parameter holds, drawn when first asked for: a unit's at once when its
    declared init is judged (one transfer per device), none for a model that declares no init."""

    def __init__(self, params: Dict[str, torch.Tensor], drawn: Dict[str, Draw]) -> None:
        super().__init__(drawn)
        self.params = params

    def ensure(self, names: Iterable[str]) -> None:
        wanted = [n for n in dict.fromkeys(names) if n in self.params and n not in self]
        self.update(zip(wanted, draws_of([self.params[n] for n in wanted])))

    def __missing__(self, name: str) -> Draw:
        self.ensure([name])
        return dict.__getitem__(self, name)


class _Params(dict):
    """The judged parameters by name, with the full scan for memory nobody wrote (:func:`judge`)."""

    def __init__(self, tensors: Dict[str, torch.Tensor], never_written: Callable[[str], bool]) -> None:
        super().__init__(tensors)
        self.never_written = never_written


def _empty(model: nn.Module, name: str, a: Draw, call: Optional["DeclaredCall"]) -> Verdict:
    module = _module_of(name)
    what = [f"{a.denormal} denormal value(s)"] if a.denormal else []
    if a.absmax >= HUGE:
        what.append(f"values up to {fmt(a.absmax)}")
    owner = model.get_submodule(module) if module else model
    if call is None:
        call = DeclaredCall(module, None, "reset_parameters" if callable(getattr(owner, "reset_parameters", None))
                            else "")
    return Verdict(name, module, "empty", a, None, "", call, " and ".join(what))


def _wanted(path: str, unit: nn.Module, whole: bool, params: Dict[str, torch.Tensor], judged: set) -> bool:
    """A unit with a parameter left to judge, every one of whose parameters holds values or was recorded."""
    names = [join_path(path, n) for n, p in unit.named_parameters(recurse=whole)]
    return all(n in params for n, (_, p) in zip(names, unit.named_parameters(recurse=whole))
               if p.device.type == "meta") and any(n in params and n not in judged for n in names)


def _called_scopes(model: nn.Module, owners: Dict[int, _Owner], budget: int) -> Iterator[Tuple[str, nn.Module, str]]:
    """The outermost modules (of at most ``budget`` elements) with a no-argument init method of their own."""
    def walk(path: str, m: nn.Module) -> Iterator[Tuple[str, nn.Module, str]]:
        owner = owners.get(id(m))
        if owner is not None and owner.hf:
            return  # a Hugging Face model's init is its _init_weights
        method = _called_method(m)
        if method is not None and element_count(m) <= budget:
            yield path, m, method
            return
        for name, child in m.named_children():
            yield from walk(join_path(path, name), child)

    yield from walk("", model)


def _judge_applied(model: nn.Module, path: str, unit: nn.Module, whole: bool, owners: Dict[int, _Owner],
                   params: "_Params", actual: Dict[str, Draw], judged: set,
                   empty: Dict[str, Verdict], tol: float, matched: set,
                   deferred: Dict[str, List[Verdict]], every: Optional[List[nn.Module]] = None) -> Iterator[Verdict]:
    originals = [m for _, m in post_order(unit, path)] if whole else [unit]
    actual.ensure(join_path(path, n) for n, _ in unit.named_parameters(recurse=whole))  # type: ignore[attr-defined]

    def differs(name: str, declared: Draw) -> bool:
        return name in params and name not in judged and not same(actual[name], declared, tol)

    dec = declare_applied(model, unit, whole, path, originals, owners, differs, every)
    if dec is None:  # an init that cannot run on a copy declares nothing we can compare
        return
    modules = dict(unit.named_modules(prefix=path)) if whole else {path: unit}
    for name, full in dec.full.items():
        if name not in params:
            continue
        owner = owners.get(id(modules.get(_module_of(name))))
        if owner is None:
            continue
        target = dec.writer.get(name, _module_of(name))
        fix = DeclaredCall(target, owner.path, "_init_weights")
        by = f"{type(owner.module).__name__}._init_weights"
        if name in judged:
            continue
        judged.add(name)
        if same(actual[name], full, tol):
            matched.add(owner.path)
            continue
        if params.never_written(name):
            empty[name] = _empty(model, name, actual[name], fix)
            continue
        writer = type(modules[target]).__name__ if target in modules else target
        verdict = _compare(name, actual[name], dec.default.get(name, []), dec.own.get(name), full, tol, writer)
        if verdict is not None:
            kind, detail = verdict
            found = Verdict(name, _module_of(name), kind, actual[name], full, by, fix, detail)
            if kind == "default" and not owner.hf:
                deferred.setdefault(owner.path, []).append(found)
            else:
                yield found


def _judge_called(model: nn.Module, path: str, scope: nn.Module, method: str, params: "_Params",
                  actual: Dict[str, Draw], judged: set, empty: Dict[str, Verdict], tol: float,
                  every: Optional[List[nn.Module]] = None) -> Iterator[Verdict]:
    actual.ensure(join_path(path, n) for n, _ in scope.named_parameters())  # type: ignore[attr-defined]

    def differs(name: str, declared: Draw) -> bool:
        return name in params and name not in judged and not same(actual[name], declared, tol)

    dec = declare_called(model, scope, method, path, differs, every)
    if dec is None:  # an init that cannot run on a copy declares nothing we can compare
        return
    full, default = dec
    fix = DeclaredCall(path, None, method)
    by = f"{type(scope).__name__}.{method}()"
    for name, declared in full.items():
        if name not in params:
            continue
        if name in judged:
            continue
        judged.add(name)
        if same(actual[name], declared, tol):
            continue
        if params.never_written(name):
            empty[name] = _empty(model, name, actual[name], fix)
            continue
        verdict = _compare(name, actual[name], default.get(name, []), None, declared, tol, "")
        if verdict is not None:
            yield Verdict(name, _module_of(name), verdict[0], actual[name], declared, by, fix, verdict[1])


def _compare(name: str, a: Draw, defaults: List[Tuple[str, Draw]], own: Optional[Draw], full: Draw, tol: float,
             writer: str) -> Optional[Tuple[str, str]]:
    """Why ``a`` is not the declared ``full`` draw, when it is still where that init was meant to take it from."""
    if not (a.finite and math.isfinite(a.std)) or same(a, full, tol):
        return None
    if a.std == 0 and a.mean == 0 and full.std > 0:
        return "zeros", ""
    for module_type, default in defaults:
        if same(a, default, tol) and not same(default, full, tol):
            return "default", module_type
    if own is not None and same(a, own, tol) and not same(own, full, tol):
        return "unscaled", writer
    return None
