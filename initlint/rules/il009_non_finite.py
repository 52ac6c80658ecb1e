"""IL009 non-finite."""
from __future__ import annotations

import math
from typing import Iterator

import torch.nn as nn

from ..capture import ops as O
from ..report.findings import Finding
from .base import AuditContext, Example, RepairPlan, Rule, fmt



# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def deep_linear_stack_with_randn_weights():
    model = nn.Sequential(*[nn.Linear(100, 100) for _ in range(50)])
    for layer in model:
        nn.init.normal_(layer.weight)  # std 1: the signal grows 10x per layer
    return model


def deep_linear_stack_at_lecun_init():
    model = nn.Sequential(*[nn.Linear(100, 100) for _ in range(50)])
    for layer in model:
        nn.init.normal_(layer.weight, std=0.1)
    return model


class NonFinite(Rule):
    """## What it does
    Looks for NaN or Inf in the forward probe (every op's output) and in the backward
    probe (every weight's gradient), and names the first op where it appears together with
    the largest magnitude of that op's input.

    Infinities used on purpose are not reported: ``-inf`` in attention masks flows through
    additions and disappears in the softmax, and a ``log_softmax`` turns an entry masked with
    ``-inf`` into a log-probability of ``-inf``. An Inf counts only in the output of a weight
    layer, activation, normalisation, softmax or attention (a ``log_softmax`` only when none of
    its inputs held an Inf already), or in a gradient. NaN counts anywhere. Every value is
    exact: NaN and Inf are read from each op's measured extremes and norm, which carry them.

    ## Why is this bad?
    A non-finite value spreads to everything computed from it; one NaN in the forward pass
    makes the loss NaN and every gradient NaN, and training is over at step one. At
    initialisation it means the signal overflowed (a float32 holds at most 3.4e38, reached
    after some 40 layers of ``randn`` weights of width 100) or an op met an invalid input
    (``log`` of a negative, ``0/0``).

    ## Fix
    Initialise for the activations (IL001) so the signal stays bounded; for an invalid
    input, guard the op (``clamp_min`` before ``log``/``sqrt``, an ``eps`` in divisions).

    ## Options
    None.
    """

    code = "IL009"
    name = "non-finite"
    severity = "error"
    needs = frozenset({"activations"})
    summary = "NaN/Inf in the forward or backward probe, at the first op where it appears"
    role = "check"
    repair_after_causes = True
    bad = (Example(deep_linear_stack_with_randn_weights, expect={"37", "49"}),)
    good = (Example(deep_linear_stack_at_lecun_init),)

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        for op in audit.graph:
            stats = audit.op_stats(op)
            peak = stats.get("absmax", stats.get("rms"))
            if peak is None or _finite(peak) or (peak == math.inf and op.kind not in O.EXTREMA_KINDS):
                continue
            inputs = [audit.op_stats(audit.graph[i]).get("absmax") for i in op.inputs]
            if peak == math.inf and op.kind == "log_softmax" and _masked(audit, op):
                continue  # log-probability -inf of entries masked with -inf: the mask, not an overflow
            scale = ", ".join(fmt(s) for s in inputs if s is not None) or "n/a"
            what = "NaN" if peak != peak else "Inf"
            yield self.finding(audit, op, f"first {what} of the forward probe appears in {op.target} "
                               f"(largest input magnitude {scale})", _fix(op.kind, inputs), value=peak, threshold=3.4e38)
            break
        bad = [(op, op.params["weight"]) for op in audit.graph if op.kind in O.WEIGHT_KINDS and "weight" in op.params
               and not _finite(audit.probe.grads.get(op.params["weight"], {}).get("mean", 0.0))]
        if bad:  # a gradient's mean is finite exactly when its entries are (a finite sum overflows only from 1e30)
            op, name = bad[-1]
            yield self.finding(audit, op, f"the backward probe gives a non-finite gradient for {name} "
                               f"({len(bad)} weight(s) affected)",
                               "fix the forward signal scale first (IL001, IL005); the gradient overflows with it",
                               value=audit.probe.grads[name]["mean"], threshold=3.4e38)

    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        """An overflow is repaired through the init findings upstream of it; on its own it is left to the user."""
        plan.note(f"{self.code} {module or '<model>'}: non-finite values that no init finding explains are not repaired")


def _masked(audit: AuditContext, op) -> bool:
    """An input already holds an infinity (and no NaN): a mask that the op passes on."""
    peaks = [audit.op_stats(audit.graph[i]).get("absmax", audit.op_stats(audit.graph[i]).get("rms")) for i in op.inputs]
    return any(p == math.inf for p in peaks)


def _finite(x: float) -> bool:
    return x == x and abs(x) != math.inf


def _fix(kind: str, input_stds) -> str:
    if any(s is not None and (not _finite(s) or s > 1e15) for s in input_stds):
        return "the signal had already exploded before this op; initialise the layers upstream for their activations (IL001)"
    if kind in O.WEIGHT_KINDS:
        return "this layer's weights are far too large; initialise them for the activation after it (IL001)"
    return "guard this op against invalid inputs (clamp_min before log/sqrt, an eps in divisions)"
