"""IL008 symmetric-init."""
from __future__ import annotations

import math
from typing import Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from ..capture import ops as O
from ..capture.graph import Graph, Op
from ..report.findings import Finding
from ..probe.declared import Table
from ..probe.duplicates import KEYED, unit_matrix, unit_owners
from .base import (EXPAND, SKIP, AuditContext, Example, RepairPlan, Rule, activation_gain, downstream, fmt, init_fix,
                   outside_autograd, py_path, reads_into, to_host, walk_users)
from .il001_init_scale import scale_target
from .il002_bias_before_norm import cancelling_norm


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def constant_and_zero_hidden_layers():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    nn.init.constant_(model[0].weight, 0.1)  # every unit computes the same thing
    nn.init.zeros_(model[2].weight)
    return model


def zero_filters_before_batchnorm():
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    with torch.no_grad():
        model[0].weight[3:].zero_()  # 13 of 16 filters: their channels are constant over the batch
    return model


def zero_initialised_attention_weights_over_sampling_points():
    class SampledAttention(nn.Module):
        """Deformable DETR's form: each query weighs its sampled values by a softmax of a zero-initialised Linear."""

        def __init__(self, dim=64, points=4):
            super().__init__()
            self.values = nn.Linear(dim, dim * points)
            self.attention_weights = nn.Linear(dim, points)
            nn.init.zeros_(self.attention_weights.weight)  # deliberate: every query starts weighing its points alike
            nn.init.zeros_(self.attention_weights.bias)
            self.output_proj = nn.Linear(dim, dim)
            self.points = points

        def forward(self, x):
            v = self.values(x).unflatten(-1, (self.points, -1))
            w = self.attention_weights(x).softmax(-1).unsqueeze(-1)
            return self.output_proj((w * v).sum(-2))

    return SampledAttention(), torch.randn(2, 16, 64)


def zero_initialised_classifier_head():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    nn.init.kaiming_normal_(model[0].weight, nonlinearity="relu")
    nn.init.zeros_(model[2].weight)  # deliberate: the head's gradient still differs per unit
    return model


class SymmetricInit(Rule):
    """## What it does
    Finds weight layers (Linear, Conv) whose weights cannot break symmetry: every value
    equal (``nn.init.constant_``), all zero in a layer whose output feeds further weight
    layers, or units that are exact copies of each other (the same weights and the same
    bias).

    Copies are found exactly: each unit (its row of weights and its bias) is hashed to two
    random projections, units whose hashes match are candidates, and every candidate pair is
    then compared value by value. A count of copies is never an estimate, and units whose
    weights agree but whose biases differ are not copies. Units of different groups of a
    grouped convolution read different inputs and are never compared.

    ## Why is this bad?
    A unit that copies another computes the same output for every input: the layer has
    fewer distinct units than it seems. As long as what lies downstream treats the copies
    alike (the classic case: every layer initialised to one constant) they also receive the
    same gradient and stay copies for the whole of training. An all-zero hidden layer
    blocks the backward signal (``delta_{l-1} = W_l^T delta_l = 0``), so nothing below it
    learns through it. It stays zero when its own gradient ``delta_l (x) x`` is zero too:
    when it reaches the next weight layer through a ReLU (``ReLU(0) = 0`` with derivative 0),
    or when that next layer is all zero as well. Through anything else (GELU, tanh, no
    activation) it moves on its first step, and the layers below it wait for that one step
    only: it is not flagged (Grounding DINO zeroes the last layer of its reference-point head,
    which feeds its decoder's attention).

    A zero filter in front of a per-channel norm makes its channel constant over the batch.
    Without a bias the norm outputs its shift ``beta`` there; ``ReLU(0) = 0`` with zero
    gradient, so the channel is frozen under SGD and Adam alike. With a bias the channel is
    its bias plus rounding noise of about ``1e-7``, which the norm divides by
    ``sqrt(var + eps) ~ sqrt(eps)``: some of those channels pass the ReLU with gradients
    hundreds of times the live channels', the others stay frozen (13 zero filters of 16,
    torch-audit's ``demo_cv``: 5-8 noisy channels with 200-400x gradients).

    Deliberate cases are not flagged. Normalisation scales and shifts are not weight
    layers. A zero-initialised layer whose output is added to a residual stream before any
    other weight layer (zero-init of a residual branch's last layer or last BatchNorm gamma,
    Fixup, ReZero, SkipInit) or that produces the model output (a zero-initialised
    classifier head) starts as the identity of the block or a uniform prediction, and its
    gradient is not zero, because its input is not. So does a zero-initialised layer whose
    output goes into a softmax: Deformable DETR's attention weights over its sampling points
    (``constant_(attention_weights.weight, 0.0)``, kept by RT-DETR, D-FINE, DEIM and Grounding
    DINO) start uniform, and the layer learns from its first step. A constant depthwise
    convolution (one unit per group) is a fixed filter per channel, not a set of copies. Nor
    is a sub-pixel convolution initialised as nearest-neighbour upsampling (ICNR; the
    Nemotron diarizer's upsampler): its output is reshaped so that the units that copy each
    other fill the same channel at different positions, where targets that differ by position
    give them different gradients.

    A layer the model runs with autograd off (a ``torch.no_grad`` block of its own) gets no
    gradient from the model's loss, so whether its units part is up to whatever else trains it:
    the finding is information. GLM-5-Next's sparse-attention indexer
    scores its keys under ``no_grad`` with a gate its ``_init_weights`` sets to ones; such
    indexers are trained with a loss of their own.

    ## Fix
    Draw the weights at random with the scale the next activation needs:
    ``nn.init.kaiming_normal_(hidden.weight, nonlinearity="relu")``. For an embedding, or an
    output layer over a vocabulary or classes, small random values:
    ``nn.init.normal_(embedding.weight, std=0.02)``, or the layer's own
    ``reset_parameters()``.

    ## Options
    None.
    """

    code = "IL008"
    name = "symmetric-init"
    severity = "warning"
    needs = frozenset({"graph"})
    summary = "constant or zero weights, and units that are exact copies of each other (weights and bias compared in full)"
    role = "cause"
    bad = (Example(constant_and_zero_hidden_layers, expect={"0", "2"}), Example(zero_filters_before_batchnorm, expect={"0"}))
    good = (Example(zero_initialised_classifier_head), Example(zero_initialised_attention_weights_over_sampling_points))

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        layers = []
        seen = set()
        for op in audit.graph:
            if op.kind not in O.WEIGHT_KINDS or "weight" not in op.params or op.params["weight"] in seen:
                continue
            name = op.params["weight"]
            stats = audit.probe.params.get(name)
            if stats:
                seen.add(name)
                layers.append((op, name, stats))
        zero = _zero_units_before_norms(audit, [(op, name) for op, name, _ in layers])
        for op, name, stats in layers:
            finding = self._judge(audit, op, name, stats, zero.get(name))
            if finding is not None:
                yield finding

    def _judge(self, audit: AuditContext, op: Op, name: str, stats: Dict[str, float],
               zero: Optional[Tuple[int, int, Op]]) -> Optional[Finding]:
        return outside_autograd(audit, op, self._verdict(audit, op, name, stats, zero))

    def _verdict(self, audit: AuditContext, op: Op, name: str, stats: Dict[str, float],
                 zero: Optional[Tuple[int, int, Op]]) -> Optional[Finding]:
        if zero is not None and zero[0] > 0:
            return self._zero_filters_before_norm(audit, op, name, *zero)
        rows, groups = int(stats.get("rows", 0)), max(int(stats.get("groups", 1)), 1)
        dups = int(stats.get("dup_rows", 0))
        numel = _numel(audit, name)
        # extremes are measured for the weights that may be zero or constant; the others are neither
        # (field reads: asking by name would take the extremes of every weight)
        spread, absmax = getattr(stats, "spread", None), getattr(stats, "absmax", None)
        if spread == 0 and absmax == 0:
            frozen = _frozen_zero(audit, op) if feeds_weight_layer(audit.graph, op) else None
            if frozen is None:
                return None
            bias = audit.param(op.params["bias"]) if "bias" in op.params else None
            whose = "its output is its bias alone, and every unit whose bias is not positive gets" \
                if bias is not None and bool(bias.detach().ne(0).any()) and "RELU" in frozen.upper() \
                else "its own gradient is"
            return self.finding(audit, op, f"all {numel} weights of {name} are zero and its output feeds further "
                                f"weight layers through {frozen}: the backward signal through it is exactly zero "
                                f"(W^T delta = 0), {whose} zero at every step, so neither it nor the layers below "
                                f"it learn along this path", weight_fix(audit, op), value=0.0, threshold=0.0)
        if spread == 0 and rows // groups >= 2:
            same = "and so are the biases: its units compute the same output for every input" \
                if dups == rows - groups else "its units weigh the input identically and differ only by their biases"
            scope = f"{rows} units" if groups == 1 else f"{rows} units in {groups} groups"
            return self.finding(audit, op, f"all {numel} weights of {name} ({scope}) equal {fmt(stats['mean'])}, "
                                f"{same}", weight_fix(audit, op), value=0.0, threshold=0.0)
        if dups >= 1 and _subpixel_copies(audit, op, name, rows, dups):
            return None
        if dups >= 1:
            compared = "weights and bias compared in full" if stats.get("biased") else "weights compared in full; no bias"
            return self.finding(audit, op, f"{dups} of the {rows} units of {name} are exact copies of another unit "
                                f"({compared}): each computes the same output as its original for every input",
                                weight_fix(audit, op), value=float(dups), threshold=0.0)
        return None

    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        """A fresh random draw; the scale is the init-scale rule's target, else the layer's own, else the activation's."""
        op = plan.weight_op(module)
        if op is None:
            return
        target = scale_target(plan, op)
        stats = plan.ctx.probe.params.get(op.params["weight"], {})
        if target is not None:
            std = target
        elif getattr(stats, "spread", None) != 0 and stats.get("rms", 0.0) > 0:  # no extremes: not constant
            std = stats["rms"]  # duplicated rows in a layer of the right scale: keep the scale
        else:
            std = activation_gain(plan.graph, op) / math.sqrt(plan.ctx.fan_in(op) or 1)
        plan.redraw(op, std, self.code, "weights that cannot break symmetry: a fresh random draw")

    def _zero_filters_before_norm(self, audit: AuditContext, op: Op, name: str, zero: int, units: int,
                                  norm: Op) -> Finding:
        """Units whose weights are all exactly zero in front of a per-channel norm: constant channels."""
        relu = _relu_reads(audit.graph, norm)
        if "bias" in op.params:
            effect = ("each of those channels is its bias, the same for every sample and position: the norm "
                      "divides its rounding noise (about 1e-7) by sqrt(eps), so those channels carry noise whose "
                      "gradients are hundreds of times the live channels', or no gradient at all")
        elif relu:
            effect = ("each of those channels is zero for every sample and position: the norm outputs its shift "
                      "(beta) there, the ReLU that reads it passes no gradient, and the channels stay frozen for "
                      "the whole of training")
        else:
            effect = ("each of those channels is zero for every sample and position: the norm outputs its shift "
                      "(beta) there, and the gradient it passes back to the filters is divided by sqrt(eps), "
                      "hundreds of times the live filters'")
        return self.finding(audit, op, f"{zero} of the {units} filters of {name} are exactly zero and feed "
                            f"{norm.target} ({norm.module or '<model>'}): {effect}", weight_fix(audit, op),
                            value=float(zero), threshold=0.0)


def _zero_units_before_norms(audit: AuditContext, layers: List[Tuple[Op, str]]) -> Dict[str, Tuple[int, int, Op]]:
    """``name -> (units all exactly zero, units, norm)`` for the weight layers a per-channel norm follows,
    counted on the device. A unit can be zero only where its first :data:`KEYED` weights are: those are
    counted first (one or two cache lines of each unit, one transfer), and only a layer with such units
    is read in full (a second transfer)."""
    found = []
    for op, name in layers:
        weight = audit.param(name)
        norm = cancelling_norm(audit, op) if weight is not None and weight.dim() >= 2 else None
        if norm is not None:
            found.append((name, norm, unit_matrix(weight.detach(), op.attrs.get("layout", "out_in"))))
    counts = _zero_heads(found)
    again = [i for i, (c, (_, _, units)) in enumerate(zip(counts, found)) if c and units.shape[1] > KEYED]
    for i, c in zip(again, to_host([(found[i][2] == 0).all(dim=1).sum() for i in again]) if again else []):
        counts[i] = int(c)
    return {name: (c, units.shape[0], norm) for (name, norm, units), c in zip(found, counts)}


def _zero_heads(found: List[Tuple[str, Op, torch.Tensor]]) -> List[int]:
    """Per layer of ``found`` (``(units, fan)`` matrices): its units whose first :data:`KEYED` weights are all
    exactly zero, counted for all layers of one keyed width, dtype and device in one batch (a few ops per
    batch, not per layer), and read in one transfer per device."""
    batches: Dict[Tuple[int, torch.dtype, torch.device], List[int]] = {}
    for i, (_, _, units) in enumerate(found):
        batches.setdefault((min(units.shape[1], KEYED), units.dtype, units.device), []).append(i)
    table = Table()
    for (keyed, _, device), layers in batches.items():
        layers.sort(key=lambda i: found[i][2].shape[0])  # equal unit counts side by side (unit_owners)
        zero = (torch.cat([found[i][2][:, :keyed] for i in layers]) == 0).all(dim=1)
        owners = unit_owners([found[i][2].shape[0] for i in layers], device)
        table.add(layers, torch.zeros(len(layers), dtype=torch.int64, device=device).index_add_(0, owners, zero.long()))
    out = [0] * len(found)
    for i, count in table.read():
        out[i] = int(count)
    return out


def _relu_reads(graph: Graph, norm: Op) -> bool:
    """True when a ReLU reads the norm's output directly (through views and the like, not through an add)."""
    return reads_into(graph, norm, {"relu", "relu6"}, set(O.PASS_KINDS), 16)


def weight_fix(audit: AuditContext, op: Op) -> str:
    """A random init that fits the layer: small normal values for an embedding (tied weight) or an output layer
    over classes, else the init the next activation needs."""
    name = op.params["weight"]
    if _is_embedding(audit.graph, name):
        return f"nn.init.normal_({py_path(name)}, std=0.02)  # small random values, as for an embedding"
    if not feeds_weight_layer(audit.graph, op):
        module = _owner(audit, op)
        if module is not None:
            return f"{py_path(op.module)}.reset_parameters()  # {type(module).__name__}'s default init"
        return f"nn.init.normal_({py_path(name)}, std=0.02)  # small random values, as for an output layer"
    fan = audit.fan_in(op)
    act = next((t for t in downstream(audit.graph, op) if t.kind in O.ACTIVATIONS), None)
    if not fan:
        return f"nn.init.normal_({py_path(name)}, std=0.02)"
    return init_fix(audit, op, act.kind if act is not None else "identity", fan)


def _is_embedding(graph: Graph, name: str) -> bool:
    return any(op.kind == "embedding" and name in op.params.values() for op in graph)


def _owner(audit: AuditContext, op: Op):
    """The module that owns the weight and resets it to a default random init, if it is a standard layer."""
    try:
        module = audit.model.get_submodule(op.module) if op.module else audit.model
    except AttributeError:
        return None
    weight = getattr(module, "weight", None)
    owned = weight is not None and weight is audit.param(op.params["weight"])
    standard = type(module).__module__.startswith("torch.nn")
    return module if owned and standard and hasattr(module, "reset_parameters") else None


def feeds_weight_layer(graph: Graph, op: Op) -> bool:
    """True when ``op``'s output reaches another weight layer through neither a residual add, a norm nor a softmax."""
    def step(_current: Op, user: Op) -> object:
        if user.kind == "add" and len(user.inputs) > 1:
            return SKIP  # residual branch end: deliberate zero-init
        if user.kind in O.WEIGHT_KINDS or user.kind in ("rnn", "attention"):
            return True
        if user.kind in O.NORM_KINDS or user.kind == "softmax":
            return SKIP  # a norm rescales it; zero logits make a softmax uniform, which it learns away from
        return EXPAND

    return walk_users(graph, op, step, False)


def _subpixel_copies(audit: AuditContext, op: Op, name: str, rows: int, dups: int) -> bool:
    """True when the copies are a sub-pixel convolution's, initialised as nearest-neighbour upsampling (ICNR):
    the output is reshaped (or pixel-shuffled) so that its ``rows`` channels become ``rows / f`` channels at
    ``f`` positions each, and the ``f`` units that land on the same channel are equal. Those copies sit at
    different positions, where targets that differ by position part them on the first step."""
    current, factor, blocked = op, 0, False
    for _ in range(8):
        users = audit.graph.consumers(current)
        if len(users) != 1:
            return False
        current = users[0]
        if "pixel_shuffle" in current.target:  # (B, C r^2, H, W) -> (B, C, r H, r W)
            shape = audit.shape(current)
            factor, blocked = (rows // shape[1] if shape and len(shape) > 1 and shape[1] else 0), True
            break
        if current.kind != "view":
            return False
        before, shape = audit.shape(audit.graph[current.inputs[0]]) if current.inputs else None, audit.shape(current)
        if shape and before and rows not in shape:
            widths = [d for d in shape[1:] if 1 < d < rows and rows % d == 0]
            factor = rows // widths[-1] if widths else 0
            # the channels' factor goes into a position axis (frames x f), not an axis of its own
            if len(shape) != len(before) or not any(a == b * factor for a, b in zip(shape, before)):
                return False
            break
    weight = audit.param(name)
    if factor < 2 or weight is None or rows % factor or dups > rows - rows // factor:
        return False
    units = unit_matrix(weight.detach(), op.attrs.get("layout", "out_in"))
    groups = units.reshape(rows // factor, factor, -1).transpose(0, 1) if blocked \
        else units.reshape(factor, rows // factor, -1)
    return bool((groups == groups[:1]).all())


def _frozen_zero(audit: AuditContext, op: Op) -> Optional[str]:
    """What keeps an all-zero layer at zero for good, or None where it learns from its first step.

    Its weight gradient is ``delta (x) x``: its input ``x`` is not zero, so it is zero only where ``delta``,
    what comes back to its output, is zero at every step. That is so when the path to the next weight layer
    passes an activation flat at 0 (``ReLU(0) = 0`` with zero derivative), or when that next layer is all
    zero too. Through anything else (GELU, tanh, a product, nothing) its output's zeros pass a gradient
    back, it moves on the first step, and the layers below wait for that one step only (Grounding DINO's
    reference-point head, whose last layer is zero and feeds the decoder's attention).
    """
    frontier, seen = [(op, "")], {op.id}
    while frontier:
        current, flat = frontier.pop()
        for user in audit.graph.consumers(current):
            if user.id in seen:
                continue
            seen.add(user.id)
            if (user.kind == "add" and len(user.inputs) > 1) or user.kind in O.NORM_KINDS or user.kind == "softmax":
                continue
            if user.kind in O.WEIGHT_KINDS or user.kind in ("rnn", "attention"):
                if flat:
                    return f"{flat} (zero with zero gradient at 0)"
                other = audit.probe.params.get(user.params.get("weight", ""))
                if other and getattr(other, "spread", None) == 0 and getattr(other, "absmax", None) == 0:
                    return f"{user.params['weight']}, all zero too"
                continue
            frontier.append((user, flat or (user.target if user.kind in O.DYING_KINDS else "")))
    return None


def _numel(audit: AuditContext, name: str) -> int:
    p = audit.param(name)
    return p.numel() if p is not None else 0
