"""IL007 saturated-activation."""
from __future__ import annotations

from typing import Iterator

import torch.nn as nn

from ..capture import ops as O
from ..report.findings import Finding
from .base import SYMPTOM_MAX_FACTOR, AuditContext, Example, RepairPlan, Rule, fmt, init_fix, upstream_weight
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
            src = upstream_weight(audit.graph, op)
            pre = audit.op_stats(src).get("rms") if src is not None else None
            message = (f"{fmt(100 * frac)}% of {op.target} outputs are saturated (threshold "
                       f"{fmt(100 * self.opts['max-saturated-fraction'])}%)"
                       + (f"; pre-activation rms {fmt(pre)}" if pre is not None else ""))
            fan = audit.fan_in(src) if src is not None else None
            fix = (init_fix(audit, src, op.kind, fan) if src is not None and fan else
                   "scale down the input of this activation or normalise it first")
            yield self.finding(audit, src if src is not None and not op.module else op, message, fix, value=frac,
                               threshold=self.opts["max-saturated-fraction"])

    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        """Rescale the layer feeding the activation to unit pre-activation rms."""
        acts = [op for op in plan.graph if op.module == module and op.kind in O.ACTIVATIONS
                and O.ACTIVATIONS[op.kind].bounds is not None]
        feeding = [upstream_weight(plan.graph, a) for a in acts] or [plan.weight_op(module)]
        for op in feeding:
            if op is not None:
                plan.lsuv(op, self.code, f"{fmt(100 * (finding.value or 0))}% of the activation's outputs saturated",
                          max_factor=SYMPTOM_MAX_FACTOR, fallback_std=scale_target(plan, op))
