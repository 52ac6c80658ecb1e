"""IL003 dead-relu."""
from __future__ import annotations

import math
from typing import Iterator, Optional, Set

import torch.nn as nn

from ..capture import ops as O
from ..capture.graph import Graph, Op
from ..report.findings import Finding
from .base import AuditContext, Example, RepairPlan, Rule, fmt, outside_autograd, py_path, upstream_weight
from .il001_init_scale import scale_target


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def negative_bias_before_relu():
    fc = nn.Linear(128, 128)
    nn.init.constant_(fc.bias, -5.0)  # pre-activations far below zero
    return nn.Sequential(fc, nn.ReLU(), nn.Linear(128, 10))


def he_initialised_relu_mlp():
    layers = []
    for _ in range(6):
        layers += [nn.Linear(128, 128), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(128, 10))
    for layer in model[::2]:
        nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
        nn.init.zeros_(layer.bias)
    return model


class DeadRelu(Rule):
    """## What it does
    For every ReLU-family op (``nn.ReLU``, ``F.relu``, ``torch.relu``, ``x.relu()``,
    ``x.relu_()``, ReLU6), measures the fraction of its *units* (features of a linear
    layer, channels of a convolution) that output zero for every sample and every
    position of the probe batch.

    ## Why is this bad?
    A unit whose pre-activation is negative for every input passes no gradient, so gradient
    descent never moves the weights that feed it: it is dead before training starts and
    usually stays dead. The capacity it stands for is lost.

    This counts dead *units*, not zero *outputs*: a healthy ReLU layer outputs zero about
    half of the time, yet almost none of its units are zero for a whole batch. Rules that
    flag "70% zero outputs" fire on healthy networks. Units are judged only when each one
    saw at least ``min-observations`` values, so a tiny probe batch cannot make healthy
    units look dead by chance (a healthy unit is zero for 8 independent samples with
    probability 1/256).

    In a deep plain ReLU network the representations of different inputs become nearly
    parallel with depth (a property of the ReLU kernel, not of the init scale), so a unit
    sees the same sign for the whole batch about half of the time even with He init: a
    100-layer He-initialised network shows 45-50% of such units in wide layers and up to
    80% in layers of a handful of units. The threshold therefore adds binomial noise to the
    50% anchor: a layer of ``n`` units is flagged when its dead fraction exceeds
    ``max-dead-fraction + noise-sigmas * sqrt(p (1 - p) / n)`` (with ``p`` the anchor): 59%
    for 256 units, 75% for 64, never for layers of fewer than 16 units. Dying from a
    negative bias or a vanished signal kills far more than that.

    One case is reported whatever the layer's width: a layer whose every unit is dead and
    that every path from the input to the model output passes through. Its output is
    exactly zero, so the model's output is the same for every sample of the batch and every
    gradient before it is exactly zero: the network is dead, not noisy. A He-initialised
    100-layer ReLU pyramid narrowing to 5 units does this in some random draws (with
    ``torch.manual_seed(7)`` every unit of its last 5-unit layer is dead for the probe
    batch). It is reported once, at the layer where the signal dies; the layers after it
    only see a constant.

    A layer the model runs with autograd off (a ``torch.no_grad`` block of its own) passes no
    gradient of the model's loss either way: its dead units are information (a layer dead in every
    unit is still reported, since its output carries no signal forward).

    ## Fix
    Depends on the cause, which the finding names: a large negative bias (re-initialise it
    with ``nn.init.zeros_``), a too-small upstream init (the signal has vanished and the
    biases dominate; see IL001), or, when units die anyway, ``nn.LeakyReLU``. A narrow layer
    that kills the whole signal needs more units or a leaky activation.

    ## Options
    - ``max-dead-fraction`` (default ``0.5``): flag when more than this fraction of a layer's
      units is dead. 50% is the threshold TheDeepChecker and SageMaker Debugger use.
    - ``noise-sigmas`` (default ``4``): binomial standard deviations added to the anchor.
    - ``min-observations`` (default ``8``): values per unit needed before judging.
    """

    code = "IL003"
    name = "dead-relu"
    severity = "warning"
    needs = frozenset({"activations"})
    summary = "ReLU units that output zero for the whole probe batch (units, not outputs)"
    role = "symptom"
    uses = frozenset({"IL001"})
    bad = (Example(negative_bias_before_relu, expect={"1"}),)
    good = (Example(he_initialised_relu_mlp),)
    options = {"max-dead-fraction": 0.5, "noise-sigmas": 4.0, "min-observations": 8}
    option_ranges = {"max-dead-fraction": (0, 1), "noise-sigmas": (0, None), "min-observations": (0, None)}

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        fatal = self._fatal(audit)
        after = _descendants(audit.graph, fatal) if fatal is not None else set()
        if fatal is not None:
            yield self._fatal_finding(audit, fatal)
        seen = set()
        for op in self._judged(audit):
            if op.id in after or (fatal is not None and op.id == fatal.id):
                continue  # everything after a dead layer sees a constant signal: consequences, not causes
            units = _units(audit, op)
            frac = audit.op_stats(op)["dead"] / units
            limit = self.limit(units)
            if frac <= limit or (op.module, op.target) in seen:
                continue
            seen.add((op.module, op.target))
            message = (f"{fmt(100 * frac)}% of {units} units output zero for the whole probe batch "
                       f"({op.target}; threshold {fmt(100 * limit)}% for {units} units)")
            yield outside_autograd(audit, op, self.finding(audit, op, message, self._fix(audit, op), value=frac,
                                                           threshold=limit))

    def _judged(self, audit: AuditContext) -> Iterator[Op]:
        """ReLU ops with a dead-unit count and enough observations per unit."""
        for op in audit.graph:
            if op.kind not in O.DYING_KINDS:
                continue
            units, shape = _units(audit, op), audit.shape(op)
            if "dead" not in audit.op_stats(op) or not units or not shape:
                continue
            if _numel(shape) // units >= self.opts["min-observations"]:
                yield op

    def _fatal(self, audit: AuditContext) -> Optional[Op]:
        """The first ReLU whose every unit is dead and that every path from the input to the output
        passes through: its output is exactly zero, so the model's output is constant for the batch."""
        for op in self._judged(audit):
            if audit.op_stats(op)["dead"] == _units(audit, op) and _dominates(audit.graph, op) \
                    and _no_gradient_before(audit, op):
                return op
        return None

    def _fatal_finding(self, audit: AuditContext, op: Op) -> Finding:
        units = _units(audit, op)
        limit = min(self.limit(units), 1.0)
        message = (f"all {units} units output zero for the whole probe batch ({op.target}), and every path from "
                   f"the input to the model output passes through this layer: the model's output is the same for "
                   f"every sample of the batch and no gradient reaches the layers before it (reported whatever "
                   f"the layer's width)")
        fix = self._fix(audit, op)
        if fix.startswith("pre-activations of") or fix.startswith("the input of this ReLU"):
            fix = (f"a layer of {units} units can be cut off entirely; widen it, or use nn.LeakyReLU(0.01) so that "
                   f"no layer can output a constant")
        return self.finding(audit, op, message, fix, value=1.0, threshold=limit)

    def limit(self, units: int) -> float:
        """Dead fraction above which a layer of ``units`` units is flagged."""
        base = self.opts["max-dead-fraction"]
        return base + self.opts["noise-sigmas"] * math.sqrt(base * (1 - base) / units)

    def _fix(self, audit: AuditContext, op) -> str:
        src = upstream_weight(audit.graph, op)
        if src is None:
            return "the input of this ReLU is negative almost everywhere; check its scale, or use nn.LeakyReLU"
        bias_name = src.params.get("bias")
        bias = audit.probe.params.get(bias_name or "", {})
        pre_rms = audit.op_stats(src).get("rms", 0.0)
        if bias and bias.get("mean", 0.0) < 0 and abs(bias["mean"]) > 0.5 * pre_rms:
            return (f"the bias of {src.module} is {fmt(bias['mean'])} on average against a pre-activation rms of "
                    f"{fmt(pre_rms)}; re-initialise it: nn.init.zeros_({py_path(bias_name)})")
        if any(f.module == src.module for f in audit.findings_of("IL001")):
            return f"the signal reaching {src.module} has vanished (see IL001 {src.module}); fix that init first"
        return f"pre-activations of {src.module} are negative for most units; use nn.LeakyReLU(0.01) or check the input scale"

    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        """Reset the bias that keeps the pre-activations negative; a vanished signal is the init-scale rule's to repair."""
        if plan.through_cause(finding):
            return
        for op in plan.ops_of(module, O.DYING_KINDS):
            stats = plan.ctx.op_stats(op)
            units = int(stats.get("units", 0))
            dead = stats.get("dead")
            if not units or dead is None or (dead < units and dead / units <= self.limit(units)):
                continue  # not what the rule reports (a layer with every unit dead it reports at any width)
            src = upstream_weight(plan.graph, op)
            bias = src.params.get("bias") if src is not None else None
            mean = plan.ctx.probe.params.get(bias or "", {}).get("mean", 0.0)
            pre_rms = plan.ctx.op_stats(src).get("rms", 0.0) if src is not None else 0.0
            # the rule's diagnosis: a bias below -0.5x the pre-activation scale holds the units under zero
            if bias and mean < 0 and abs(mean) > 0.5 * pre_rms:
                plan.zero(bias, src.module, self.code, f"bias {fmt(mean)} on average kills "
                          f"{fmt(100 * stats['dead'] / units)}% of the units")
            elif src is not None and stats["dead"] == units and "weight" in src.params:
                # Every unit dead for the whole batch at a scale the init-scale rule accepts: the draw itself is
                # unlucky (a narrow layer whose inputs are nearly parallel has each unit alive or dead for every
                # sample). A fresh draw of the same scale; the next audit judges it.
                std = plan.ctx.probe.params.get(src.params["weight"], {}).get("rms")
                if std and math.isfinite(std) and scale_target(plan, src) is None:
                    plan.redraw(src, std, self.code, f"all {units} units of the next ReLU dead for the whole batch: "
                                f"a fresh draw of the same scale")


def _units(audit: AuditContext, op: Op) -> int:
    """Units of a ReLU-family output, as the probe counted them (0 when it did not)."""
    return int(audit.op_stats(op).get("units", 0))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _dominates(graph: Graph, op: Op) -> bool:
    """True when no model output can be reached from a model input without passing through ``op``."""
    outputs = set(graph.outputs)
    if not outputs or not graph.inputs:
        return False
    frontier = [i for i in graph.inputs if i != op.id]
    seen = set(frontier)
    while frontier:
        current = frontier.pop()
        if current in outputs:
            return False
        for user in graph[current].users:
            if user != op.id and user not in seen:
                seen.add(user)
                frontier.append(user)
    return True


def _descendants(graph: Graph, op: Op) -> Set[int]:
    """Ids of every op that reads ``op``'s output, directly or not."""
    found: Set[int] = set()
    frontier = list(op.users)
    while frontier:
        current = frontier.pop()
        if current not in found:
            found.add(current)
            frontier.extend(graph[current].users)
    return found


def _no_gradient_before(audit: AuditContext, op: Op) -> bool:
    """The backward probe (when it ran) agrees: every weight layer before ``op`` got a zero gradient (its
    norm is 0; the probe does not keep a gradient's extremes)."""
    graph = audit.graph
    frontier, seen = list(op.inputs), set(op.inputs)
    while frontier:
        current = graph[frontier.pop()]
        if current.kind in O.WEIGHT_KINDS:
            grad = audit.probe.grads.get(current.params.get("weight", ""), {})
            if grad.get("rms", 0.0) != 0.0:
                return False
        for i in current.inputs:
            if i not in seen:
                seen.add(i)
                frontier.append(i)
    return True
