"""IL007 saturated-activation."""
from __future__ import annotations

from typing import Any, Iterator, Optional, Tuple

import torch.nn as nn

from ..capture import ops as O
from ..capture.graph import Op
from ..report.findings import Finding
from .base import (SYMPTOM_MAX_FACTOR, AuditContext, Example, RepairPlan, Rule, fmt, init_fix, outside_autograd,
                   py_path, upstream_weight)
from .il001_init_scale import scale_target


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def tanh_after_a_wide_layer_with_large_weights():
    layer = nn.Linear(500, 500)
    nn.init.normal_(layer.weight, std=0.2)  # pre-activation std ~4.5
    return nn.Sequential(layer, nn.Tanh(), nn.Linear(500, 1))


def tanh_after_a_glorot_layer():
    layer = nn.Linear(500, 500)
    nn.init.xavier_normal_(layer.weight)
    return nn.Sequential(layer, nn.Tanh(), nn.Linear(500, 1))


SET_POINT_RATIO = 3.0
"""An activation's input whose scale is more than this many times that of its part that depends on the input
is set by its additive offset."""


def set_point(audit: AuditContext, op: Op) -> Optional[Tuple[str, float, float]]:
    """``(offset, rms with it, rms without)`` when the activation's input is ``scale * (x + offset)`` (or
    ``x + offset``) with a parameter ``offset`` that dominates it; else None. ``scale`` and ``offset`` are
    parameters or computed from parameters alone (Kimi Delta Attention's decay gate:
    ``sigmoid(exp(A_log) * (f_proj(h) + dt_bias))``). A layer's own bias is not such an offset."""
    graph = audit.graph
    current = op.inputs[0] if op.inputs else None
    for _ in range(12):
        if current is None:
            return None
        cur = graph[current]
        data = [i for i in cur.inputs if not _constant(graph, i)]
        if len(data) != 1:
            return None
        if cur.kind == "add":
            offsets = [v for k, v in cur.params.items() if k != "weight"] + [
                graph[i].params.get("bias") or next(iter(graph[i].params.values()), "a constant")
                for i in cur.inputs if i not in data]
            total, part = audit.op_stats(cur).get("rms"), _rms(audit, data[0])
            if offsets and total and part is not None and total > SET_POINT_RATIO * part:
                return offsets[0], total, part
            return None
        if cur.kind not in ("mul", "div", "view") and cur.kind not in O.PASS_KINDS:
            return None
        current = data[0]
    return None


def _constant(graph: Any, op_id: int, depth: int = 0) -> bool:
    """True when the op is computed from parameters and constants alone (no model input reaches it)."""
    op = graph[op_id]
    if op.kind == "input" or op.kind in O.WEIGHT_KINDS or depth > 8:
        return False
    return all(_constant(graph, i, depth + 1) for i in op.inputs)


def _rms(audit: AuditContext, op_id: int) -> Optional[float]:
    """The op's output rms, read through views (which the probe does not measure)."""
    for _ in range(8):
        rms = audit.op_stats(audit.graph[op_id]).get("rms")
        op = audit.graph[op_id]
        if rms is not None or op.kind not in ("view",) + tuple(O.PASS_KINDS) or len(op.inputs) != 1:
            return rms
        op_id = op.inputs[0]
    return None


class SaturatedActivation(Rule):
    """## What it does
    For every bounded activation (tanh, sigmoid, hardtanh, softsign, hardsigmoid) measures
    the fraction of its outputs pinned near a bound: within 1% of the activation's range
    from either end (``|tanh| > 0.98``, sigmoid below 0.01 or above 0.99, hardtanh exactly
    at its limits).

    ## Why is this bad?
    A saturated unit has a derivative near zero (``tanh'(z) = 1 - tanh(z)^2 < 0.04`` once
    ``|tanh(z)| > 0.98``), so almost no gradient flows through it, and the layers below it
    learn slowly or not at all. Saturation at initialisation comes from pre-activations
    that are too large: weights drawn without regard to the fan-in (a naive ``U(-1, 1)``
    init of a tanh pyramid saturates about 88% of the units of every layer), or a signal
    that has grown upstream.

    A saturation set by an offset is reported as information: where the activation's input
    is ``x + offset`` (or ``scale * (x + offset)``), with an offset (and scale) computed from
    parameters alone that make its scale more than 3x that of ``x``, its parameters put it at
    a bound on purpose. Kimi Delta Attention's decay gate,
    ``sigmoid(exp(A_log) * (f_proj(h) + dt_bias))`` with ``A_log = log U(1, 16)`` and
    ``dt_bias`` the inverse softplus of ``U(1e-3, 1e-1)``, sits near 0 at init (a decay near
    1: long memory), as Mamba's step size is set small; its weights are not the cause, and
    rescaling them would not move it. A layer's own bias is not such an offset.

    A layer the model runs with autograd off (a ``torch.no_grad`` block of its own) passes no
    gradient of the model's loss either way: its finding is information.

    ## Fix
    Scale the weights feeding the activation for it, e.g.
    ``nn.init.kaiming_normal_(layer.weight, nonlinearity="tanh")`` or
    ``nn.init.xavier_normal_(layer.weight)``, or normalise before the activation.

    ## Options
    - ``max-saturated-fraction`` (default ``0.5``): flag a layer when more than this fraction
      of its outputs is saturated (the threshold SageMaker Debugger uses).
    """

    code = "IL007"
    name = "saturated-activation"
    severity = "warning"
    needs = frozenset({"activations"})
    summary = "tanh/sigmoid-like outputs pinned at their bounds"
    role = "symptom"
    repair_after_causes = True
    bad = (Example(tanh_after_a_wide_layer_with_large_weights, expect={"1"}),)
    good = (Example(tanh_after_a_glorot_layer),)
    options = {"max-saturated-fraction": 0.5}
    option_ranges = {"max-saturated-fraction": (0, 1)}

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        seen = set()
        for op in audit.graph:
            act = O.ACTIVATIONS.get(op.kind)
            if act is None or act.bounds is None:
                continue
            frac = audit.op_stats(op).get("saturated")
            if frac is None or frac <= self.opts["max-saturated-fraction"] or (op.module, op.target) in seen:
                continue
            seen.add((op.module, op.target))
            offset = set_point(audit, op)
            if offset is not None:
                name, total, part = offset
                yield self.finding(
                    audit, op, f"{fmt(100 * frac)}% of {op.target} outputs are saturated (threshold "
                    f"{fmt(100 * self.opts['max-saturated-fraction'])}%), by the offset {name} that its input "
                    f"adds: rms {fmt(total)} with it, {fmt(part)} without; a set point its parameters choose "
                    f"(as a decay gate's are set near one bound), not the scale of its weights",
                    f"check that {py_path(name)} sets the activation where it is meant to be: near a bound its "
                    f"derivative is small, and it moves slowly", value=frac,
                    threshold=self.opts["max-saturated-fraction"], severity="info")
                continue
            src = upstream_weight(audit.graph, op)
            pre = audit.op_stats(src).get("rms") if src is not None else None
            message = (f"{fmt(100 * frac)}% of {op.target} outputs are saturated (threshold "
                       f"{fmt(100 * self.opts['max-saturated-fraction'])}%)"
                       + (f"; pre-activation rms {fmt(pre)}" if pre is not None else ""))
            fan = audit.fan_in(src) if src is not None else None
            fix = (init_fix(audit, src, op.kind, fan) if src is not None and fan else
                   "scale down the input of this activation or normalise it first")
            yield outside_autograd(audit, op, self.finding(
                audit, src if src is not None and not op.module else op, message, fix, value=frac,
                threshold=self.opts["max-saturated-fraction"]))

    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        """Rescale the layer feeding the activation to unit pre-activation rms."""
        acts = [op for op in plan.graph if op.module == module and op.kind in O.ACTIVATIONS
                and O.ACTIVATIONS[op.kind].bounds is not None]
        feeding = [upstream_weight(plan.graph, a) for a in acts] or [plan.weight_op(module)]
        for op in feeding:
            if op is not None:
                plan.lsuv(op, self.code, f"{fmt(100 * (finding.value or 0))}% of the activation's outputs saturated",
                          max_factor=SYMPTOM_MAX_FACTOR, fallback_std=scale_target(plan, op))
