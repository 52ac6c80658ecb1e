"""IL001 init-scale."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple

import torch.nn as nn

from ..capture import ops as O
from ..capture.graph import Op
from ..report.findings import Finding
from .base import (AuditContext, Example, RepairPlan, Rule, activation_after, copies, created_tensor, downstream,
                   fmt, fmt_beyond, init_fix, rescales_only, softmax_gate, starved, unclipped)



@dataclass
class _Judged:
    op: Op
    std: float
    band: Tuple[float, float]
    fan_in: int
    activation: str
    drift: float  # log variance factor of this layer against the nearest edge of its band


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def deep_relu_mlp_at_pytorch_default_init():
    layers = []
    for _ in range(8):
        layers += [nn.Linear(256, 256), nn.ReLU()]  # default init: std 1/sqrt(3 * 256)
    return nn.Sequential(*layers, nn.Linear(256, 10))


def randn_relu_mlp():
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    for layer in model[::2]:
        nn.init.normal_(layer.weight)  # std 1, 16x what ReLU needs at fan-in 256
    return model


def deep_relu_mlp_at_he_init():
    layers = []
    for _ in range(16):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(256, 10))
    for layer in model[:-1:2]:
        nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
    nn.init.kaiming_normal_(model[-1].weight, nonlinearity="linear")
    return model


def tiny_init_behind_batchnorm():
    layers = []
    for _ in range(10):
        layer = nn.Linear(64, 64, bias=False)
        nn.init.normal_(layer.weight, std=0.001)  # far too small, but BatchNorm renormalises
        layers += [layer, nn.BatchNorm1d(64), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(64, 10))


class InitScale(Rule):
    """## What it does
    Compares every weight layer's weight scale (Linear, Conv1d/2d/3d, and matmuls with a
    parameter such as GPT-2's ``Conv1D``) with the scale its downstream nonlinearity needs,
    ``gain / sqrt(fan_in)``, and follows how far the mismatch compounds through the layers
    that come after it before anything renormalises the signal.

    The nonlinearity is read from the graph (module, functional or tensor-method form).
    Gains: ReLU ``sqrt(2)`` (He), LeakyReLU ``sqrt(2 / (1 + slope^2))``, tanh anything from
    ``1`` (LeCun, Glorot on square layers) to ``5/3`` (PyTorch's gain), sigmoid ``1`` to
    ``4``, SELU ``3/4`` to ``1``, no activation ``1``. For any other elementwise activation
    (GELU, SiLU, ELU, Mish, Softplus ...) the gain is computed numerically as
    ``1 / sqrt(E[phi(z)^2])`` for ``z ~ N(0, 1)``: the gain that keeps the second moment of
    the signal unchanged through ``phi`` (it gives ``sqrt(2)`` for ReLU, 1.53 for GELU,
    1.68 for SiLU).

    ## Why is this bad?
    For a layer ``y = W x`` with i.i.d. zero-mean weights, ``Var(y) = fan_in * Var(w) * E[x^2]``.
    After an activation ``phi``, ``E[phi(y)^2] = Var(y) / gain^2``. So each layer multiplies
    the signal's second moment by ``(std(w) * sqrt(fan_in) / gain)^2``, and a stack of L
    layers multiplies it by the product of these factors. The rule measures each weight's
    root mean square, which is its std when its mean is zero and the scale that enters
    ``E[y^2]`` when it is not. The compounded factor is a prediction from the weight scales
    (the forward probe's measurement is IL005's). A factor of 1/6 per layer (PyTorch's
    default ``nn.Linear`` init, std ``1/sqrt(3 fan_in)``, in front of a ReLU) is harmless in a
    two-layer network (1/18 in all), but an eight-layer ReLU MLP shrinks its signal by about
    ``6^8``: the biases take over, half of the last layer's units die, and gradients vanish.
    Randomly drawn ``randn`` weights do the opposite and explode.

    A normalisation layer (BatchNorm, LayerNorm, GroupNorm, RMSNorm, also hand-written ones, and
    ones written as functional ops: ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``,
    an L2 normalisation ``x / x.norm(dim=-1, keepdim=True)``, ``F.normalize``) resets the scale,
    so a layer whose output reaches one before the next weight layer is not judged, and
    compounding restarts after every normalisation. A shrink that reaches a normalisation through
    layers without a bias (or with an all-zero one) and activations that are 0 at 0 is a rescaled
    copy of the signal, which the normalisation undoes: it is not judged there (the gated delta
    rule of Qwen3-Next and Lara-mini normalises its queries and keys this way, and its values
    with a gated RMSNorm; at Hugging Face's init, its depthwise conv of std 0.02 at fan-in 4, that
    model learnt the copy task of ``benchmarks/hf_init_training.py`` sooner than with PyTorch's
    default conv). A layer's bias that a shrunk signal no longer dominates makes it more than a
    rescale, and the shrink is judged; so is a shrink into a normalisation whose epsilon outweighs
    its input's mean square, which then does not normalise: the shrink goes on through it. At a residual addition the larger of the two signals
    carries on: a deliberately small residual branch (GPT-2's ``N(0, 0.02)`` behind LayerNorm,
    zero-initialised last layers) is not a defect. A product of two signals (a gate, ``q @ k^T``,
    a linear solve) multiplies their scales and carries the shrinks of both on, to the softmax or
    normalisation that ends them, and the growth of both but a gate's: a bounded activation
    (sigmoid, hardsigmoid, tanh) caps what it passes on (squeeze-excitation's
    ``x * hardsigmoid(conv(pool(x)))`` grows as ``x`` does, once); a small input leaves a sigmoid at 1/2 (softplus at ln 2), so
    its output does not shrink with it, and a softmax whose output only gates elementwise
    (PatchTSMixer's ``h * softmax(W h)``) uniform, a constant factor of one over its size: the
    shrink into such a softmax is not judged, what it gates carries its own on (PatchTSMixer at its
    own init, every Linear at std 0.02 at a width of 8, learnt the forecasting task of
    ``benchmarks/hf_init_training.py`` in 43-46 steps, with its mixers at ``1 / sqrt(fan_in)`` in
    104-149). An attention's softmax, whose output weighs the tokens (``softmax(q k^T) @ v``), is
    judged. A clamp that leaves the probe's signal as it was (D-FINE's query positions,
    ``.clamp(min=-10, max=10)`` on values of scale 1e-3) passes a shrink on to where it ends.

    The rule flags the layers that contribute to a compounded change of the signal's second
    moment beyond ``max-variance-drift`` (either way) by the time the signal reaches a
    normalisation, a softmax or attention, an op of unknown gain, or the model output. Layers within
    ``tolerance`` of their target (sampling noise of a finite weight matrix) contribute nothing.

    ## Fix
    Initialise each flagged layer for the activation that follows it:
    ```python
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            nn.init.zeros_(m.bias)
    ```
    or put a normalisation layer in the chain.

    ## Options
    - ``max-variance-drift`` (default ``10000``): largest accepted compounded change of the
      signal's second moment, as a factor either way (100 in std). PyTorch's default init
      in front of ReLUs (1/6 per layer, 1/3 for the output layer) passes with up to four
      hidden layers and is flagged from five; LeCun init in a 10-layer ReLU network (1/2 per
      layer, 1/1024 in all) passes, in a 100-layer one it is flagged.
    - ``tolerance`` (default ``1.1``): a layer whose weight scale (rms) is within this factor
      of its target band counts as on target.
    """

    code = "IL001"
    name = "init-scale"
    severity = "warning"
    needs = frozenset({"graph"})
    summary = "weight scale (rms) against `gain / sqrt(fan_in)` of the next activation, judged by how far the mismatch compounds before a normalisation"
    role = "cause"
    bad = (Example(deep_relu_mlp_at_pytorch_default_init, expect={str(i) for i in range(0, 17, 2)}),
           Example(randn_relu_mlp, expect={"0", "2", "4"}))
    good = (Example(deep_relu_mlp_at_he_init), Example(tiny_init_behind_batchnorm))
    options = {"max-variance-drift": 1e4, "tolerance": 1.1}
    option_ranges = {"max-variance-drift": (1, None), "tolerance": (1, None)}

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        judged = self._judge(audit)
        flagged: Dict[int, Tuple[float, Op, int]] = {}
        limit = math.log(self.opts["max-variance-drift"])
        for endpoint, total, chain in self._endpoints(audit, judged):
            if abs(total) <= limit:
                continue
            for op_id in chain:
                prev = flagged.get(op_id)
                if prev is None or abs(total) > abs(prev[0]):
                    flagged[op_id] = (total, endpoint, len(chain))
        seen_modules = set()
        for op_id in sorted(flagged):
            j = judged[op_id]
            if j.op.module in seen_modules:
                continue
            seen_modules.add(j.op.module)
            total, endpoint, length = flagged[op_id]
            yield self._finding(audit, j, total, endpoint, length)

    # ------------------------------------------------------------------ judgement
    def _judge(self, audit: AuditContext) -> Dict[int, _Judged]:
        judged: Dict[int, _Judged] = {}
        tol = math.log(self.opts["tolerance"])
        for op in audit.graph:
            if op.kind not in O.WEIGHT_KINDS or "weight" not in op.params:
                continue
            stats = audit.probe.params.get(op.params["weight"])
            fan = audit.fan_in(op)
            if not stats or not fan:
                continue
            terms = downstream(audit.graph, op)
            if any(t.kind in O.NORM_KINDS for t in terms):
                continue
            act_kind, (lo, hi) = activation_after(terms)
            band = (lo / math.sqrt(fan), hi / math.sqrt(fan))
            std = stats["rms"]
            if std <= 0:
                continue  # all-zero weights are IL008's business
            edge = band[0] if std < band[0] else band[1] if std > band[1] else std
            ratio = math.log(std / edge)
            judged[op.id] = _Judged(op, std, band, fan, act_kind, 2 * ratio if abs(ratio) > tol else 0.0)
        return judged

    def _endpoints(self, audit: AuditContext, judged: Dict[int, _Judged]) -> Iterator[Tuple[Op, float, Tuple[int, ...]]]:
        """Propagate the predicted log-variance drift through the graph; yield it where the signal ends.

        Each entry also says whether everything since the chain's start only rescaled the signal
        (:func:`~initlint.rules.base.rescales_only`): such a shrunk signal is a rescaled copy of a healthy
        one, and a normalisation that receives it undoes the rescale."""
        drift: Dict[int, Tuple[float, Tuple[int, ...], bool]] = {}
        zero: Tuple[float, Tuple[int, ...], bool] = (0.0, (), True)
        for op in audit.graph:
            ins = [drift[i] for i in op.inputs if i in drift] or [zero]
            if op.attrs.get("norm_statistic") or created_tensor(op):
                # what a hand-written norm divides by is the norm's own; zeros_like(x) reads no value of x
                drift[op.id] = zero
            elif copies(op):
                drift[op.id] = ins[-1]  # dst.copy_(src) holds src's values
            elif ins[0][0] < 0 and unclipped(audit, op):
                drift[op.id] = ins[0]  # a clamp whose bounds a shrunk signal does not reach passes it on
            elif op.kind in O.NORM_KINDS and starved(audit, op):
                # its epsilon outweighs its input: it does not normalise, and the shrink goes on through it
                drift[op.id] = next((drift[i] for i in op.inputs
                                     if i in drift and not audit.graph[i].attrs.get("norm_statistic")), zero)
            elif op.kind in O.ENDPOINT_KINDS and not O.is_product(op):
                for total, chain, scaled in ins:
                    if total < 0 and ((op.kind in O.NORM_KINDS and scaled) or softmax_gate(audit, op)):
                        continue  # a norm undoes a rescale; a softmax gate left uniform is a constant factor
                    yield op, total, chain
                drift[op.id] = zero
            elif op.kind in O.ACTIVATIONS and O.ACTIVATIONS[op.kind].at_zero and ins[0][0] < 0:
                drift[op.id] = zero  # a shrunk input leaves sigmoid at 1/2: its output does not shrink with it
            else:
                if (op.kind == "mul" or O.is_product(op)) and len(ins) >= 2:
                    # a gate's bounded output (sigmoid, hardsigmoid, tanh) carries no growth into the product:
                    # squeeze-excitation's x * hardsigmoid(conv(pool(x))) grows as x does, once
                    ins = [(0.0, (), True) if i in drift and drift[i][0] > 0 and _bounded(audit.graph[i]) else drift[i]
                           for i in op.inputs if i in drift] or [zero]
                    total, chain = sum(t for t, _, _ in ins), tuple(sorted({c for _, ch, _ in ins for c in ch}))
                    scaled = all(s for _, _, s in ins)
                elif op.kind in ("add", "cat"):
                    total, chain, scaled = max(ins, key=lambda x: x[0])
                else:
                    total, chain, scaled = ins[0]
                own = rescales_only(audit, op)
                scaled = (scaled or not chain) and own is not False  # what came before the first drift is not judged
                d = judged[op.id].drift if op.id in judged else 0.0
                drift[op.id] = (total + d, chain + ((op.id,) if d else ()), scaled)
        for out in audit.graph.outputs:
            if out in drift:
                yield audit.graph[out], drift[out][0], drift[out][1]

    # ------------------------------------------------------------------ reporting
    def _finding(self, audit: AuditContext, j: _Judged, total: float, endpoint: Op, length: int) -> Finding:
        target = j.band[0] if j.std < j.band[0] else j.band[1]
        where = "the model output" if endpoint.id in audit.graph.outputs else f"{endpoint.target} ({endpoint.module or '<model>'})"
        direction = "shrinks" if total < 0 else "grows"
        gain_lo, gain_hi = (b * math.sqrt(j.fan_in) for b in j.band)
        gain = fmt(gain_lo) if abs(gain_hi - gain_lo) < 1e-9 else f"{fmt(gain_lo)}..{fmt(gain_hi)}"
        message = (
            f"weight rms {fmt(j.std)} is {fmt(j.std / target)}x the {fmt(target)} that {j.activation} needs "
            f"(gain {gain} / sqrt(fan_in {j.fan_in})); predicted from the weight scales of the {length} "
            f"mismatched layer(s) on its path, with no normalisation before {where}, the signal variance "
            f"{direction} {fmt_beyond(math.exp(abs(total)), self.opts['max-variance-drift'])}x "
            f"(limit {fmt(self.opts['max-variance-drift'])}x)"
        )
        return self.finding(audit, j.op, message, init_fix(audit, j.op, j.activation, j.fan_in),
                            value=j.std, threshold=target)

    # ------------------------------------------------------------------ repair (initlint.fix)
    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        """The std the next activation needs (this rule's own target), or LSUV where the gain is unknown."""
        judged = plan.judged(type(self)).get(module)
        op = plan.weight_op(module)
        if judged is None or op is None:
            return
        fan = plan.ctx.fan_in(op) or 1
        std = target_std(plan, op, judged.threshold)
        why = (f"weight std {fmt(judged.value)} -> {fmt(std)}, the scale the next activation needs "
               f"(gain {fmt(std * math.sqrt(fan))} / sqrt(fan_in {fan}))")
        if module in plan.acted:  # repaired in the first round and still flagged
            if plan.method == "analytic":
                plan.note(f"{self.code} {module}: still flagged after the analytic init; method auto or lsuv measures it")
            else:
                plan.lsuv(op, self.code, why, fallback_std=std)
        elif plan.data_driven(op):
            self._large_bias(plan, op, plan.lsuv_target)
            plan.lsuv(op, self.code, why, fallback_std=std)
        else:
            plan.redraw(op, std, self.code, why)
            self._large_bias(plan, op, std * math.sqrt(fan))

    def _large_bias(self, plan: RepairPlan, op: Op, gain: float) -> None:
        """Reset the bias of a rescaled layer when it, not the weights, would set the pre-activation's scale:
        rms above half the scale ``gain`` that the new weights give a unit-scale input (``randn`` biases)."""
        name = op.params.get("bias")
        bias = plan.ctx.param(name) if name else None
        if bias is None or bias.numel() == 0:
            return
        rms = float(bias.detach().float().pow(2).mean().sqrt())
        if rms > 0.5 * gain:
            plan.zero(name, op.module, self.code, f"bias rms {fmt(rms)} would outweigh the new weights "
                      f"(pre-activation scale {fmt(gain)} for a unit-scale input)")


PREFERRED_GAIN = {"selu": 1.0}
"""Where the rule accepts a band of gains, a repair draws the band's low end (LeCun's 1 for tanh and sigmoid),
except for these activations (SELU is self-normalising with LeCun's 1, the high end)."""


def _bounded(op: Op) -> bool:
    act = O.ACTIVATIONS.get(op.kind)
    return act is not None and act.bounds is not None


def target_std(plan: RepairPlan, op: Op, edge: float) -> float:
    """The std to draw: the activation's preferred gain when the rule accepts a band (tanh: LeCun's 1 rather
    than the 5/3 edge it names when the weights are too large), else the rule's target ``edge``."""
    act = next((t for t in downstream(plan.graph, op) if t.kind in O.ACTIVATIONS), None)
    if act is None:
        return edge
    fan = math.sqrt(plan.ctx.fan_in(op) or 1)
    lo, hi = O.ACTIVATIONS[act.kind].band(act.attrs)
    if not any(abs(edge * fan - g) <= 1e-6 * g for g in (lo, hi)):
        return edge  # the rule judged another activation than the one found here: follow the rule
    return PREFERRED_GAIN.get(act.kind, lo) / fan


def scale_target(plan: RepairPlan, op: Op) -> Optional[float]:
    """The std this rule asks of ``op``'s weight, when it judges the layer's scale off (else None)."""
    judged = plan.judged(InitScale).get(op.module)
    return target_std(plan, op, judged.threshold) if judged is not None else None
