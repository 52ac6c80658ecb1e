"""What a rule is, and the read-only view of an audit that rules receive."""
from __future__ import annotations

import inspect
import math
import re
import textwrap
from dataclasses import dataclass, field
from functools import cached_property
from typing import (Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, Mapping, Optional, Protocol, Sequence,
                    Set, Tuple)

import torch
import torch.nn as nn

from ..capture import ops as O
from ..capture.graph import Graph, Op, enclosing_paths  # noqa: F401 - the rules' name for it
from ..capture.locate import user_location
from ..probe.precision import PrecisionStats
from ..probe.run import ProbeResult
from ..probe.stats import OpStats
from ..probe.step import StepStats
from ..report.findings import Finding


ROLES = ("cause", "symptom", "check", "meta")
"""What a rule's findings are: a root ``cause`` in the weights (scale, symmetry); a measured
``symptom`` that causes upstream explain (dead units, drift, saturation); a ``check`` that
stands on its own (an architecture or numeric fact); ``meta``, about the audit itself."""


@dataclass(frozen=True)
class Example:
    """A model a rule is shown on: ``build()`` returns the module (or ``(module, example_inputs)``),
    and ``expect`` names the modules where the rule must report (empty: a model it must pass).

    Every rule's examples are tests (``tests/test_rule_examples.py`` generates one per example,
    plugins included) and the first bad one is the ``## Example`` of its documentation.
    """

    build: Callable[[], Any]
    expect: FrozenSet[str] = frozenset()
    options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword options for :func:`initlint.audit` (``logits=True``, ``rule_options=...``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "expect", frozenset(self.expect))

    def model(self) -> Tuple[nn.Module, Any]:
        """Build it with torch seeded to 0: ``(module, example_inputs or None)``."""
        torch.manual_seed(0)
        built = self.build()
        return built if isinstance(built, tuple) else (built, None)

    def source(self) -> str:
        """The builder's source, for the documentation."""
        return textwrap.dedent(inspect.getsource(self.build)).strip()


class Rule:
    """Base class: one rule, one file. A subclass sets ``code``, ``name``, ``severity``,
    ``role``, ``needs``, ``options``, its ``bad`` and ``good`` examples, and implements
    :meth:`check`. Its docstring is the rule's documentation, with the sections
    ``## What it does``, ``## Why is this bad?``, ``## Fix`` and ``## Options``; the
    ``## Example`` section is generated from the first bad example.
    """

    code: str = ""
    name: str = ""
    severity: str = "warning"
    needs: frozenset = frozenset({"graph"})
    """Any of ``graph`` (static), ``activations`` (forward probe), ``gradients`` (backward probe), ``step``
    (the first step of the user's optimizer: the rule runs only when one is given), ``precision`` (the
    probe again under ``torch.autocast``: the rule runs only when a precision is given); ``sweep``: the rule
    judges a sweep over model sizes (``judge(SweepData)``), and a single audit gives it nothing to check."""
    options: Dict[str, Any] = {}
    """Option name -> default value; documented in the docstring's Options section."""
    option_ranges: Dict[str, Tuple[float, Optional[float]]] = {}
    """Option name -> ``(low, high)``: the values that mean something for a numeric option (``high``
    None: no upper bound); a value outside is refused with the range named. Unlisted: any finite number."""
    summary: str = ""
    """One line for ``initlint rules``."""
    role: str = "check"
    """One of :data:`ROLES`; linking symptoms to causes reads it."""
    stretch: bool = False
    """A symptom about a stretch of the network (drift through depth): every cause explains it,
    wherever the cause sits; other symptoms are explained by causes that run before them."""
    uses: FrozenSet[str] = frozenset()
    """Codes of rules whose findings :meth:`check` reads (:meth:`AuditContext.findings_of`); they run first."""
    bad: Tuple[Example, ...] = ()
    """Models the rule must flag, at the modules each example names."""
    good: Tuple[Example, ...] = ()
    """Models the rule must pass."""

    def __init__(self, **overrides: Any) -> None:
        unknown = set(overrides) - set(self.options)
        if unknown:
            raise ValueError(f"{self.code} ({self.name}) has no option {', '.join(sorted(unknown))}")
        self.opts = {**self.options, **overrides}

    repair_after_causes: bool = False
    """The repair waits for a round in which no root cause was repaired (or the last round): a
    repaired cause usually removes this rule's finding, and the re-audit tells."""

    def check(self, audit: "AuditContext") -> Iterator[Finding]:
        """Yield findings for the audited model."""
        raise NotImplementedError

    def repair(self, plan: "RepairPlan", finding: Finding, module: str) -> None:
        """Ask ``plan`` for the steps that repair ``finding`` at ``module`` (one of its members).

        ``initlint.fix`` calls it for this rule's warnings and errors; a rule without it has findings
        no init repairs (their code change is in the finding's fix)."""
        raise NotImplementedError

    @classmethod
    def repairs(cls, finding: Finding) -> bool:
        """Whether :meth:`repair` can act on ``finding`` (a rule that has a repair: yes, unless it says otherwise)."""
        return cls.repair is not Rule.repair

    def finding(self, audit: "AuditContext", op_or_module: Any, message: str, fix: str, *, value: Optional[float] = None,
                threshold: Optional[float] = None, severity: Optional[str] = None) -> Finding:
        """A finding of this rule located at an op (or a module path)."""
        if isinstance(op_or_module, Op):
            module, location = op_or_module.module, audit.location(op_or_module)
        else:
            module, location = op_or_module, audit.graph.module_locations.get(op_or_module)
        location = user_location(location, module, audit.graph.module_locations)  # not a line inside a library
        return Finding(code=self.code, name=self.name, severity=severity or self.severity, module=module,
                       message=message, fix=fix, value=value, threshold=threshold, location=location)

    @classmethod
    def make(cls, module: str, message: str, fix: str, **fields: Any) -> Finding:
        """A finding of this rule built outside :meth:`check` (by the pipeline, for IL000 and IL010)."""
        fields.setdefault("severity", cls.severity)
        return Finding(code=cls.code, name=cls.name, module=module, message=message, fix=fix, **fields)

    @classmethod
    def doc(cls) -> str:
        """The rule's documentation (its docstring, dedented)."""
        return inspect.cleandoc(cls.__doc__ or "")


class RepairPlan(Protocol):
    """What a rule's :meth:`Rule.repair` reads and asks for; ``initlint.fix``'s planner (``repair.Planner``)
    implements it. Steps are applied in graph order after the round's planning, each parameter at most once
    per round (the first rule to ask wins), and written into ``FixReport.code()`` exactly as applied."""

    graph: Graph
    ctx: "AuditContext"
    """The audit the round plans from (model, graph, probe statistics)."""
    method: str
    """``auto``, ``analytic`` or ``lsuv`` (see :meth:`data_driven`)."""
    acted: Set[str]
    """Modules repaired in earlier rounds."""
    lsuv_target: float
    """The output rms a measured rescale gives a layer."""

    def through_cause(self, finding: Finding) -> bool:
        """A cause the finding links to was repaired in this round or an earlier one: leave it to the re-audit."""

    def weight_op(self, module: str) -> Optional[Op]:
        """The first weight layer (Linear, Conv, Conv1D) of ``module``."""

    def ops_of(self, module: str, kinds: Iterable[str]) -> List[Op]:
        """The ops of ``module`` of these kinds."""

    def judged(self, rule: type) -> Dict[str, Finding]:
        """Module -> the finding of ``rule`` (a Rule class, run on this audit with the user's options, ungrouped)."""

    def rule_options(self, rule: type) -> Dict[str, Any]:
        """The options the user gave ``rule``."""

    def data_driven(self, op: Op) -> bool:
        """Whether ``method`` asks for a measured rescale of ``op`` rather than fans and gains."""

    def redraw(self, op: Op, std: float, rule: str, why: str, param: Optional[str] = None) -> None:
        """A fresh draw with ``std`` of ``op``'s weight (or of ``param``), in its own distribution family."""

    def zero(self, name: str, module: str, rule: str, why: str) -> None:
        """``nn.init.zeros_`` on the parameter ``name``."""

    def scale(self, op: Op, factor: float, rule: str, why: str, param: Optional[str] = None) -> None:
        """Multiply ``op``'s weight (or ``param``) by ``factor``."""

    def lsuv(self, op: Op, rule: str, why: str, *, shrink_only: bool = False, tolerance: float = 1.0,
             max_factor: Optional[float] = None, fallback_std: Optional[float] = None) -> None:
        """Rescale ``op``'s weight so that its output has rms :attr:`lsuv_target` on the probe batch
        (measured after the round's direct steps, layer after layer); where no forward hook can measure
        it, a redraw with ``fallback_std`` if given, else a note."""

    def call(self, declared: Any, params: Sequence[str], rule: str, why: str, module: str = "") -> None:
        """Run one of the model's own init methods (an object with ``apply(model, seed)``, ``source()`` and
        ``code(seed)``) that writes ``params``; ``code()`` writes the call, not numbers."""

    def note(self, text: str) -> None:
        """A sentence for the summary: what was not repaired, and why."""


@dataclass
class AuditContext:
    """Everything a rule may read: the model, its captured graph, the probe statistics and
    the findings of the rules it ``uses``."""

    model: nn.Module
    graph: Graph
    probe: ProbeResult
    logits: bool = False
    precision: Optional[str] = None
    """How the model will train: ``"fp16"``, ``"bf16"`` (autocast) or None (float32)."""
    grad_scaler: bool = False
    """fp16 training scales the loss with ``torch.amp.GradScaler``."""
    step: Optional[StepStats] = None
    """The first step of the user's optimizer (:mod:`initlint.probe.step`); None without an optimizer."""
    ddp: bool = False
    """The audited model was wrapped in DistributedDataParallel."""
    precision_probe: Optional[PrecisionStats] = None
    """What the autocast pass measured, when a precision is given."""
    results: Dict[str, List[Finding]] = field(default_factory=dict)
    """Findings of the rules that already ran, by code (filled by the pipeline)."""
    memo: Dict[str, Any] = field(default_factory=dict)
    """Graph analyses several rules share (such as :func:`gated_ops`), computed once per audit by
    the helper in ``rules/base.py`` that owns the key; never a rule's findings (see ``uses``)."""

    def findings_of(self, code: str) -> List[Finding]:
        """What rule ``code`` found; it ran first because the reading rule declares it in ``uses``."""
        return self.results.get(code, [])

    def param(self, name: str) -> Optional[nn.Parameter]:
        """The parameter tensor with this qualified name."""
        return self._params.get(name)

    @cached_property
    def _params(self) -> Dict[str, nn.Parameter]:
        return dict(self.model.named_parameters())

    def op_stats(self, op: Op) -> OpStats:
        """Forward statistics of an op (every field ``None`` when it was not measured)."""
        stats = self.probe.ops.get(op.id)  # not `or`: a record's truth value walks all its fields
        return stats if stats is not None else OpStats()

    def shape(self, op: Op) -> Optional[Tuple[int, ...]]:
        """Shape of ``op``'s output in the probe's forward pass (None when it made no tensor)."""
        return self.probe.shapes.get(op.id, op.shape)

    def location(self, op: Op) -> Optional[Tuple[str, int]]:
        """Where to fix it: the module's construction line, else the op's call site."""
        if op.attrs.get("module_op") or op.kind in O.WEIGHT_KINDS or op.kind in O.NORM_KINDS:
            loc = self.graph.module_locations.get(op.module)
            if loc is not None and (op.params or op.attrs.get("module_op")):
                return loc
        return op.location or self.graph.module_locations.get(op.module)

    def fan_in(self, op: Op) -> Optional[int]:
        """Fan-in of a weight op, from its weight's shape."""
        w = self.param(op.params.get("weight", ""))
        if w is None or w.dim() < 2:
            return None
        return O.fan_in(w, op.kind, op.attrs.get("layout", "out_in"))


def to_host(values: List[torch.Tensor]) -> List[Any]:
    """Tensors of one shape, possibly on several devices, as numbers (0-d) or lists: one transfer per
    device, never one per value (a rule that read each with ``float()`` would wait on the device once
    per layer)."""
    out: List[Any] = [0.0] * len(values)
    by_device: Dict[torch.device, List[int]] = {}
    for i, v in enumerate(values):
        by_device.setdefault(v.device, []).append(i)
    for indices in by_device.values():
        for i, x in zip(indices, torch.stack([values[i].double() for i in indices]).tolist()):
            out[i] = x
    return out


def py_path(name: str, root: str = "model") -> str:
    """``layers.3.weight`` -> ``model.layers[3].weight`` (how the user would type it)."""
    out = root
    for part in name.split(".") if name else []:
        out += f"[{part}]" if part.isdigit() else f".{part}"
    return out


def fmt(x: Optional[float]) -> str:
    """Compact number: 0.0577, 1.2e-07, 4.6e+07."""
    if x is None:
        return "n/a"
    if x != x or x in (float("inf"), float("-inf")):
        return str(x)
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.3g}"
    return f"{x:.2g}"


def fmt_beyond(x: Optional[float], limit: Optional[float]) -> str:
    """``fmt(x)`` for a value judged against ``limit``, with more significant digits (up to 7) where the two
    would print alike: a finding's value never reads as equal to the limit it passed (0.5004 against 0.5)."""
    text = fmt(x)
    if x is None or limit is None or x == limit or text != fmt(limit):
        return text
    for digits in range(4, 8):
        text = f"{x:.{digits}g}"
        if text != f"{limit:.{digits}g}":
            break
    return text


def downstream(graph: Graph, op: Op, limit: int = 64) -> List[Op]:
    """The first ops after ``op`` that are not pass-through (views, dropout, pooling, adds).

    Walks every path; each path stops at its first activation, norm, weight op, softmax or
    other computing op. Model outputs count as an ``output`` terminal (returned as ``op``'s
    last pass-through op when nothing consumes it).
    """
    found: List[Op] = []
    frontier = [op]
    seen = {op.id}
    steps = 0
    while frontier and steps < limit:
        current = frontier.pop(0)
        steps += 1
        users = graph.consumers(current)
        if not users:
            found.append(current)  # reaches the output
            continue
        for user in users:
            if user.id in seen:
                continue
            seen.add(user.id)
            if user.kind in O.PASS_KINDS or user.kind == "add" or (user.kind in ("mul", "div") and len(user.inputs) == 1):
                frontier.append(user)
            else:
                found.append(user)
    return found


def activation_after(terms: List[Op]) -> Tuple[str, Tuple[float, float]]:
    """The activation among ``terms`` (what :func:`downstream` found after a weight layer) and the gain
    band ``(lo, hi)`` it needs; ``identity`` with gain 1 when none follows."""
    act_op = next((t for t in terms if t.kind in O.ACTIVATIONS), None)
    if act_op is None:
        return "identity", O.IDENTITY.band({})
    return act_op.kind, O.ACTIVATIONS[act_op.kind].band(act_op.attrs)


_KAIMING = {"relu": "relu", "relu6": "relu", "leaky_relu": "leaky_relu", "prelu": "leaky_relu",
            "rrelu": "leaky_relu", "tanh": "tanh", "hardtanh": "tanh", "softsign": "tanh", "sigmoid": "sigmoid",
            "hardsigmoid": "sigmoid", "selu": "linear", "identity": "linear"}


def init_fix(audit: AuditContext, op: Op, activation: str, fan_in: int) -> str:
    """The ``nn.init`` call that gives ``op``'s weight the scale ``activation`` needs."""
    weight = py_path(op.params["weight"])
    nonlinearity = _KAIMING.get(activation)
    if nonlinearity is not None and op.attrs.get("layout") != "in_out":
        if nonlinearity == "leaky_relu":
            return f'nn.init.kaiming_normal_({weight}, a={fmt(_slope(audit, op))}, nonlinearity="leaky_relu")'
        return f'nn.init.kaiming_normal_({weight}, nonlinearity="{nonlinearity}")'
    lo, _ = O.ACTIVATIONS.get(activation, O.IDENTITY).band({})
    return f"nn.init.normal_({weight}, std={fmt(lo / math.sqrt(fan_in))})  # gain {fmt(lo)} / sqrt(fan_in {fan_in})"


def _slope(audit: AuditContext, op: Op) -> float:
    for t in downstream(audit.graph, op):
        if "negative_slope" in t.attrs:
            return float(t.attrs["negative_slope"])
    return 0.01


def upstream_weight(graph: Graph, op: Op, limit: int = 32) -> Optional[Op]:
    """Nearest weight op (linear/conv) feeding ``op`` through its first inputs."""
    for current in graph.back(op, limit=limit + 1):
        if current is not op and current.kind in O.WEIGHT_KINDS and "weight" in current.params:
            return current
    return None


Audit = AuditContext
"""The name rules written before :class:`AuditContext` use; kept for third-party rules."""


def order_by_uses(rules: Iterable[Any]) -> List[Any]:
    """Rules (classes or instances) in an order where every rule runs after the rules it ``uses``,
    otherwise in code order. A cycle of ``uses`` is a mistake in the rules: ValueError."""
    by_code = {r.code: r for r in sorted(rules, key=lambda r: r.code)}
    ordered: List[Any] = []
    done: set = set()
    visiting: List[str] = []

    def place(code: str) -> None:
        if code in done or code not in by_code:
            return
        if code in visiting:
            raise ValueError(f"rules use each other in a cycle: {' -> '.join(visiting + [code])}")
        visiting.append(code)
        for used in sorted(by_code[code].uses):
            place(used)
        visiting.pop()
        done.add(code)
        ordered.append(by_code[code])

    for code in by_code:
        place(code)
    return ordered


# ------------------------------------------------------------------ branch gates (IL005, IL006)
GATE_MAX = 0.25
"""A learned scale, a norm weight or a zero weight that leaves at most this fraction of a branch's
signal gates the branch: it starts near identity by design (LayerScale, ReZero, SkipInit,
zero-initialised last BatchNorm gamma, Fixup's and modded-nanoGPT's zero-initialised last layers)."""

_LOOK_THROUGH = frozenset({"view", "dropout", "identity"})


CREATED = frozenset({"zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like", "empty_like",
                      "full_like", "new_zeros", "new_ones", "new_empty", "new_full", "empty_strided"})
"""Tensors a forward creates (an RNN's zero initial state, a position index): not the signal, so they
neither start nor end a drift stretch, even when the capture links them to the tensor they take a size from."""


def created_tensor(op: Op) -> bool:
    """A tensor made inside the forward (``torch.zeros(batch, hidden)``, ``x.new_ones(...)``, ``torch.arange``)."""
    return op.kind == "empty" or str(op.target).rsplit(".", 1)[-1] in CREATED


UNTRACKED = ("; the model runs it with autograd off (a no_grad block of its own), so the model's loss sends it no "
             "gradient: whatever trains it (a loss of its own, as a sparse-attention indexer has) is not probed, "
             "and this is information")
"""What a finding whose harm is the gradient's adds where the op ran outside autograd (:func:`outside_autograd`)."""


def outside_autograd(audit: AuditContext, op: Op, finding: Optional[Finding]) -> Optional[Finding]:
    """``finding``, whose harm is to the gradient, as information where the model ran ``op`` with autograd off
    (a ``torch.no_grad`` block of its own, as GLM-5-Next's sparse-attention indexer): no gradient of the model's
    loss reaches it (:attr:`~initlint.probe.run.ProbeResult.untracked`)."""
    if finding is not None and op.id in audit.probe.untracked:
        finding.message += UNTRACKED
        finding.severity = "info"
    return finding


def measured_rms(audit: AuditContext, op: Op, limit: int = 64) -> Optional[float]:
    """The rms of ``op``'s output, read through views, dropout and identities (which carry no statistics)."""
    src = measured(audit, op, limit, through=_LOOK_THROUGH)
    return audit.op_stats(src).rms if src is not None else None


def gate_factor(audit: AuditContext, op: Op) -> Optional[float]:
    """The fraction of its input's scale that ``op`` lets through when it gates a branch, else ``None``.

    A gate is a multiply by a parameter (``gamma * x``), a multiply by a decay (the exponential of a
    log-domain quantity: a state-space or linear-attention recurrence's ``x * exp(cumsum(g))``), a
    normalisation whose output is far below the unit scale it normalises to (its weight is ~0), or a
    weight layer whose weight is exactly zero. Read from the graph and the measured scales, not from
    class names.
    """
    factor: Optional[float] = None
    signal = None
    if op.kind == "mul" and op.params and len(op.inputs) == 1:
        signal = op.inputs[0]
    elif op.kind == "mul" and not op.params and len(op.inputs) == 2:
        decays = [i for i in op.inputs if _decay(audit.graph, i)]
        signal = next((i for i in op.inputs if i not in decays), None) if len(decays) == 1 else None
    if signal is not None:
        out, inp = measured_rms(audit, op), measured_rms(audit, audit.graph[signal])
        if out is not None and inp and inp > 0 and out == out:
            factor = out / inp
    elif op.kind in O.NORM_KINDS and op.params.get("weight") and not starved(audit, op):
        factor = audit.op_stats(op).get("rms")  # (a norm starved by its epsilon outputs little too, but gates nothing)
    elif op.kind in O.WEIGHT_KINDS:
        weight = audit.probe.params.get(op.params.get("weight", ""), {})
        factor = 0.0 if weight.get("rms") == 0.0 else None
    return factor if factor is not None and factor <= GATE_MAX else None


def rescales_only(audit: AuditContext, op: Op) -> Optional[bool]:
    """Whether ``op`` can only rescale a small signal, never shift it: a weight layer without a bias (or with
    an all-zero one), an activation that is 0 at 0 (ReLU, GELU, SiLU, tanh: linear or homogeneous for a
    small input), a multiply, a view. False for what adds an offset (a bias, a constant, sigmoid's 1/2);
    None for an op that combines signals (its inputs decide)."""
    if op.kind in O.WEIGHT_KINDS or op.kind in ("conv_transpose", "embedding"):
        bias = op.params.get("bias")
        return bias is None or audit.probe.params.get(bias, {}).get("rms") == 0.0
    if op.kind in O.ACTIVATIONS:
        return not O.ACTIVATIONS[op.kind].at_zero
    if op.kind == "add":
        return None if len(op.inputs) > 1 else False
    if op.kind in ("mul", "div", "cat", "matmul"):
        return None if len(op.inputs) > 1 else True
    return op.kind in O.PASS_KINDS


def starved(audit: AuditContext, op: Op) -> bool:
    """Whether the normalisation ``op`` did not normalise: its epsilon outweighs its input's mean square
    (``x / sqrt(mean(x^2) + eps)`` is then about ``x / sqrt(eps)``, and the input's scale passes through).
    Read from the ``eps`` the capture recorded and the input's measured scale, or, for a normalisation
    written as functional ops, from its statistic before and after the epsilon was added."""
    if op.kind not in O.NORM_KINDS or not op.inputs:
        return False
    graph = audit.graph
    eps = op.attrs.get("eps")
    if eps is not None:
        rms = measured_rms(audit, graph[op.inputs[0]])
        return rms is not None and rms == rms and rms * rms < eps
    for i in op.inputs:
        for current in graph.back(graph[i], limit=12):
            if not current.attrs.get("norm_statistic"):
                break
            if current.kind == "add" and len(current.inputs) == 1:
                after, before = measured_rms(audit, current), measured_rms(audit, graph[current.inputs[0]])
                return after is not None and before is not None and after > 2 * before
    return False


def copies(op: Op) -> bool:
    """``dst.copy_(src)``: its output holds the values of its last input."""
    return op.target.rsplit(".", 1)[-1] == "copy_" and len(op.inputs) == 2


_CLAMPS = frozenset({"clamp", "clamp_", "clip", "clip_"})


def unclipped(audit: AuditContext, op: Op) -> bool:
    """A clamp that left its input as it was on the probe batch (its bounds far outside the signal: D-FINE's
    ``query_pos_head(...).clamp(min=-10, max=10)`` on positions of scale 1e-3): its output's rms is its
    input's."""
    if op.target.rsplit(".", 1)[-1] not in _CLAMPS or not op.inputs:
        return False
    out, inp = measured_rms(audit, op), measured_rms(audit, audit.graph[op.inputs[0]])
    return bool(out and inp and abs(out - inp) <= 1e-6 * inp)


def _decay(graph: Graph, op_id: int, limit: int = 8) -> bool:
    """Whether op ``op_id`` is an exponential (``exp``), seen through views and pads of it."""
    for current in graph.back(graph[op_id], limit=limit):
        if current.target.rsplit(".", 1)[-1] in ("exp", "exp_"):
            return True
        if current.kind not in ("view", "pad") or len(current.inputs) != 1:
            return False
    return False


def gated_ops(audit: AuditContext) -> Dict[int, bool]:
    """Op id -> True when every path from the op's output meets a gate (:func:`gate_factor`) before a
    residual addition or the model output: the op sits on a branch that is near identity by design."""
    cached = audit.memo.get("gated_ops")
    if cached is None:
        gates = {op.id for op in audit.graph if gate_factor(audit, op) is not None}
        cached = audit.memo["gated_ops"] = closed_off(audit.graph, {(op.id, u) for op in audit.graph
                                                                    for u in op.users if u in gates})
    return cached


def softmax_gate(audit: AuditContext, op: Op, limit: int = 64) -> bool:
    """A softmax whose output only gates elementwise: every use, through views and dropout, multiplies
    another signal of its own size by it, each element by its own weight (PatchTSMixer's gated attention
    ``h * softmax(W h)``). A product that spreads the weights over another axis of the signal (MobileViTV2's
    separable attention ``(k * softmax(q)).sum(-1)``: one weight per token for every channel) weighs tokens,
    as a matrix product does (``softmax(q k^T) @ v``); neither, nor reaching the model output, is a gate."""
    graph = audit.graph
    size = _numel(audit.shape(op)) if op.kind == "softmax" else None
    if size is None:
        return False
    outputs, stack, seen = set(graph.outputs), [op.id], set()
    while stack:
        current = stack.pop()
        if current in outputs or len(seen) > limit:
            return False
        seen.add(current)
        for user in graph[current].users:
            u = graph[user]
            if u.kind in _LOOK_THROUGH:
                stack.append(user)
            elif not (u.kind == "mul" and len(u.inputs) >= 2 and not u.params and _numel(audit.shape(u)) == size):
                return False
    return True


def _numel(shape: Optional[Tuple[int, ...]]) -> Optional[int]:
    return math.prod(shape) if shape is not None else None


def closed_off(graph: Graph, closed: Set[Tuple[int, int]]) -> Dict[int, bool]:
    """Op id -> True when every path from the op's output passes an edge of ``closed`` (``(producer,
    consumer)`` op ids) before it reaches a merge (an ``add`` of several signals) or the model output.
    One pass over the graph, users first."""
    outputs = set(graph.outputs)
    open_path: Dict[int, bool] = {}  # a path from here reaches a merge or the output through no closed edge
    meets: Dict[int, bool] = {}
    for op in reversed(graph.ops):
        if op.id in outputs or (op.kind == "add" and len(op.inputs) >= 2):
            open_path[op.id], meets[op.id] = True, False
            continue
        shut = [(op.id, u) in closed for u in op.users]
        open_path[op.id] = any(not c and open_path.get(u, False) for u, c in zip(op.users, shut))
        meets[op.id] = any(c or meets.get(u, False) for u, c in zip(op.users, shut))
    return {op.id: bool(op.users) and meets[op.id] and not open_path[op.id] for op in graph}


# ----------------------------------------------------------------------------- transformer structure
def measured(audit: AuditContext, op: Op, limit: int = 16, through: FrozenSet[str] = O.PASS_KINDS) -> Optional[Op]:
    """``op``, or the nearest op before it through first inputs (of the kinds ``through``) whose
    output scale was measured (views and dropout carry no statistics of their own)."""
    for current in audit.graph.back(op, through=through, limit=limit):
        if "rms" in audit.op_stats(current):
            return current
    return None


@dataclass
class Residual:
    """A residual addition ``stream + branch(stream)``."""

    add: Op
    stream: Op
    """The add's input on the stream side (the value the branch was computed from)."""
    branch: Op
    """The add's input on the branch side."""
    layers: List[Op]
    """Weight ops (and attention ops with their own projections) inside the branch, in order."""


def residual_adds(graph: Graph, limit: int = 4000,
                  stream_param: Optional[Callable[[str], bool]] = None) -> List[Residual]:
    """Every ``add`` whose one input is computed from the other through at least one weight layer.

    Ops are numbered in execution order, so the search back from the branch stops at ops
    older than the stream: it visits one block, not the whole model.

    ``stream_param(name)``: whether a parameter added to an op's output is a stream of its own (a matrix of
    positions x width: a DETR decoder's learned queries, not a bias). Such an addition of a branch's output (a
    weight layer's or an attention's: ``query_feat.weight + self_attn(...)``) has no stream op to judge, and what
    enters it by that branch enters the parameter's stream (see :func:`_branch_layers`); a parameter added onto
    a stream (``tgt + query_pos``, positions for the next attention's queries) is no such addition."""
    found: List[Residual] = []
    streams: Dict[int, int] = {}  # a residual add found so far -> its stream
    onto_parameters = set()  # additions of an op's output to a parameter that is a stream of its own
    for op in graph:
        if op.kind == "add" and len(op.inputs) == 1 and stream_param is not None \
                and any(stream_param(name) for name in op.params.values()) and _ends_branch(graph, op.inputs[0]):
            onto_parameters.add(op.id)
            continue
        if op.kind != "add" or len(op.inputs) != 2 or _query_key_only(graph, op):
            continue
        for stream_id, branch_id in (op.inputs, op.inputs[::-1]):
            layers = _branch_layers(graph, stream_id, branch_id, limit, streams, onto_parameters)
            if layers:
                found.append(Residual(op, graph[stream_id], graph[branch_id], layers))
                streams[op.id] = stream_id
                break
    return found


_TO_BRANCH_END = frozenset({"view", "cat"}) | O.PASS_KINDS


def _ends_branch(graph: Graph, op_id: int, limit: int = 8) -> bool:
    """Whether ``op_id`` is, back through views and concatenations, the output of a weight layer or an attention:
    the end of a branch."""
    last = None
    for last in graph.back(graph[op_id], through=_TO_BRANCH_END, limit=limit):
        pass
    return last is not None and (last.kind in O.WEIGHT_KINDS or last.kind == "attention")


def _query_key_only(graph: Graph, op: Op) -> bool:
    """True when the sum is read only as the queries or keys of attentions: SAM's two-way transformer adds its
    prompt tokens to the normalised queries before each attention (``attn(q=queries + pe, k=..., v=queries)``)
    while ``queries`` goes on as the stream. Such a sum is a query with positions, not a stream its operands
    are residual branches of."""
    used = []

    def step(current: Op, user: Op) -> Any:
        if user.kind == "view" or user.kind in O.PASS_KINDS:
            return EXPAND
        if (user.kind in O.WEIGHT_KINDS and "weight" in user.params and _scores_query_key(graph, user)) or (
                user.kind == "attention" and current.id in user.inputs[:2] and current.id not in user.inputs[2:]):
            used.append(user)
            return SKIP
        return False

    return walk_users(graph, op, step, True) and bool(used)


EXPAND, SKIP = "expand", "skip"


def walk_users(graph: Graph, start: Op, step: Callable[[Op, Op], Any], default: bool) -> bool:
    """Walk the ops that read ``start``'s output, each once: ``step(current, user)`` says ``EXPAND`` (go on
    through ``user``), ``SKIP`` (not through it), or ends the walk with a verdict (True or False); ``default``
    when the walk runs out."""
    frontier, seen = [start], {start.id}
    while frontier:
        current = frontier.pop()
        for user in graph.consumers(current):
            if user.id in seen:
                continue
            seen.add(user.id)
            verdict = step(current, user)
            if verdict == EXPAND:
                frontier.append(user)
            elif verdict != SKIP:
                return bool(verdict)
    return default


def _scores_query_key(graph: Graph, start: Op) -> bool:
    """True when ``start``'s output goes, through views and scalings, only into the scores of attention: an
    attention op's query or key, or a product whose output a softmax reads."""
    frontier, seen = [start], {start.id}
    while frontier:
        current = frontier.pop()
        users = graph.consumers(current)
        if not users:
            return False
        for user in users:
            if user.id in seen:
                continue
            seen.add(user.id)
            if user.kind == "attention":
                if current.id not in user.inputs[:2] or current.id in user.inputs[2:]:
                    return False
            elif O.is_product(user):
                if not _into_softmax(graph, user):
                    return False
            elif user.kind in ("view", "mul", "div") or user.kind in O.PASS_KINDS:
                frontier.append(user)
            else:
                return False
    return True


def _into_softmax(graph: Graph, op: Op) -> bool:
    return reads_into(graph, op, {"softmax"}, {"view", "mul", "div", "add"} | O.PASS_KINDS, 6)


def reads_into(graph: Graph, op: Op, targets: Set[str], through: Set[str], limit: int) -> bool:
    """True when ``op``'s output goes, each op read by one op alone and of a kind in ``through``, into an op of a
    kind in ``targets`` within ``limit`` steps."""
    current = op
    for _ in range(limit):
        users = graph.consumers(current)
        if len(users) != 1:
            return False
        current = users[0]
        if current.kind in targets:
            return True
        if current.kind not in through:
            return False
    return False


def _branch_layers(graph: Graph, stream_id: int, branch_id: int, limit: int,
                   streams: Optional[Dict[int, int]] = None, onto_parameters: Optional[Set[int]] = None) -> List[Op]:
    """Weight layers on the paths from ``stream_id`` to ``branch_id`` (empty: not a branch of it).

    Not a branch either when every path enters an earlier residual addition (``streams``: add -> its
    stream) by its branch alone: the value is then that addition's stream plus what the candidate
    contributed to its branch. RT-DETR's decoder adds its query positions to the output of the block
    before (``with_pos_embed(hidden_states, position_embeddings)``), and those positions had entered that
    block only through its queries and keys: the sum is a query, not the positions' residual branch. A path
    does not go on through an addition onto a parameter that is a stream of its own (``onto_parameters``):
    RF-DETR's first block adds its positions to its learned queries (a parameter) for the queries and keys,
    and adds the attention's output to them; the positions reach the block's output through those additions
    alone. DETR's first block reads its stream as values too, and stays its branch."""
    if branch_id <= stream_id:
        return []
    ancestors = set()
    stack = [branch_id]
    while stack and len(ancestors) < limit:
        i = stack.pop()
        if i in ancestors or i < stream_id:
            continue
        ancestors.add(i)
        stack.extend(graph[i].inputs)
    if stream_id not in ancestors:
        return []
    reached = {stream_id}
    for i in sorted(ancestors):
        if i != stream_id and i not in (onto_parameters or ()) and any(j in reached for j in graph[i].inputs):
            reached.add(i)
    if onto_parameters and branch_id not in reached:
        return []
    if streams and any(streams[i] not in reached for i in reached if i in streams and i != stream_id):
        return []
    # the stream's own op is not the branch's: FNet's ``x + fft(x).real`` (x a projection's output) has
    # no weight layer of its own, and its Fourier mixing's scale is no init's to fix
    return [graph[i] for i in sorted(reached) if i != stream_id
            and (graph[i].kind in O.WEIGHT_KINDS or (graph[i].kind == "attention" and graph[i].params))]


@dataclass
class Scores:
    """An explicit attention pattern ``softmax(q @ k^T * scale + mask)`` found in the graph."""

    softmax: Op
    matmul: Op
    """The ``q @ k^T`` op (a matmul of two signals)."""
    q: Op
    k: Op
    """The matmul's two inputs."""
    scale: float
    """The factor between the matmul and the softmax (measured as a ratio of scales, or the
    constant of a ``mul``/``div``), times any constant applied to q or k before the matmul."""
    pre_scale: float
    """The part of ``scale`` applied before the matmul (already inside the matmul's scale)."""
    head_dim: int


_SCORE_PATH = frozenset({"add", "mul", "div", "view", "other", "dropout", "identity", "pad"})


def attention_scores(audit: AuditContext, softmax: Op) -> Optional[Scores]:
    """The attention pattern behind ``softmax``, or None when its input is not ``q @ k^T`` of two signals.

    Searches back from the softmax's input through masks, scales and views (at most 12 steps on
    a path): a mask added to the scores is a side branch that leads to no such product."""
    graph = audit.graph
    stack: List[Tuple[Op, Tuple[Op, ...]]] = [(graph[i], ()) for i in softmax.inputs[:1]]
    visits = 0
    while stack and visits < 64:
        current, chain = stack.pop()
        visits += 1
        if current.kind == "matmul" and len(current.inputs) >= 2 and not current.params:
            return _scores(audit, softmax, current, list(chain))
        if current.kind not in _SCORE_PATH or len(chain) >= 12:
            continue
        stack.extend((graph[i], chain + (current,)) for i in reversed(current.inputs))
    return None


def _scores(audit: AuditContext, softmax: Op, matmul: Op, chain: List[Op]) -> Optional[Scores]:
    graph = audit.graph
    q, k = graph[matmul.inputs[-2]], graph[matmul.inputs[-1]]
    q_shape = audit.shape(q)
    head_dim = q_shape[-1] if q_shape else None
    if not head_dim or head_dim < 2:
        return None
    post = 1.0
    for op in reversed(chain):  # the ops right after the matmul, up to the first mask or non-scale op
        if op.kind in ("view", "dropout", "identity"):
            continue
        if op.kind not in ("mul", "div"):
            break
        post *= _factor(audit, op)
    pre = 1.0
    for side in (q, k):
        pre *= _constant_factors(graph, side)
    pre *= float(matmul.attrs.get("scalar", 1.0))
    return Scores(softmax, matmul, q, k, pre * post, pre, int(head_dim))


def _factor(audit: AuditContext, op: Op) -> float:
    """The factor a ``mul``/``div`` applies: its constant, else the ratio of output and input scales."""
    if "scalar" in op.attrs:
        return float(op.attrs["scalar"])
    src = measured(audit, audit.graph[op.inputs[0]]) if op.inputs else None
    out, inp = audit.op_stats(op).get("rms"), audit.op_stats(src).get("rms") if src is not None else None
    return out / inp if out and inp else 1.0


def _constant_factors(graph: Graph, op: Op, limit: int = 8) -> float:
    """Constants multiplied into q or k between their projection and the matmul (``q * scale``)."""
    factor = 1.0
    for current in graph.back(op, through=_SCALED_VIEW, limit=limit):
        if current.kind in O.WEIGHT_KINDS or not current.inputs:
            break
        if current.kind in ("mul", "div"):
            if "scalar" not in current.attrs:
                break
            factor *= float(current.attrs["scalar"])
    return factor


_SCALED_VIEW = frozenset({"view", "dropout", "identity", "mul", "div"})


_PROJECTION_PATH = frozenset({"view", "dropout", "identity", "mul", "div", "add", "cat", "pad", "other"})


def projection_of(graph: Graph, op_id: Optional[int], limit: int = 24) -> Optional[Op]:
    """The weight layer that produced the queries or keys held by op ``op_id``, through views,
    head splits and rotary embeddings (``q * cos + rotate_half(q) * sin``); None past a norm."""
    if op_id is None:
        return None
    for current in graph.back(graph[op_id], through=_PROJECTION_PATH, limit=limit):
        if current.kind in O.WEIGHT_KINDS and "weight" in current.params:
            return current
    return None


def shared_by(graph: Graph, name: str) -> List[Op]:
    """Ops of different modules that use the parameter ``name`` (a tied embedding and output head)."""
    users: Dict[str, Op] = {}
    for op in graph:
        if name in op.params.values() and op.module not in users:
            users[op.module] = op
    return list(users.values())


def _matrix(audit: AuditContext, name: str) -> bool:
    """Whether parameter ``name`` is a matrix of positions x width (two axes longer than 1), not a bias."""
    p = audit.param(name)
    return p is not None and p.dim() >= 2 and p.shape[-1] > 1 and p.shape[-2] > 1


def residuals_of(audit: AuditContext) -> List[Residual]:
    """:func:`residual_adds` of the audited graph, computed once per audit (IL012 and IL013 share it)."""
    cached = audit.memo.get("residual_adds")
    if cached is None:
        cached = audit.memo["residual_adds"] = residual_adds(audit.graph, stream_param=lambda n: _matrix(audit, n))
    return cached


# ------------------------------------------------------------------ repairs (initlint.fix)
SPAN_TOLERANCE = 2.0
"""A layer of a drifting span that no finding names is rescaled only when its own gain (output
rms over input rms on the probe batch) is further than this factor from 1."""
SYMPTOM_MAX_FACTOR = 4.0
"""The largest factor (either way) a symptom repair (signal drift, gradient drift, saturation) applies
to a layer: the causes are repaired first, so what remains are layers whose scale the init-scale rule
accepts, and a measured factor far beyond that (a narrow layer whose few live units carry a tiny signal
asks for 1e4) would trade the symptom for an init-scale finding."""


def activation_gain(graph: Graph, op: Op) -> float:
    """Gain of the activation after ``op`` (the low end of its band; 1 when none follows)."""
    act = next((t for t in downstream(graph, op) if t.kind in O.ACTIVATIONS), None)
    return O.ACTIVATIONS[act.kind].band(act.attrs)[0] if act is not None else 1.0


def segment_ops(graph: Graph, op: Op) -> List[Op]:
    """Weight layers in the normalisation-free stretch of the network that holds ``op``, in order."""
    start: Dict[int, int] = {}
    for o in graph:
        start[o.id] = o.id if (o.kind in O.NORM_KINDS or not o.inputs) else start.get(o.inputs[0], o.inputs[0])
    return [o for o in graph if start[o.id] == start[op.id] and o.kind in O.WEIGHT_KINDS and "weight" in o.params]


def lsuv_stretch(plan: RepairPlan, module: str, rule: str, why: str, *, from_layer: bool,
                 fallback: Callable[[Op], Optional[float]]) -> None:
    """LSUV on the layers of the stretch holding ``module``'s weight layer, each left alone while its
    own gain stays within ``SPAN_TOLERANCE``; with ``from_layer``, only from that layer on, and that
    layer always rescaled. ``fallback(op)``: the std to draw where no hook can measure the layer."""
    op = plan.weight_op(module)
    if op is None:
        return
    for layer in segment_ops(plan.graph, op):
        if from_layer and layer.id < op.id:
            continue
        plan.lsuv(layer, rule, why, tolerance=1.0 if from_layer and layer.id == op.id else SPAN_TOLERANCE,
                  max_factor=SYMPTOM_MAX_FACTOR, fallback_std=fallback(layer))


BRANCH_GAIN_MAX = 3.0
"""A weight layer whose gain ``std * sqrt(fan_in)`` exceeds this is off in scale: twice He's sqrt(2) for
ReLU, and well above every default init of a transformer (GPT-2's 0.02 at width 768 is 0.55, PyTorch's
``nn.Linear`` 0.58, Llama's 0.02 at width 4096 is 1.28)."""


def gain_of(audit: AuditContext, op: Op, name: Optional[str] = None) -> Tuple[float, int]:
    """``(std * sqrt(fan_in), fan_in)`` of ``op``'s weight (or of the parameter ``name``, stored ``(out, in, ...)``)."""
    name = name or op.params.get("weight", "")
    weight = audit.param(name)
    if weight is None or weight.dim() < 2:
        return 0.0, 1
    fan = (audit.fan_in(op) if name == op.params.get("weight") else None) or int(weight[0].numel())
    std = float(weight.detach().float().pow(2).mean().sqrt())
    return std * math.sqrt(fan), fan


def reference_std(plan: RepairPlan, op: Op, name: Optional[str] = None) -> float:
    """The std a weight layer off in scale is redrawn with: the median std of its peers (the parameters of the
    same shape whose names differ only in block numbers, ``h.0.mlp.c_fc.weight`` for ``h.1.mlp.c_fc.weight``)
    when they are of a sound scale, else ``gain / sqrt(fan_in)`` for the activation after it."""
    name = name or op.params["weight"]
    weight = plan.ctx.param(name)
    gain, fan = gain_of(plan.ctx, op, name)
    pattern = re.sub(r"\d+", "#", name)
    peers = sorted(float(p.detach().float().pow(2).mean().sqrt()) for n, p in plan.ctx.model.named_parameters()
                   if n != name and weight is not None and p.shape == weight.shape and re.sub(r"\d+", "#", n) == pattern)
    if peers:
        median = peers[len(peers) // 2]
        if 0 < median * math.sqrt(fan) <= BRANCH_GAIN_MAX:
            return median
    return activation_gain(plan.graph, op) / math.sqrt(fan)


def output_weight(op: Op) -> Optional[str]:
    """The weight of a branch's last layer: its own, or an attention op's output projection."""
    if op.kind == "attention":  # nn.MultiheadAttention: its output projection is inside the op
        return next((n for n in op.params.values() if n.endswith("out_proj.weight")), None)
    return op.params.get("weight")


def self_residual_count(audit: AuditContext) -> int:
    """The residual additions of the model (``2 L`` in a transformer of ``L`` blocks), at least 1."""
    return max(1, len(residuals_of(audit)))


def shrink_branch(plan: RepairPlan, res: Residual, rule: str, why: str, zero_end: bool = False) -> None:
    """Repair a residual branch that dwarfs its stream. A layer of the branch whose gain exceeds
    ``BRANCH_GAIN_MAX`` is off: it is redrawn at :func:`reference_std` (the branch's last layer is not to
    blame for an oversized layer before it). With no such layer, the last layer gets the depth-aware init:
    its textbook std ``1 / sqrt(fan_in)`` over ``sqrt(N)`` for the model's ``N`` residual additions
    (GPT-2's ``1 / sqrt(2 * n_layer)``), so that the ``N`` branches together add about one layer's variance;
    never larger than it is. With ``zero_end``, a last layer whose output reaches the addition and nothing
    else (:func:`zeroable_end`) is zeroed instead, weight and bias: the block starts as the identity."""
    layers = [(op, output_weight(op)) for op in res.layers]
    layers = [(op, name) for op, name in layers if name and plan.ctx.param(name) is not None]
    if not layers:
        return
    off = [(op, name) for op, name in layers if gain_of(plan.ctx, op, name)[0] > BRANCH_GAIN_MAX]
    for op, name in off:
        own = name == op.params.get("weight")
        gain, _ = gain_of(plan.ctx, op, name)
        std = reference_std(plan, op, name)
        plan.redraw(op, std, rule, f"{why}: {op.module or '<model>'} has gain {fmt(gain)} (std x sqrt(fan_in); "
                    f"limit {fmt(BRANCH_GAIN_MAX)}), redrawn at std {fmt(std)}", param=None if own else name)
    if off:
        return
    proj, name = layers[-1]
    if zero_end and zeroable_end(plan.ctx, res, proj, name):
        for param in (name, name[:-len("weight")] + "bias"):
            if plan.ctx.param(param) is not None:
                plan.zero(param, proj.module, rule, f"{why}: the branch's last layer starts at zero, so the block "
                          f"starts as the identity")
        return
    gain, fan = gain_of(plan.ctx, proj, name)
    adds = self_residual_count(plan.ctx)
    std = 1.0 / math.sqrt(fan * adds)
    now = gain / math.sqrt(fan)
    if now > std:
        plan.redraw(proj, std, rule, f"{why}: 1/sqrt(fan_in {fan}) / sqrt({adds} residual additions), "
                    f"weight std {fmt(now)} -> {fmt(std)}", param=None if name == proj.params.get("weight") else name)


def zeroable_end(audit: AuditContext, res: Residual, proj: Op, name: str) -> bool:
    """Whether zeroing ``proj``'s weight (``name``) makes the branch exactly zero and touches nothing else:
    the weight is used by this op alone, and the op's output reaches the addition through views and
    dropout only, consumed by nothing else on the way."""
    if sum(1 for op in audit.graph if name in op.params.values()) != 1:
        return False  # tied or shared: zeroing it changes other layers too
    current = proj
    for _ in range(16):
        consumers = audit.graph.consumers(current)
        if len(consumers) != 1:
            return False
        current = consumers[0]
        if current.id == res.add.id:
            return True
        if current.kind not in ("view", "dropout", "identity"):
            return False  # a pool or a concatenation would mix the zeros with other values
    return False
