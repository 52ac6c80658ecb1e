"""IL005 signal-drift."""
from __future__ import annotations

import math
from typing import Dict, Iterator, List, Optional, Tuple

import torch.nn as nn

from .. import ops as O
from ..graph import Graph, Op
from ..report import Finding
from .base import Audit, Example, Rule, fmt
from ..probe import unit_axis
from .il001_init_scale import ENDPOINT_KINDS

_START_KINDS = O.NORM_KINDS | {"input", "embedding"}


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def deep_linear_stack_with_tiny_weights():
    model = nn.Sequential(*[nn.Linear(100, 100) for _ in range(30)])
    for layer in model:
        nn.init.normal_(layer.weight, std=0.01)  # 1/10 of 1/sqrt(100): the signal shrinks 10x per layer
        nn.init.zeros_(layer.bias)
    return model


def deep_linear_stack_at_lecun_init():
    model = nn.Sequential(*[nn.Linear(100, 100) for _ in range(30)])
    for layer in model:
        nn.init.normal_(layer.weight, std=0.1)
        nn.init.zeros_(layer.bias)
    return model


class SignalDrift(Rule):
    """## What it does
    Follows the measured scale (root mean square) of the forward signal through the
    network and flags a signal that explodes or vanishes. The signal is compared with its
    scale where it last started afresh: the model input, an embedding, or the output of a
    normalisation layer. It is judged where the signal ends: at the next normalisation,
    softmax or attention, or at the model output. At a residual addition the larger of the
    two signals carries on, so a deliberately small (or zero-initialised) residual branch
    does not count as vanishing, and the scale of a weight layer that feeds a
    normalisation directly is the norm's to fix (as in IL001): the signal is judged at
    that layer's input.

    The finding reports the scale at the start, the worst scale reached, the factor per
    weight layer (geometric mean over the layers in between) and the first layer where the
    drift starts.

    ## Why is this bad?
    Each layer multiplies the signal's variance by ``fan_in * Var(w) / gain^2``. Away from 1,
    the product over depth grows or shrinks exponentially: a 50-layer linear stack with
    ``randn`` weights overflows to inf/NaN, one with ``0.01 * randn`` weights outputs zeros,
    and a 100-layer ReLU network with LeCun or Glorot init shrinks its signal by ~1e-16.
    Such a network cannot learn: its outputs do not depend on its inputs, and its gradients
    drift the same way (IL006).

    ## Fix
    Initialise every layer for the activation after it (see the IL001 findings this one
    links to), or add normalisation layers:
    ```python
    for m in model:
        nn.init.kaiming_normal_(m.weight, nonlinearity="linear")
    ```

    ## Options
    - ``max-scale-ratio`` (default ``100``): flag when the signal's scale ends more than this
      factor above or below its starting scale (four orders of magnitude in variance, well
      beyond the drift IL001 accepts, so IL005 reports only what has already gone wrong).
    - ``min-units`` (default ``16``): the scale is read at the last layer on the path with
      at least this many units (features or channels); the scale of a few units is too noisy
      to judge, and a network's narrow output layers (a width-1 regression head) are judged
      by the layers that feed them.
    """

    code = "IL005"
    name = "signal-drift"
    severity = "warning"
    needs = frozenset({"activations"})
    summary = "the measured forward signal exploding or vanishing through depth"
    role = "symptom"
    stretch = True
    bad = (Example(deep_linear_stack_with_tiny_weights, expect={"0"}),)
    good = (Example(deep_linear_stack_at_lecun_init),)
    options = {"max-scale-ratio": 100.0, "min-units": 16}

    def check(self, audit: Audit) -> Iterator[Finding]:
        limit = math.log(self.opts["max-scale-ratio"])
        ref = self._references(audit)
        worst: Optional[Tuple[float, Op, Op]] = None
        outputs = set(audit.graph.outputs)
        for endpoint in self._endpoints(audit.graph):
            for src_id in [endpoint.id] if endpoint.id in outputs else endpoint.inputs:
                src = audit.graph[src_id]
                if endpoint.kind in O.NORM_KINDS:
                    src = _input_of_last_weight(audit.graph, src)  # its scale is the norm's to fix
                src = self._judged_point(audit, src) if src is not None else None
                if src is None:
                    continue
                rms = audit.op_stats(src).get("rms")
                start = ref.get(src.id)
                if rms is None or start is None or not _finite(rms) or start[0] <= 0:
                    continue
                ratio = math.log(max(rms, 1e-300) / start[0])
                if abs(ratio) > limit and (worst is None or abs(ratio) > abs(worst[0])):
                    worst = (ratio, src, audit.graph[start[1]])
        if worst is None:
            return
        ratio, src, start_op = worst
        yield self._finding(audit, ratio, src, start_op)

    def _references(self, audit: Audit) -> Dict[int, Tuple[float, int]]:
        """For each op: (rms, op id) of the point where its signal last started afresh."""
        ref: Dict[int, Tuple[float, int]] = {}
        for op in audit.graph:
            rms = audit.op_stats(op).get("rms")
            if op.kind in _START_KINDS:
                if rms is not None and rms > 0:
                    ref[op.id] = (rms, op.id)
                continue
            ins = [i for i in op.inputs if i in ref]
            if not ins:
                continue
            if op.kind in ("add", "cat", "mul") and len(ins) > 1:
                # the strongest input carries on (relative to its own start)
                best = max(ins, key=lambda i: _rel(audit, audit.graph[i], ref))
                ref[op.id] = ref[best]
            else:
                ref[op.id] = ref[ins[0]]
        return ref

    def _judged_point(self, audit: Audit, op: Op) -> Optional[Op]:
        """``op``, or the nearest op before it on its main path with at least ``min-units`` units."""
        current: Optional[Op] = op
        for _ in range(100000):
            if current is None or current.kind in _START_KINDS:
                return None
            shape = current.shape
            if shape and "rms" in audit.op_stats(current):
                axis = unit_axis(audit.graph, current) % len(shape) if len(shape) > 1 else 0
                if len(shape) > 1 and shape[axis] >= self.opts["min-units"]:
                    return current
            current = audit.graph[current.inputs[0]] if current.inputs else None
        return None

    @staticmethod
    def _endpoints(graph: Graph) -> List[Op]:
        ends = [op for op in graph if op.kind in ENDPOINT_KINDS and op.kind not in ("other", "reduce", "embedding")]
        ends += [graph[i] for i in graph.outputs]
        return ends

    def _finding(self, audit: Audit, ratio: float, src: Op, start_op: Op) -> Finding:
        chain = _weight_chain(audit.graph, src, start_op)
        start_rms = audit.op_stats(start_op)["rms"]
        end_rms = audit.op_stats(src)["rms"]
        per_layer = math.exp(ratio / max(len(chain), 1))
        first = _first_drifting(audit, chain, start_rms, ratio) or (chain[0] if chain else src)
        direction = "explodes" if ratio > 0 else "vanishes"
        where = "the input" if start_op.kind == "input" else f"{start_op.target} ({start_op.module or '<model>'})"
        message = (f"signal {direction}: scale (rms) {fmt(start_rms)} at {where} -> {fmt(end_rms)} at "
                   f"{src.target} ({src.module or '<model>'}), {fmt(end_rms / start_rms)}x over {len(chain)} weight "
                   f"layer(s), {fmt(per_layer)}x per layer, starting at {first.module or '<model>'} "
                   f"(limit {fmt(self.opts['max-scale-ratio'])}x either way)")
        fix = ("re-initialise the layers from " + (first.module or "the first layer") +
               " on for the activation that follows each (see IL001), or add a normalisation layer")
        return self.finding(audit, first, message, fix, value=end_rms / start_rms,
                            threshold=self.opts["max-scale-ratio"] if ratio > 0 else 1 / self.opts["max-scale-ratio"])


def _input_of_last_weight(graph: Graph, op: Op) -> Optional[Op]:
    """Going back from a norm's input: the input of the weight layer that feeds the norm directly."""
    current: Optional[Op] = op
    for _ in range(64):
        if current is None:
            return None
        if current.kind in O.WEIGHT_KINDS:
            return graph[current.inputs[0]] if current.inputs else None
        if current.kind not in O.PASS_KINDS and current.kind not in ("add",):
            return op
        current = graph[current.inputs[0]] if current.inputs else None
    return op


def _rel(audit: Audit, op: Op, ref: Dict[int, Tuple[float, int]]) -> float:
    rms = audit.op_stats(op).get("rms")
    if rms is None or not _finite(rms):
        return float("inf")
    return rms / ref[op.id][0] if ref[op.id][0] > 0 else 0.0


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def _weight_chain(graph: Graph, end: Op, start: Op) -> List[Op]:
    """Weight ops on the first-input path from ``start`` to ``end``, in forward order."""
    chain: List[Op] = []
    current: Optional[Op] = end
    for _ in range(100000):
        if current is None or current.id == start.id:
            break
        if current.kind in O.WEIGHT_KINDS:
            chain.append(current)
        current = graph[current.inputs[0]] if current.inputs else None
    return list(reversed(chain))


def _first_drifting(audit: Audit, chain: List[Op], start_rms: float, ratio: float) -> Optional[Op]:
    """First weight layer whose output scale moved from the previous one's by > 1.5x in the drift's direction."""
    prev = start_rms
    for op in chain:
        out = audit.op_stats(op).get("rms")
        if out is None or out <= 0 or not _finite(out) or prev <= 0:
            prev = out if out else prev
            continue
        step = math.log(out / prev)
        if (ratio > 0 and step > math.log(1.5)) or (ratio < 0 and step < -math.log(1.5)):
            return op
        prev = out
    return None
