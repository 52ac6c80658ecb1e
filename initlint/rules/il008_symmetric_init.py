"""IL008 symmetric-init."""
from __future__ import annotations

from typing import Iterator, Optional

import torch.nn as nn

from .. import ops as O
from ..graph import Graph, Op
from ..report import Finding
from .base import Audit, Example, Rule, fmt, py_path


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def constant_and_zero_hidden_layers():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    nn.init.constant_(model[0].weight, 0.1)  # every unit computes the same thing
    nn.init.zeros_(model[2].weight)
    return model


def zero_initialised_classifier_head():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    nn.init.kaiming_normal_(model[0].weight, nonlinearity="relu")
    nn.init.zeros_(model[2].weight)  # deliberate: the head's gradient still differs per unit
    return model


class SymmetricInit(Rule):
    """## What it does
    Finds weight layers (Linear, Conv) whose weights cannot break symmetry: every value
    equal (``nn.init.constant_``), all zero in a layer whose output feeds further weight
    layers, or units (rows of the weight) that are exact copies of each other.

    ## Why is this bad?
    Units with identical incoming weights compute the same output and, as long as what
    lies downstream treats them alike, receive the same gradient: they stay clones for the
    whole of training, and the layer behaves as if it had one unit. An all-zero hidden
    layer also blocks the backward signal (``delta_{l-1} = W_l^T delta_l = 0``), and with a
    ReLU after it (``relu'(0) = 0``) its own gradient is zero too: nothing below it learns.

    Deliberate cases are not flagged. Normalisation scales and shifts are not weight
    layers. A zero-initialised layer whose output is added to a residual stream before any
    other weight layer (zero-init of a residual branch's last layer or last BatchNorm gamma,
    Fixup, ReZero, SkipInit) or that produces the model output (a zero-initialised
    classifier head) starts as the identity of the block or a uniform prediction, and its
    gradient is not zero, because its input is not.

    ## Fix
    Draw the weights at random with the scale the next activation needs:
    ``nn.init.kaiming_normal_(hidden.weight, nonlinearity="relu")``.

    ## Options
    None.
    """

    code = "IL008"
    name = "symmetric-init"
    severity = "warning"
    needs = frozenset({"graph"})
    summary = "constant, zero or duplicated weights that cannot break symmetry"
    role = "cause"
    bad = (Example(constant_and_zero_hidden_layers, expect={"0", "2"}),)
    good = (Example(zero_initialised_classifier_head),)

    def check(self, audit: Audit) -> Iterator[Finding]:
        seen = set()
        for op in audit.graph:
            if op.kind not in O.WEIGHT_KINDS or "weight" not in op.params or op.params["weight"] in seen:
                continue
            name = op.params["weight"]
            stats = audit.probe.params.get(name)
            if not stats:
                continue
            seen.add(name)
            finding = self._judge(audit, op, name, stats)
            if finding is not None:
                yield finding

    def _judge(self, audit: Audit, op: Op, name: str, stats) -> Optional[Finding]:
        rows = int(stats.get("rows", 0))
        fix = f'nn.init.kaiming_normal_({py_path(name)}, nonlinearity="relu")  # or the init its activation needs'
        if stats["spread"] == 0 and stats["absmax"] == 0:
            if not feeds_weight_layer(audit.graph, op):
                return None
            return self.finding(audit, op, f"all weights of {name} are zero and its output feeds further weight "
                                f"layers: no gradient reaches the layers below, and its units stay identical",
                                fix, value=0.0, threshold=0.0)
        if stats["spread"] == 0 and rows >= 2:
            return self.finding(audit, op, f"all {int(_numel(audit, name))} weights of {name} equal "
                                f"{fmt(stats['mean'])}: its {rows} units compute the same thing and stay clones",
                                fix, value=0.0, threshold=0.0)
        dups = int(stats.get("dup_rows", 0))
        if dups >= 1 and rows >= 2:
            return self.finding(audit, op, f"{dups} of the {rows} units of {name} have exactly the same weights "
                                f"as another unit", fix, value=float(dups), threshold=0.0)
        return None


def feeds_weight_layer(graph: Graph, op: Op) -> bool:
    """True when ``op``'s output reaches another weight layer through neither a residual add nor a norm."""
    frontier, seen = [op], {op.id}
    while frontier:
        current = frontier.pop()
        for user in graph.consumers(current):
            if user.id in seen:
                continue
            seen.add(user.id)
            if user.kind == "add" and len(user.inputs) > 1:
                continue  # residual branch end: deliberate zero-init
            if user.kind in O.WEIGHT_KINDS or user.kind in ("rnn", "attention"):
                return True
            if user.kind in O.NORM_KINDS:
                continue
            frontier.append(user)
    return False


def _numel(audit: Audit, name: str) -> int:
    p = audit.param(name)
    return p.numel() if p is not None else 0
