"""IL006 gradient-drift."""
from __future__ import annotations

import math
from typing import Dict, Iterator, List, Optional, Set, Tuple

import torch.nn as nn

from ..capture import ops as O
from ..capture.graph import Graph, Op
from ..report.findings import Finding
from .base import (GATE_MAX, AuditContext, Example, RepairPlan, Rule, closed_off, created_tensor, downstream, fmt,
                   gated_ops, lsuv_stretch, measured_rms, rescales_only, residuals_of, starved)
from .il001_init_scale import scale_target

_SCORE_KINDS = frozenset({"attention", "matmul", "softmax", "log_softmax"})
_RESTART_KINDS = frozenset({"pool", "reduce"})


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def tanh_pyramid_with_uniform_weights():
    widths = [round(200 * 0.96 ** i) for i in range(11)]
    layers = []
    for fan_in, fan_out in zip(widths, widths[1:]):
        layer = nn.Linear(fan_in, fan_out)
        nn.init.uniform_(layer.weight, -1, 1)  # std 0.58, about 8x what tanh needs
        layers += [layer, nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(widths[-1], 1))


def conv_net_with_global_pooling():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


class GradientDrift(Rule):
    """## What it does
    Runs a backward probe: a random unit-variance cotangent is backpropagated from the
    model output (no loss and no labels needed) and the gradient of every weight layer is
    measured (its norm and mean; for a weight used only in matrix products or 2-D convolutions,
    from the products' inputs and output gradients, without forming the gradient). It flags a spread of gradient *variance* across layers far beyond what the
    layers' fan-ins and fan-outs can explain. Existing ``.grad`` fields are never touched
    (the probe uses ``torch.autograd.grad``).

    Layers are compared within each stretch of the network that no normalisation, pooling
    or reduction interrupts: a norm rescales the backward signal by ``gamma / sigma`` on
    purpose, and a mean over positions divides each position's backward signal by their
    count (a conv -> conv -> global mean-pool -> linear network at He init spreads its
    per-position gradients by the square of the number of positions, with nothing wrong).

    Layers left out, because their gradient is legitimately tiny or zero at init:
    - embeddings (their gradient is sparse by nature: only the rows of the sampled tokens
      get one);
    - one factor of a product of two signals, directly or through an activation, and every
      layer of a branch that reaches the stream only through such a product: the
      projections that produce attention scores, gates (a GRU's reset and update gates, a
      SwiGLU's gate), routing weights and the experts of a mixture of experts (an expert run
      on every token is weighted by a routing probability that is zero for most of them);
      the gradient of each factor is scaled by the other one;
    - the layers of a residual branch gated near identity by design (see IL005: a
      LayerScale at 1e-6, ReZero's alpha = 0, a zero BatchNorm gamma, a zero-initialised
      last layer): the gate multiplies their backward signal by its own small value;
    - the layers of a branch that, at init, adds at most ``1/4`` (the gate limit of IL005)
      of what a parallel branch beside it adds, where the two are summed before they reach
      the stream (not a residual addition: neither is computed from the other): Falcon-H1's
      Mamba-2 mixer beside its attention (``mamba(x) + attn(x)``), whose depthwise conv at
      std 0.02 leaves it 0.012x the attention's output at its real width, 0.0023x at width
      256. The branch is quiet, as a gated one is, and its layers' weight gradients are
      small because their inputs are. Trained with AdamW on a copy task
      (``benchmarks/hf_init_training.py --model falcon_h1``, 4 seeds) it learnt it at steps
      52-58, the same model with the conv at PyTorch's default at 49-56, and its mixer's
      output grew to 0.25-0.60x the attention's in 400 steps: a cost of a few steps (4-10%),
      where a finding IL006 keeps preceded failure (ELECTRA-small's embeddings projected at
      std 0.02 did not learn a shift task in 1000 steps; ``--model electra``);
    - conditioning layers, whose output is broadcast over positions it was not computed at
      (a diffusion UNet's timestep embedding added to every pixel of every block, FiLM and
      AdaLN modulations), directly or through other layers: their gradient gathers every
      position they reach, and no fan ratio predicts how many;
    - layers whose gradient is exactly zero (dead units are IL003's, symmetric weights
      IL008's).

    The spread leaves out one more kind of layer, one whose scale is free: its output reaches
    only normalisations, through layers without a bias (or with an all-zero one), activations
    that are 0 at 0, views and products, so that scaling the weight by ``c`` changes nothing the
    model computes and its gradient by ``1 / c``. Hugging Face's generic init draws AIMv2's two
    projections into the L2 normalisation of its embeddings at std 1 (32x ``1 / sqrt(fan_in)``):
    the vision projection's gradient was 1.3e3x below the vision head's, and that init reached the
    matching task of ``benchmarks/hf_init_training.py --model aimv2`` at steps 20-27, where the
    projections at ``1 / sqrt(fan_in)`` took 36-49 (4 seeds). What the first step of the optimizer
    does to such a weight is IL015's. The check of gradients that vanished or exploded in every layer
    alike (below) still reads such layers: a deep stack of
    bias-free layers into BatchNorms without residuals (100 x Linear-BatchNorm-ReLU) explodes its
    gradients by 3.5e8x, which a layer's own scale does not explain.

    ## Why is this bad?
    Gradients are compared per sample and position: a weight applied at many positions (a
    convolution over a long signal, a cell unrolled over time steps) sums that many terms,
    so its gradient std is divided by the square root of the number of positions over all
    its calls first.

    The gradient of layer ``l`` is the product of the forward signal reaching it and the
    backward signal coming from above: ``Var(dW_l) = Var(h_{l-1}) * Var(delta_l)``. With a
    forward-stable init, He et al. show these products cancel except for a fan ratio: the
    spread of gradient variance across a network is bounded by the largest fan-in over the
    smallest fan-out (about 1e3 for a pyramid from width 1000 down to 1, which is what one
    measures with He init), or, in a widening network, by the largest fan-out over the
    smallest fan-in (a head over 21841 classes on 128 features: the backward signal grows by
    ``21841 / 128`` through a layer initialised for its fan-in). Anything much larger
    compounds with depth: layers near one end learn orders of magnitude faster than at the
    other, and no single learning rate suits them (a naive ``U(-1, 1)`` init of a 10-layer
    tanh pyramid spans more than 8 orders).

    How it depends on the sequence's length: the division by the square root of the positions
    holds when the terms summed over positions are independent, and at init they need not be.
    In T5-small at default init the encoder's first MLP (``wo`` against ``wi``) spreads its
    gradient variance by 489x on 2048 encoder tokens (limit 400) and stays within the limit on
    16, 512 and 1024: the spread grows with the length. T5 trains on 512 input tokens; the
    rest of the real-size zoo is clean at 512 and, where tested, 2048.

    It also flags gradients that vanished (or exploded) in every layer alike, which no spread
    shows: for each layer the backward signal ``delta_l`` is estimated as the per-position
    gradient std over the scale of the layer's input, and compared with the unit-variance
    cotangent at the output. With a stable init it stays within a few orders of magnitude
    (1e-3 to 1 in a 100-layer He pyramid and in the transformer zoo of the tests); LeCun or
    Glorot init in a 100-layer ReLU network leaves it near 1e-10. Through depth it vanishes away
    from the output: the layers nearest the output get the cotangent at about its scale. Where
    every layer's is below the limit, the signal was lost in the ops between the output and the
    last weight layer, which no init of the layers changes: it is reported as information.
    VideoPrism's contrastive output divides each ``exp`` of a similarity by their sum over the
    batch; on the batch of one that the probe falls back to when a 16-frame clip at 288 x 288 does
    not fit, the output is exactly 1 and every layer's gradient is round-off (6e-14 to 4.8e-11
    of the output's).

    ## Fix
    Use the init that matches each layer's activation (IL001 names the layers), or add
    normalisation. The finding names the layers with the smallest and largest gradients.

    ## Options
    - ``max-excess-spread`` (default ``100``): flag when the spread of gradient variance
      (largest over smallest) exceeds the fan-ratio prediction times this factor.
    - ``max-gradient-drift`` (default ``1e6``): flag when the backward signal reaching a
      weight layer is below ``1 / max-gradient-drift`` of the output's, or above
      ``max-gradient-drift``, both widened by the square root of the fan ratio.
    """

    code = "IL006"
    name = "gradient-drift"
    severity = "warning"
    needs = frozenset({"gradients"})
    summary = "weight gradients spread far beyond what the layer fans predict (backward probe)"
    role = "symptom"
    repair_after_causes = True
    stretch = True
    bad = (Example(tanh_pyramid_with_uniform_weights, expect={"18"}),)
    good = (Example(conv_net_with_global_pooling),)
    options = {"max-excess-spread": 100.0, "max-gradient-drift": 1e6}
    option_ranges = {"max-excess-spread": (1, None), "max-gradient-drift": (1, None)}

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        layers = self._layers(audit)
        segment = segments(audit.graph)
        groups: Dict[int, List[Tuple[Op, float]]] = {}
        free = free_scale(audit)
        for op, value in layers:
            if not (op.id in free and rescales_only(audit, op) is True):  # its gradient: the inverse of its scale
                groups.setdefault(segment[op.id], []).append((op, value))
        worst = self._vanished(audit, layers)
        for group in groups.values():
            finding = self._judge(audit, group) if worst is None else None
            if finding is not None and (worst is None or finding.value / finding.threshold > worst.value / worst.threshold):
                worst = finding
        if worst is not None:
            yield worst

    def _vanished(self, audit: AuditContext, layers: List[Tuple[Op, float]]) -> Optional[Finding]:
        """Gradients that vanished or exploded in every layer alike (no spread, but no signal either)."""
        deltas = []
        for op, per_position in layers:
            src = measured_rms(audit, audit.graph[op.inputs[0]]) if op.inputs else None
            if src and _finite(src) and src > 0:
                deltas.append((op, per_position / src))
        if not deltas:
            return None
        limit = self.opts["max-gradient-drift"] * math.sqrt(self._predicted(audit, [op for op, _ in deltas]))
        hi_op, hi = max(deltas, key=lambda x: x[1])
        lo_op, lo = min(deltas, key=lambda x: x[1])
        if 0 < lo < 1 / limit:
            at, value, threshold, what = lo_op, lo, 1 / limit, "vanish"
        elif hi > limit:
            at, value, threshold, what = hi_op, hi, limit, "explode"
        else:
            return None
        message = (f"gradients {what}: the backward signal reaching {at.module or '<model>'} is {fmt(value)}x the "
                   f"unit-variance signal at the output (range over the layers {fmt(lo)}..{fmt(hi)}x; "
                   f"limit {fmt(1 / limit)}..{fmt(limit)}x with the layer fans)")
        fix = ("re-initialise the layers for the activation after each (see IL001) so that the forward and "
               "backward signals keep their scale")
        if what == "vanish" and hi < 1 / limit:  # even the layer nearest the output: lost before any layer
            message += (f"; below the limit at every layer, {hi_op.module or '<model>'} included, so it vanished in "
                        "the ops after the last weight layer, which no init of the layers changes (a normalisation "
                        "over a batch of one makes the output a constant)")
            fix = "check the ops between the last weight layer and the output; audit with a batch of at least 2"
            return self.finding(audit, at, message, fix, value=value, threshold=threshold, severity="info")
        return self.finding(audit, at, message, fix, value=value, threshold=threshold)

    def _judge(self, audit: AuditContext, layers: List[Tuple[Op, float]]) -> Optional[Finding]:
        if len(layers) < 2:
            return None
        lo_op, lo = min(layers, key=lambda x: x[1])
        hi_op, hi = max(layers, key=lambda x: x[1])
        if lo <= 0:
            return None  # exactly zero gradients are IL008's (symmetry) or IL003's (dead units) business
        spread = (hi / lo) ** 2
        predicted = self._predicted(audit, [op for op, _ in layers])
        limit = predicted * self.opts["max-excess-spread"]
        if spread <= limit:
            return None
        median = sorted(v for _, v in layers)[len(layers) // 2]
        at = lo_op if math.log(median / lo) >= math.log(hi / median) else hi_op
        message = (f"weight-gradient variance spans {fmt(spread)}x across {len(layers)} layers "
                   f"(per-position std: smallest {fmt(lo)} at {lo_op.module or '<model>'}, largest {fmt(hi)} at "
                   f"{hi_op.module or '<model>'}); the layer fans explain {fmt(predicted)}x "
                   f"(limit {fmt(limit)}x)")
        fix = ("re-initialise the layers for the activation after each (see IL001) so that the forward signal is "
               "stable; then the gradients are too")
        return self.finding(audit, at, message, fix, value=spread, threshold=limit)

    def _layers(self, audit: AuditContext) -> List[Tuple[Op, float]]:
        """(first op, per-position gradient std) of every judged weight layer."""
        uses: Dict[str, List[Op]] = {}
        for op in audit.graph:
            if op.kind in O.WEIGHT_KINDS and "weight" in op.params:
                uses.setdefault(op.params["weight"], []).append(op)
        gated = gated_ops(audit)
        left_out = broadcast_sources(audit) | product_branches(audit.graph) | quiet_branches(audit)
        layers = []
        for name, ops in uses.items():
            stats = audit.probe.grads.get(name)
            if not stats or not _finite(stats.get("std", float("nan"))) or stats["std"] == 0:
                continue  # exactly zero gradients are IL003's (dead units) or IL008's (symmetry) business
            if any(gated.get(op.id) or op.id in left_out or _feeds_product(audit.graph, op) for op in ops):
                continue
            # the weight's gradient sums over every call (an unrolled cell runs once per step)
            positions = sum(_positions(audit.shape(op), op.kind) for op in ops)
            layers.append((ops[0], stats["std"] / math.sqrt(positions)))
        return layers

    @staticmethod
    def _predicted(audit: AuditContext, ops: List[Op]) -> float:
        """The spread the layer fans explain (He et al.'s bound), at least 1: the largest fan-in over the
        smallest fan-out (a contracting network), or the largest fan-out over the smallest fan-in (a
        widening one, such as a head over thousands of classes)."""
        fans_in, fans_out = [], []
        for op in ops:
            w = audit.param(op.params["weight"])
            if w is None or w.dim() < 2:
                continue
            fan_in = O.fan_in(w, op.kind, op.attrs.get("layout", "out_in"))
            fans_in.append(fan_in)
            fans_out.append(w.numel() // max(fan_in, 1) if op.kind == "linear" else int(w.shape[0]))
        if not fans_in:
            return 1.0
        return max(1.0, max(fans_in) / max(1, min(fans_out)), max(fans_out) / max(1, min(fans_in)))

    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        """With no repaired cause: LSUV on the layers of the stretch whose output scale is off."""
        lsuv_stretch(plan, module, self.code, "weight gradients drift through this stretch", from_layer=False,
                     fallback=lambda op: scale_target(plan, op))


def segments(graph: Graph) -> Dict[int, int]:
    """Op id -> id of the op where its segment starts: an input, a normalisation, or a pooling or
    reduction (after a mean over positions each position's backward signal is divided by their count)."""
    seg: Dict[int, int] = {}
    for op in graph:
        if op.kind in O.NORM_KINDS or op.kind in _RESTART_KINDS or not op.inputs:
            seg[op.id] = op.id
        else:
            seg[op.id] = seg.get(op.inputs[0], op.inputs[0])
    return seg


def quiet_branches(audit: AuditContext) -> Set[int]:
    """Ops whose every path to a merge or the model output ends as the smaller input of a sum of two parallel
    branches (an ``add`` of two signals that is not a residual addition), where it is at most ``GATE_MAX`` of
    the other input's scale (rms)."""
    graph = audit.graph
    residual = {r.add.id for r in residuals_of(audit)}
    quiet_edges: Set[Tuple[int, int]] = set()
    for op in graph:
        if op.kind != "add" or len(op.inputs) != 2 or op.id in residual or op.inputs[0] == op.inputs[1]:
            continue
        a, b = (measured_rms(audit, graph[i]) for i in op.inputs)
        if not (a and b and a == a and b == b):
            continue
        if min(a, b) <= GATE_MAX * max(a, b):
            quiet_edges.add((op.inputs[0 if a <= b else 1], op.id))
    closed = closed_off(graph, quiet_edges) if quiet_edges else {}
    return {i for i, shut in closed.items() if shut}


def product_branches(graph: Graph) -> Set[int]:
    """Ops whose every path to a residual addition or the model output passes through a product of two
    signals: an expert of a mixture weighted by its routing probability (zero for the tokens routed
    elsewhere), a gated unit. The gradient of every layer on such a branch is scaled by the other factor."""
    signal: Set[int] = set()
    for op in graph:
        if op.id in graph.inputs or any(i in signal for i in op.inputs):
            signal.add(op.id)
    outputs = set(graph.outputs)
    open_path: Dict[int, bool] = {}
    for op in reversed(graph.ops):
        if op.kind in _SCORE_KINDS or (op.kind == "mul" and sum(i in signal for i in op.inputs) >= 2):
            open_path[op.id] = False
        elif op.id in outputs or (op.kind == "add" and len(op.inputs) >= 2) or op.kind in _RESTART_KINDS:
            open_path[op.id] = True
        else:
            open_path[op.id] = any(open_path.get(u, False) for u in op.users)
    return {op.id for op in graph if op.users and not any(open_path.get(u, False) for u in op.users)}


def _feeds_product(graph: Graph, op: Op) -> bool:
    """True when the layer's output is one factor of a product of two signals (attention scores, a gate
    such as a GRU's reset gate or a SwiGLU's gate, a routing weight), directly or through an activation:
    its gradient is scaled by the other factor, legitimately tiny at initialisation."""
    frontier = downstream(graph, op)
    for t in list(frontier):
        if t.kind in O.ACTIVATIONS:
            frontier += downstream(graph, t)
    return any(t.kind in _SCORE_KINDS or (t.kind == "mul" and len(t.inputs) > 1) for t in frontier)


def free_scale(audit: AuditContext) -> Set[int]:
    """Ops whose output reaches nothing but normalisations that normalise (not starved by their epsilon),
    through ops that only rescale it (layers without a bias or with an all-zero one, activations that are
    0 at 0, views) and products with other signals. A weight layer among them (itself such a rescale) has a
    free scale: scaling its weight by ``c`` changes nothing the model computes, and its gradient by ``1 / c``
    (a CLIP-style projection into the L2 normalisation of the embeddings; a bias-free layer before a norm).
    A sum with another signal, the model output or anything else ends that. One pass, users first."""
    graph, outputs = audit.graph, set(audit.graph.outputs)
    free: Set[int] = set()
    for op in reversed(graph.ops):
        users = [graph[u] for u in op.users if not created_tensor(graph[u]) and not graph[u].attrs.get("norm_statistic")]
        if op.id not in outputs and users and all(
                (u.kind in O.NORM_KINDS and not starved(audit, u)) or
                ((rescales_only(audit, u) is True or (u.kind in ("mul", "div", "matmul") and len(u.inputs) > 1))
                 and u.id in free)
                for u in users):
            free.add(op.id)
    return free


def _positions(shape: Optional[Tuple[int, ...]], kind: str) -> int:
    """How many (sample, position) pairs a layer's weight was applied to, from its output's shape: its
    gradient sums over them."""
    if not shape:
        return 1
    axis = 1 if kind == "conv" and len(shape) > 1 else -1
    return max(1, _numel(shape) // max(1, int(shape[axis])))


def broadcast_sources(audit: AuditContext) -> Set[int]:
    """Ops whose output is broadcast over positions it was not computed at (a timestep or class embedding
    added to every pixel, a FiLM or AdaLN modulation), directly or through other layers, before any
    pooling or reduction: their gradient gathers every position they reach."""
    graph = audit.graph
    feeds: Dict[int, bool] = {}
    for op in reversed(graph.ops):
        hit = False
        shape = audit.shape(op)
        for user in graph.consumers(op):
            if user.kind in _RESTART_KINDS:
                continue
            user_shape = audit.shape(user)
            if user.kind in ("add", "mul") and user_shape and shape and _numel(user_shape) > _numel(shape):
                hit = True
            elif feeds.get(user.id):
                hit = True
        feeds[op.id] = hit
    return {i for i, hit in feeds.items() if hit}


def _numel(shape: Tuple[int, ...]) -> int:
    total = 1
    for s in shape:
        total *= int(s)
    return total


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")
