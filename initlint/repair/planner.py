"""``initlint.fix``: re-initialise what the findings blame, re-audit, and hand the repair back as code.

Each rule carries its own repair: a :class:`~initlint.rules.base.Rule` subclass that implements
``repair(self, plan, finding, module)`` makes its findings repairable (a plugin rule the same way),
and this module holds only the planner machinery. ``repair`` reads the finding and the audit
and asks the plan (a :class:`Planner`, the interface ``rules/base.py`` declares as ``RepairPlan``)
for steps on parameters:

- ``plan.redraw(op, std, rule, why)``: a fresh ``nn.init`` draw with ``std``, in the parameter's
  own distribution family (normal or uniform), from a generator seeded with ``seed``;
- ``plan.zero(name, module, rule, why)``: ``nn.init.zeros_`` (a bias that kills units, a ``randn`` bias);
- ``plan.scale(op, factor, rule, why)``: a factor the rule computed from its measurements;
- ``plan.lsuv(op, rule, why, ...)``: a factor measured on the probe batch after the round's
  other steps, layer after layer (layer-sequential unit variance);
- ``plan.note(text)``: a sentence about what is not repaired, and why;

and reads ``plan.graph``, ``plan.ctx`` (the audit), ``plan.judged(RuleClass)`` (another rule's
findings by module, with the user's options), ``plan.weight_op(module)``, ``plan.through_cause(finding)``
and ``plan.data_driven(op)``. A rule whose finding another repair usually removes sets
``repair_after_causes = True``; ``Rule.repairs(finding)`` says which findings a repair can act on.

``method`` decides how a layer's scale is repaired: ``analytic`` from its fans and the gain
of its activation (the init-scale rule's own target), ``lsuv`` from measurements, ``auto`` analytic where
the gain is known and measured where it is not (custom activations, residual branches).

Every step is applied in place under ``torch.no_grad`` and written into
:meth:`FixReport.code` in the same order, so the code applied to an identical fresh
instance gives the same weights bit for bit. Root causes (a weight's scale or symmetry, a bias
that kills units) are repaired first; the repairs that wait for causes run in a round in which
no cause was repaired, or in the last one. At most three audits run: before, after the causes,
after the symptoms. Findings no init repairs (a bias before a norm) stay, with their code change.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch
import torch.nn as nn

from ..capture import ops as O
from ..capture.graph import Op
from ..report.findings import Finding, Report
from ..rules.base import AuditContext, downstream, fmt, py_path
from ..version import __version__

METHODS = ("auto", "analytic", "lsuv")
MAX_ROUNDS = 2
"""Repair rounds; each is followed by an audit, so ``fix`` runs at most ``MAX_ROUNDS + 1`` audits."""
LSUV_TARGET = 1.0
"""Root mean square a data-driven rescale gives a layer's output (LSUV's unit variance)."""
NAMED_GAINS = {"relu": math.sqrt(2.0), "linear": 1.0, "tanh": 5.0 / 3.0, "selu": 0.75}
"""Gains that ``nn.init.kaiming_*_`` knows by name: a redraw with one of them is written that way."""



def _rule_of(code: str) -> Any:
    from ..rules import all_rules

    return all_rules().get(code)


def repairable(finding: Finding) -> bool:
    """A warning or error whose rule has a repair that can act on it."""
    rule = _rule_of(finding.code)
    return finding.severity != "info" and rule is not None and rule.repairs(finding)


# ------------------------------------------------------------------------------------ results
@dataclass
class CallStep:
    """The model's own init method called on one of its modules (``RepairPlan.call``): it writes
    ``params`` as the model's authors wrote the init, block-level scalings included."""

    call: Any
    """Has ``apply(model, seed)``, ``source()`` (one line) and ``code(seed)`` (the lines that run it)."""
    params: List[str]
    rule: str
    module: str
    why: str


# ------------------------------------------------------------------------------------ results
@dataclass
class Change:
    """One parameter that ``fix`` changed."""

    name: str
    """Qualified parameter name (``layers.3.weight``)."""
    rule: str
    """The code(s) of the finding(s) that asked for it (one code, or two joined by a comma when two did)."""
    module: str
    before_std: float
    """Measured std of the parameter before the fix."""
    after_std: float
    """Measured std after it."""
    init: str
    """The call(s) used, as written in :meth:`FixReport.code` (``; ``-separated when several)."""
    reason: str


@dataclass
class Step:
    """One in-place operation on one parameter; rendered into the code exactly as applied."""

    param: str
    call: str
    """``mul_`` (scale factor), ``zeros_`` or an ``nn.init`` function drawing from the generator."""
    kwargs: Dict[str, Any]
    rule: str
    module: str
    why: str

    def source(self, ref: str, gen: str = "gen") -> str:
        """The line of Python that performs this step on the parameter expression ``ref``."""
        if self.call == "mul_":
            return f"{ref}.mul_({self.kwargs['factor']!r})"
        if self.call == "zeros_":
            return f"nn.init.zeros_({ref})"
        with_gen = f", generator={gen})" if gen else ")"
        if self.call.startswith("."):  # a tensor method: nn.init of this torch takes no generator
            args = ", ".join(repr(v) for v in self.kwargs.values())
            return f"{ref}{self.call}({args}" + with_gen
        args = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"nn.init.{self.call}({ref}{args}" + with_gen

    def apply(self, param: torch.Tensor, generator: Optional[torch.Generator]) -> None:
        """Perform the step in place, exactly as :meth:`source` writes it."""
        if self.call == "mul_":
            param.mul_(self.kwargs["factor"])
        elif self.call == "zeros_":
            nn.init.zeros_(param)
        elif self.call.startswith("."):
            getattr(param, self.call[1:])(*self.kwargs.values(), generator=generator)
        else:
            getattr(nn.init, self.call)(param, **self.kwargs, generator=generator)

    @property
    def draws(self) -> bool:
        """Consumes the generator."""
        return self.call not in ("mul_", "zeros_")


@dataclass
class FixReport:
    """What :func:`fix` did: the audits before and after, the changed parameters, the code."""

    model: str
    before: Report
    after: Report
    changes: List[Change] = field(default_factory=list)
    method: str = "auto"
    seed: int = 0
    audits: int = 1
    """Audits run (at most 3)."""
    notes: List[str] = field(default_factory=list)
    steps: List[Step] = field(default_factory=list)
    calls: List[CallStep] = field(default_factory=list)

    @property
    def remaining(self) -> List[Finding]:
        """Warnings and errors left after the fix that their rule's repair can act on."""
        return [f for f in self.after.findings if repairable(f)]

    @property
    def unrepairable(self) -> List[Finding]:
        """Warnings and errors no init can repair (a bias before a norm): the code change is in ``fix``."""
        return [f for f in self.after.findings if f.severity != "info" and not repairable(f)]

    @property
    def fixed(self) -> bool:
        """No repairable finding remains."""
        return not self.remaining and not self.after.error

    def code(self) -> str:
        """Self-contained Python source defining ``apply_initlint_fixes(model)``."""
        return render_code(self)

    def summary(self) -> str:
        """The before/after summary ``initlint fix`` prints."""
        return render_summary(self)


# ------------------------------------------------------------------------------------ the API
def fix(model: nn.Module, example_inputs: Any = None, *, method: str = "auto", select: Optional[Iterable[str]] = None,
        ignore: Optional[Iterable[str]] = None, seed: int = 0, **audit_options: Any) -> FixReport:
    """Audit ``model``, re-initialise in place only what the findings blame, and re-audit.

    ``method``: ``analytic`` (fans and gains: the std the init-scale rule computes), ``lsuv`` (scale
    factors measured on the probe batch, layer after layer) or ``auto`` (analytic where the
    gain of the next activation is known, LSUV for custom activations and residual
    branches). ``seed`` seeds the generator of fresh draws and the probe. Other keywords
    (``device``, ``logits``, ``input_shapes``, ``rule_options``, ...) go to
    :func:`initlint.audit`. A model with nothing to repair is left bit for bit as it was.
    """
    from ..api import UsageError, audit, unwrap

    if method not in METHODS:
        raise UsageError(f"unknown fix method '{method}'; use {', '.join(METHODS)}")
    if not isinstance(model, nn.Module) and not hasattr(model, "_orig_mod"):
        raise UsageError(f"initlint.fix expects an nn.Module, got {type(model).__name__}")
    target = unwrap(model)
    if any(p.device.type == "meta" for p in target.parameters()):
        raise UsageError("the model is on the meta device (its tensors hold no values); materialise it with "
                         "model.to_empty(device='cpu') and initialise it before fixing")
    options = dict(audit_options, select=select, ignore=ignore, seed=seed)

    def run_audit() -> Report:
        return audit(target, example_inputs, **options)

    return _Fixer(target, example_inputs, method, seed, options, run_audit).run()


class _Fixer:
    """The rounds of one :func:`fix` call."""

    def __init__(self, model: nn.Module, example_inputs: Any, method: str, seed: int, options: Dict[str, Any],
                 run_audit: Callable[[], Report]) -> None:
        self.model, self.example_inputs, self.method, self.seed = model, example_inputs, method, seed
        self.options, self.run_audit = options, run_audit
        self.steps: List[Step] = []
        self.calls: List[CallStep] = []
        self.acted: Set[str] = set()  # modules repaired so far (a symptom linked to one is handled through it)
        self.notes: List[str] = []
        self._gen: Optional[torch.Generator] = None
        self._before_std: Dict[str, float] = {}

    def run(self) -> FixReport:
        before = report = self.run_audit()
        audits = 1
        for round_no in range(1, MAX_ROUNDS + 1):
            if not _repairable(report):
                break
            planner = Planner(self, report, last=round_no == MAX_ROUNDS)
            planner.plan()
            if not self.execute(planner):
                break
            report = self.run_audit()
            audits += 1
        name = self.options.get("name") or type(self.model).__name__
        return FixReport(model=name, before=before, after=report, changes=self.changes(), method=self.method,
                         seed=self.seed, audits=audits, notes=self.notes, steps=list(self.steps),
                         calls=list(self.calls))

    # -------------------------------------------------------------------- applying steps
    def execute(self, planner: "Planner") -> bool:
        """Apply the planner's direct steps, then measure and apply its LSUV requests; False if nothing changed."""
        count = len(self.steps) + len(self.calls)
        for call in planner.calls:
            self.apply_call(call)
        for step in planner.ordered(planner.steps):
            self.apply(step)
        if planner.requests:
            for step in measure_lsuv(self.model, self.probe_inputs(), planner.ordered_requests(), self.seed):
                self.apply(step)
        self.notes.extend(n for n in planner.notes if n not in self.notes)
        return len(self.steps) + len(self.calls) > count

    def apply_call(self, call: CallStep) -> None:
        for name in call.params:
            if name not in self._before_std:
                self._before_std[name] = _std(self.model.get_parameter(name))
        call.call.apply(self.model, self.seed)
        self.calls.append(call)
        self.acted.add(call.module)

    def apply(self, step: Step) -> None:
        param = self.model.get_parameter(step.param)
        if step.param not in self._before_std:
            self._before_std[step.param] = _std(param)
        with torch.no_grad():
            step.apply(param, self.generator(param.device) if step.draws else None)
        self.steps.append(step)
        self.acted.add(step.module)

    def generator(self, device: torch.device) -> torch.Generator:
        """One generator for every fresh draw, on the device of the first parameter drawn (as in the code)."""
        if self._gen is None:
            self._gen = torch.Generator(device=device).manual_seed(self.seed)
        return self._gen

    def probe_inputs(self) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """The probe batch the audit uses, on the model's device."""
        from ..api import model_device
        from ..inputs.load import DEFAULT_BATCH, infer_inputs, move_inputs, normalise_inputs, shaped_inputs

        dev = model_device(self.model)
        drawn_on = None if dev.type == "meta" else dev
        if self.example_inputs is not None:
            args, kwargs = normalise_inputs(self.example_inputs)
        elif self.options.get("input_shapes"):
            args, kwargs = shaped_inputs(self.options["input_shapes"], self.model, self.seed, drawn_on), {}
        else:
            batch = int(self.options.get("batch_size") or DEFAULT_BATCH)
            args, kwargs = infer_inputs(self.model, batch, self.seed, drawn_on)
        return move_inputs(args, dev), move_inputs(kwargs, dev)

    def changes(self) -> List[Change]:
        by_param: Dict[str, List[Step]] = {}
        for step in self.steps:
            by_param.setdefault(step.param, []).append(step)
        out = []
        for call in self.calls:
            for name in call.params:
                out.append(Change(name=name, rule=call.rule, module=call.module, before_std=self._before_std[name],
                                  after_std=_std(self.model.get_parameter(name)), init=call.call.source(),
                                  reason=call.why))
        for name, steps in by_param.items():
            rules = ", ".join(dict.fromkeys(s.rule for s in steps))
            out.append(Change(name=name, rule=rules, module=steps[0].module, before_std=self._before_std[name],
                              after_std=_std(self.model.get_parameter(name)),
                              init="; ".join(s.source(py_path(name), gen="") for s in steps),
                              reason="; ".join(dict.fromkeys(s.why for s in steps))))
        return out


def _std(t: torch.Tensor) -> float:
    return float(t.detach().float().std(unbiased=False)) if t.numel() else 0.0


def _repairable(report: Report) -> bool:
    return any(repairable(f) for f in report.findings)


# ------------------------------------------------------------------------------------ planning
@dataclass
class LsuvRequest:
    """Rescale a weight layer so that its output (bias excluded) has rms ``target`` on the probe batch."""

    op: Op
    rule: str
    why: str
    shrink_only: bool = False
    tolerance: float = 1.0
    """Leave the layer alone when its factor is within this ratio of 1 (1: always rescale)."""
    max_factor: Optional[float] = None
    """At most this factor either way (symptom repairs of layers whose scale the init-scale rule accepts)."""


class Planner:
    """What one round repairs: the rules' ``repair`` methods add steps and LSUV requests through it
    (the interface ``rules/base.py`` declares as ``RepairPlan``)."""

    lsuv_target = LSUV_TARGET

    def __init__(self, fixer: _Fixer, report: Report, last: bool) -> None:
        self.fixer, self.report, self.last = fixer, report, last
        self.method = fixer.method
        self.graph = report.graph
        self.ctx = AuditContext(model=fixer.model, graph=report.graph, probe=report.probe,
                         logits=bool(fixer.options.get("logits")))
        self.steps: List[Step] = []
        self.calls: List[CallStep] = []
        self.requests: List[LsuvRequest] = []
        self.notes: List[str] = []
        self._planned: Set[str] = set()
        self._judged: Dict[str, Dict[str, Finding]] = {}

    def plan(self) -> None:
        findings = [(f, _rule_of(f.code)) for f in self.report.findings if repairable(f)]
        for f, rule in findings:
            if not rule.repair_after_causes:
                self._handle(f, rule)
        if (self.steps or self.calls or self.requests) and not self.last:
            return  # the re-audit judges the symptoms once their causes are repaired
        # a symptom at one place names its layer; one about a stretch (drift through depth) is measured over
        # every layer of the stretch and often follows from the other: it waits for their re-audit
        for stretch in (False, True):
            if stretch and (self.steps or self.calls or self.requests) and not self.last:
                return
            for f, rule in findings:
                if rule.repair_after_causes and bool(rule.stretch) == stretch and not self.through_cause(f):
                    self._handle(f, rule)

    def _handle(self, finding: Finding, rule: Any) -> None:
        """One finding's repair. A repair that raises (a plugin's too) leaves that finding unrepaired and
        says so, as a rule whose check raises gives the rule-error finding: the other repairs go on."""
        instance = rule(**self.rule_options(rule))
        for module in finding.members or [finding.module]:
            try:
                instance.repair(self, finding, module)
            except Exception as exc:  # noqa: BLE001  the user's or a plugin's code
                self.note(f"{finding.code} at {module or '<model>'} was not repaired: its repair raised "
                          f"{type(exc).__name__}: {exc}")

    # -------------------------------------------------------------------- what repairs read
    @property
    def acted(self) -> Set[str]:
        """Modules repaired in earlier rounds."""
        return self.fixer.acted

    def through_cause(self, finding: Finding) -> bool:
        """True when a cause the finding links to (``caused_by``) was repaired in this or an earlier round."""
        touched = self.fixer.acted | self._planned
        return any(ref.split(" ", 1)[1] in touched for ref in finding.caused_by if " " in ref)

    def weight_op(self, module: str) -> Optional[Op]:
        """The first weight layer (Linear, Conv, Conv1D) of ``module``."""
        return next((op for op in self.graph if op.module == module and op.kind in O.WEIGHT_KINDS
                     and "weight" in op.params), None)

    def ops_of(self, module: str, kinds: Iterable[str]) -> List[Op]:
        """The ops of ``module`` of these kinds."""
        kinds = set(kinds)
        return [op for op in self.graph if op.module == module and op.kind in kinds]

    def judged(self, rule: Any) -> Dict[str, Finding]:
        """Module -> ``rule``'s own finding there, before grouping (run once per round with the user's options)."""
        if rule.code not in self._judged:
            ctx = AuditContext(model=self.ctx.model, graph=self.graph, probe=self.ctx.probe, logits=self.ctx.logits)
            self._judged[rule.code] = {f.module: f for f in rule(**self.rule_options(rule)).check(ctx)}
        return self._judged[rule.code]

    def rule_options(self, rule: Any) -> Dict[str, Any]:
        """The options the user gave ``rule`` (by name or code)."""
        return rule_options(self.fixer.options, rule)

    def data_driven(self, op: Op) -> bool:
        """Whether ``method`` asks for a measured (LSUV) rescale of ``op`` rather than fans and gains."""
        if self.method != "auto":
            return self.method == "lsuv"
        return not gain_known(self.graph, op) or residual_branch(self.graph, op)

    # -------------------------------------------------------------------- what repairs ask for
    def redraw(self, op: Op, std: float, rule: str, why: str, param: Optional[str] = None) -> None:
        """A fresh draw of ``op``'s weight (or ``param``) with ``std``, in its distribution family."""
        name = param or op.params["weight"]
        if not self._claim(name, op.module):
            return
        tensor = self.ctx.param(name)
        fan = self.ctx.fan_in(op) if param is None else _fan_in(tensor)
        call, kwargs = init_call(family(tensor), std, fan or 1, tensor)
        self.steps.append(Step(name, call, kwargs, rule, op.module, why))

    def zero(self, name: str, module: str, rule: str, why: str) -> None:
        """``nn.init.zeros_`` on the parameter ``name``."""
        if self._claim(name, module):
            self.steps.append(Step(name, "zeros_", {}, rule, module, why))

    def scale(self, op: Op, factor: float, rule: str, why: str, param: Optional[str] = None) -> None:
        """A factor the rule computed, on ``op``'s weight (or ``param``)."""
        name = param or op.params["weight"]
        if factor != 1.0 and math.isfinite(factor) and factor > 0 and self._claim(name, op.module):
            self.steps.append(Step(name, "mul_", {"factor": float(factor)}, rule, op.module, why))

    def lsuv(self, op: Op, rule: str, why: str, *, shrink_only: bool = False, tolerance: float = 1.0,
             max_factor: Optional[float] = None, fallback_std: Optional[float] = None) -> None:
        """Rescale ``op`` from its output measured on the probe batch (its module must be a Linear, Conv or
        Conv1D called as itself); otherwise a redraw with ``fallback_std`` when given, else a note."""
        if not lsuv_possible(self.ctx.model, op):
            if fallback_std is not None and not shrink_only:
                self.redraw(op, fallback_std, rule, why)
            else:
                self.note(f"{rule} {op.module or '<model>'}: its weight is not a Linear/Conv module's own, so it "
                          f"cannot be rescaled from measurements")
            return
        if self._claim(op.params["weight"], op.module):
            self.requests.append(LsuvRequest(op, rule, why, shrink_only, tolerance, max_factor))

    def call(self, declared: Any, params: Sequence[str], rule: str, why: str, module: str = "") -> None:
        """Run the model's own init method ``declared`` (``apply(model, seed)``, ``source()``, ``code(seed)``),
        which writes ``params``; once per round for the same call, and not over a parameter another step
        of this round claimed."""
        params = [n for n in params if n not in {s.param for s in self.steps}]
        if not params or any(c.call == declared for c in self.calls):
            return
        self.calls.append(CallStep(declared, params, rule, module, why))
        self._planned.add(module)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _claim(self, name: str, module: str) -> bool:
        """One step per parameter and round; the first repair to ask wins."""
        if name in {s.param for s in self.steps} or name in {r.op.params["weight"] for r in self.requests}:
            return False
        self._planned.add(module)
        return True

    def ordered(self, steps: Sequence[Step]) -> List[Step]:
        """In execution order of the graph (the order the generator is consumed in)."""
        first = {}
        for op in self.graph:
            for name in op.params.values():
                first.setdefault(name, op.id)
        return sorted(steps, key=lambda s: first.get(s.param, len(self.graph)))

    def ordered_requests(self) -> List[LsuvRequest]:
        return sorted(self.requests, key=lambda r: r.op.id)


def _fan_in(tensor: Optional[torch.Tensor]) -> Optional[int]:
    """Fan-in of a weight stored as ``(out, in, *kernel)`` (``nn.MultiheadAttention``'s own projections)."""
    if tensor is None or tensor.dim() < 2:
        return None
    return int(tensor[0].numel())


def rule_options(options: Dict[str, Any], rule: Any) -> Dict[str, Any]:
    """The options the user gave ``rule`` (by name or code)."""
    given = options.get("rule_options") or {}
    return {**given.get(rule.name, {}), **given.get(rule.code, {})}


# ------------------------------------------------------------------------------------ graph facts
def gain_known(graph: Any, op: Op) -> bool:
    """The signal after ``op`` reaches a known activation, a norm, a weight layer, a softmax or the output."""
    for t in downstream(graph, op):
        known = (t.kind in O.ACTIVATIONS or t.kind in O.WEIGHT_KINDS or t.kind in O.NORM_KINDS
                 or t.kind in ("softmax", "log_softmax") or not graph.consumers(t))
        if not known:
            return False
    return True


def residual_branch(graph: Any, op: Op) -> bool:
    """``op``'s output is added to another signal (the end of a residual branch) before any computing op."""
    frontier, seen = [op], {op.id}
    while frontier:
        for user in graph.consumers(frontier.pop()):
            if user.id in seen:
                continue
            seen.add(user.id)
            if user.kind == "add" and len(user.inputs) > 1:
                return True
            if user.kind in O.PASS_KINDS:
                frontier.append(user)
    return False


# ------------------------------------------------------------------------------------ draws
def family(param: Optional[torch.Tensor]) -> str:
    """``uniform`` or ``normal``: the kurtosis of the weights (1.8 uniform, 3 normal); normal when unclear.

    Read from at most 2**16 evenly spaced entries (the estimate's error is then about 0.02)."""
    if param is None or param.numel() < 16:
        return "normal"
    flat = param.detach().reshape(-1)
    x = flat[::max(1, flat.numel() // 2**16)].float()
    if bool(x.amin() == x.amax()):
        return "normal"  # constant weights have no family; rounding must not make one up
    x = x - x.mean()
    x2 = x * x
    m2, m4 = x2.mean(), (x2 * x2).mean()
    kurtosis = (m4 / (m2 * m2)).item() if float(m2) > 0 else 3.0
    return "uniform" if kurtosis < 2.4 else "normal"


NN_INIT_TAKES_GENERATOR = "generator" in inspect.signature(nn.init.normal_).parameters
"""Only recent torch releases give ``nn.init`` functions a ``generator``; with an older one the draws are written
as the tensor methods ``normal_``/``uniform_``, which have always taken one."""


def init_call(kind: str, std: float, fan_in: int, param: Optional[torch.Tensor]) -> Tuple[str, Dict[str, Any]]:
    """The ``nn.init`` call that draws ``std`` in ``kind``'s family, by gain name when ``nn.init`` knows it."""
    if not NN_INIT_TAKES_GENERATOR:
        bound = math.sqrt(3.0) * std
        if kind == "uniform":
            return ".uniform_", {"a": -bound, "b": bound}
        return ".normal_", {"mean": 0.0, "std": std}
    gain = std * math.sqrt(fan_in)
    torch_fan = nn.init._calculate_fan_in_and_fan_out(param)[0] if param is not None and param.dim() >= 2 else None
    for name, g in NAMED_GAINS.items():
        if torch_fan == fan_in and abs(gain - g) <= 1e-9 * g:
            return f"kaiming_{kind}_", {"nonlinearity": name}
    if kind == "uniform":
        bound = math.sqrt(3.0) * std
        return "uniform_", {"a": -bound, "b": bound}
    return "normal_", {"std": std}


# ------------------------------------------------------------------------------------ LSUV
def transposed_linear(module: nn.Module) -> bool:
    """A Linear whose weight is stored transposed, ``(in, out)`` with ``y = x @ W + b``: HF's ``Conv1D``
    (GPT-2, GPT-J's ancestors), recognised by its class name, its 2-D weight and its ``nf`` (out features)
    without importing transformers."""
    weight = getattr(module, "weight", None)
    return type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2 \
        and getattr(module, "nf", None) == weight.shape[1]


def lsuv_possible(model: nn.Module, op: Op) -> bool:
    """The op is a Linear/Conv module's own call (or a ``Conv1D``'s), whose output a forward hook sees as
    ``W x + b``."""
    if op.kind not in O.WEIGHT_KINDS:
        return False
    try:
        module = model.get_submodule(op.module)
    except AttributeError:
        return False
    own = f"{op.module}.weight" if op.module else "weight"
    if op.params.get("weight") != own:
        return False
    if transposed_linear(module):
        return True  # its forward is one addmm: the op is the module's output
    return bool(op.attrs.get("module_op")) and isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)) \
        and not isinstance(module, nn.modules.conv._ConvTransposeNd)


def measure_lsuv(model: nn.Module, inputs: Tuple[Tuple[Any, ...], Dict[str, Any]], requests: List[LsuvRequest],
                 seed: int) -> List[Step]:
    """Layer-sequential unit-variance factors in one forward pass.

    A hook on each requested layer measures the rms of its output without the bias, picks the
    factor that brings it to :data:`LSUV_TARGET`, and passes the rescaled output on, so every
    later layer is measured as it will be once the factors are applied. Nothing of the model
    changes here; one transfer brings the factors to the host at the end.
    """
    from ..probe.guard import guarded

    factors: Dict[int, torch.Tensor] = {}
    hooks = []
    for req in requests:
        module = model.get_submodule(req.op.module)
        hooks.append(module.register_forward_hook(_lsuv_hook(req, module, factors)))
    args, kwargs = inputs
    try:
        with guarded(model, seed, (args, kwargs)), torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.modules.dropout._DropoutNd):
                    m.eval()  # the probe runs without dropout; guarded() restores the flags
            model(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    measured = [r for r in requests if r.op.id in factors]
    values = torch.stack([factors[r.op.id].double().cpu() for r in measured]).tolist() if measured else []
    steps = []
    for req, factor in zip(measured, values):
        if factor != 1.0 and math.isfinite(factor) and factor > 0:
            why = f"{req.why}; x{fmt(factor)} brings its output rms (bias aside) to {fmt(LSUV_TARGET)} on the probe"
            steps.append(Step(req.op.params["weight"], "mul_", {"factor": factor}, req.rule, req.op.module, why))
    return steps


def _lsuv_hook(req: LsuvRequest, module: nn.Module, factors: Dict[int, torch.Tensor]) -> Callable[..., Any]:
    def hook(mod: nn.Module, inputs: Any, out: Any) -> Any:
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return None
        bias = mod.bias
        if bias is not None:
            shape = [1] * out.dim()
            shape[1 if isinstance(mod, nn.modules.conv._ConvNd) else -1] = -1
            bias = bias.view(shape)
        z = out - bias if bias is not None else out
        factor = factors.get(req.op.id)
        if factor is None:
            x = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
            factor = factors[req.op.id] = _factor(z, x, req)
        scaled = z * factor.to(z.dtype)
        return scaled + bias if bias is not None else scaled
    return hook


def _rms(t: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(t.detach().float()) / math.sqrt(max(t.numel(), 1))


def _factor(z: torch.Tensor, x: Optional[torch.Tensor], req: LsuvRequest) -> torch.Tensor:
    """The weight's factor as a float32 scalar (what ``mul_`` with its printed value applies).

    With a tolerance, a layer is left alone unless its own gain (output rms over input rms)
    is further than the tolerance from 1: a layer of a drifting stretch that passes on the
    scale it receives is not to blame."""
    rms = _rms(z)
    factor = (LSUV_TARGET / rms).float()
    if req.shrink_only:
        factor = factor.clamp(max=1.0)
    if req.max_factor is not None:
        factor = factor.clamp(1.0 / req.max_factor, req.max_factor)
    ok = torch.isfinite(factor) & (factor > 0)
    if req.tolerance > 1.0:
        own = rms / _rms(x) if x is not None and x.is_floating_point() else rms / LSUV_TARGET
        ok = ok & (own.log().abs() > math.log(req.tolerance))
    return torch.where(ok, factor, torch.ones_like(factor))


# ------------------------------------------------------------------------------------ output
def render_code(rep: FixReport) -> str:
    """``apply_initlint_fixes(model)`` as a self-contained module."""
    head = [f'"""Init fixes from `initlint fix` (initlint {__version__}, method {rep.method}, seed {rep.seed}) '
            f'for {rep.model}.', "", "Apply them to the model right after building it, before training."]
    if any(s.draws for s in rep.steps):
        head.append(f"Fresh draws come from their own generator (seed {rep.seed}): the global RNG is left alone.")
    if any(s.call == "mul_" for s in rep.steps):
        head.append("Scale factors were measured on initlint's probe batch: on a model built with the same seed")
        head.append("they give exactly the weights `initlint fix` made, on another draw weights of the same scale.")
    head += ['"""', "import torch", "import torch.nn as nn", "", "",
             "def apply_initlint_fixes(model: nn.Module) -> nn.Module:"]
    body: List[str] = []
    for call in rep.calls:
        body.append(f"# {call.rule} {call.module or '<model>'}: {call.why}")
        body.extend(call.call.code(rep.seed).splitlines())
    if rep.steps:
        body.append("p = model.get_parameter")
        drawn = next((s for s in rep.steps if s.draws), None)
        if drawn is not None:
            body.append(f"gen = torch.Generator(device=p({drawn.param!r}).device).manual_seed({rep.seed})")
        body.append("with torch.no_grad():")
        for step in rep.steps:
            body.append(f"    # {step.rule} {step.module or '<model>'}: {step.why}")
            body.append("    " + step.source(f"p({step.param!r})"))
    elif not rep.calls:
        body.append(f"# initlint found nothing to repair in {rep.model}")
    for f in rep.unrepairable:
        body.append(f"# not repairable by init: {f.code} {f.module or '<model>'}: {f.fix}")
    for f in rep.remaining:
        body.append(f"# still flagged after the fix: {f.code} {f.module or '<model>'}: {f.fix}")
    body.append("return model")
    return "\n".join(head + ["    " + line for line in body]) + "\n"


def render_summary(rep: FixReport) -> str:
    """Before/after in a few lines, and a table of the changed parameters."""
    from tabulate import tabulate

    lines = [f"{rep.model}: initlint fix (method {rep.method}, seed {rep.seed}, {rep.audits} audit(s))",
             f"before: {_codes(rep.before)}"]
    if rep.changes:
        rows = [[c.name, c.rule, fmt(c.before_std), fmt(c.after_std), c.init] for c in rep.changes]
        lines.append(f"changed {len(rep.changes)} parameter(s):")
        lines.append(tabulate(rows, headers=["parameter", "rule", "std before", "std after", "init"],
                              tablefmt="simple", maxcolwidths=[None, None, None, None, 70]))
    else:
        lines.append("changed nothing")
    lines.append(f"after: {_codes(rep.after)}")
    for f in rep.unrepairable:
        lines.append(f"not repairable by init: {f.code} {f.module or '<model>'}: {f.fix}")
    for f in rep.remaining:
        lines.append(f"still flagged: {f.code} {f.module or '<model>'}: {f.message}")
    lines.extend(f"note: {n}" for n in rep.notes)
    return "\n".join(lines)


def _codes(report: Report) -> str:
    bad = [f for f in report.findings if f.severity != "info"]
    if not bad:
        return "clean"
    counts: Dict[str, int] = {}
    for code, _ in [(c, m) for f in bad for c, m in [(f.code, x) for x in f.members or [f.module]]]:
        counts[code] = counts.get(code, 0) + 1
    return f"{len(bad)} finding(s): " + ", ".join(f"{code} x{n}" if n > 1 else code for code, n in counts.items())
