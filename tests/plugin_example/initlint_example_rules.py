"""A third-party rule in one file, as a plugin package would ship it: registered through the
``initlint.rules`` entry-point group, it is documented, listed, selected, tested and repaired
(``initlint fix``) like the built-in rules (its examples run in ``tests/test_rule_examples.py``
once it is installed, its repair on every bad example)."""
import math
from typing import Iterator

import torch
import torch.nn as nn

from initlint.report import Finding
from initlint.rules import AuditContext, Example, RepairPlan, Rule


def layer_with_a_huge_weight():
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        model[2].weight[0, 0] = 1e3  # one corrupted entry, say from a bad checkpoint merge
    return model


def default_initialised_mlp():
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


class HugeWeight(Rule):
    """## What it does
    Flags weight layers with an entry larger in magnitude than ``max-abs-weight``.

    ## Why is this bad?
    One huge entry dominates its unit's output and gradient; at initialisation it means a
    corrupted load or a broken init call.

    ## Fix
    Re-initialise the layer (``layer.reset_parameters()``); ``initlint fix`` redraws it with
    ``std = 1 / sqrt(fan_in)``.

    ## Options
    - ``max-abs-weight`` (default ``100``): the largest accepted magnitude.
    """

    code = "XA001"
    name = "huge-weight"
    severity = "warning"
    role = "check"
    needs = frozenset({"graph"})
    options = {"max-abs-weight": 100.0}
    summary = "a weight entry far larger than any init draws"
    bad = (Example(layer_with_a_huge_weight, expect={"2"}),)
    good = (Example(default_initialised_mlp),)

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        limit = self.opts["max-abs-weight"]
        for op in audit.graph:
            stats = audit.probe.params.get(op.params.get("weight", ""), {})
            if stats.get("absmax", 0.0) > limit:
                yield self.finding(audit, op, f"largest weight magnitude {stats['absmax']:.3g} (limit {limit:g})",
                                   f"model.{op.module}.reset_parameters()", value=stats["absmax"], threshold=limit)

    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        op = plan.weight_op(module)
        if op is not None:
            std = 1.0 / math.sqrt(plan.ctx.fan_in(op) or 1)
            plan.redraw(op, std, self.code, f"an entry of magnitude {finding.value:.3g}: a fresh draw with std {std:.3g}")
