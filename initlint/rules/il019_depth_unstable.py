"""IL019 depth-unstable."""
from __future__ import annotations

import math
from typing import Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from ..probe.coords import INPUT_GRAD, STREAM, Axis, Curve, Fit, SweepData
from ..report.findings import Finding
from .base import AuditContext, Example, Rule, fmt
from .il005_signal_drift import SignalDrift


# Examples: a sweep over the factory's `n_layer` keyword (tests/test_rule_examples.py runs initlint.sweep on them).
class PreNormBlock(nn.Module):
    def __init__(self, width, multiplier, norm=True):
        super().__init__()
        self.norm = nn.LayerNorm(width) if norm else nn.Identity()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)
        nn.init.kaiming_normal_(self.fc.weight, nonlinearity="relu")
        nn.init.normal_(self.proj.weight, std=(4 * width) ** -0.5)  # a branch of unit scale
        self.multiplier = multiplier

    def forward(self, x):
        return x + self.multiplier * self.proj(torch.relu(self.fc(self.norm(x))))


class PreNormStack(nn.Module):
    def __init__(self, n_layer, multiplier=1.0, width=32, norm=True):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.ModuleList(PreNormBlock(width, multiplier, norm) for _ in range(n_layer))
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, 16)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x))


def residual_stack_without_block_norms(n_layer=4):
    # every block adds a branch of the stream's own scale to it: the stream doubles its variance per block
    return PreNormStack(n_layer, norm=False)


def pre_norm_stack_with_branch_multiplier(n_layer=4):
    return PreNormStack(n_layer, multiplier=1 / math.sqrt(2 * n_layer))  # the depth-muP forward multiplier


_SWEEP = {"depth": {"n_layer": [2, 4, 8]}, "steps": 1}


class DepthUnstable(Rule):
    """## What it does
    Runs on a sweep over depth (``initlint.sweep(..., depth={"n_layer": [...]})`` or
    ``initlint sweep --depth n_layer=...``): the model is built at several depths, and two
    scales are measured at initialisation and after each of a few optimizer steps on the same
    batch: the residual stream (the input of the normalisation that follows the model's main
    stack of numbered blocks, a pre-norm transformer's final norm, else the output of the
    stack's last block; reported at the stack, ``transformer.h``) and the norm of the gradient
    of the input layer (the first layer to run, such as the token
    embedding). For each, it fits ``scale ~ depth^alpha`` on log-log axes and flags an
    exponent whose size is above the limit, growing or shrinking. The message gives the
    exponent and the depth budget: the depth at which the fitted trend has moved the scale by
    the signal-drift rule's ``max-scale-ratio`` (IL005; default 100) from the smallest depth
    tried.

    ## Why is this bad?
    In a residual network every block adds its branch to the stream. With branches of unit
    scale the stream's variance grows with the number of blocks: measured on a pre-LN stack,
    the stream grows at depth^+0.46 at init and +0.58 after 3 Adam steps. The final norm hides
    the forward scale, but each branch then reads an ever smaller fraction of the stream, and
    the gradient reaching the input layer shrinks or grows with depth, so the learning rate
    tuned at a small depth does not transfer. GPT-2's ``1/sqrt(2L)`` scaling of the branch
    ends *at init*, or zero-initialised branch ends, are flat at init only: Adam moves every
    weight by about the learning rate whatever its init, so after 3 steps these stacks grow at
    +0.44 and +0.62. A ``1/sqrt(2L)`` multiplier in the forward (the depth-muP recipe) stays
    flat. It also shrinks the branch weights' gradients with depth, which is harmless under
    Adam, so the rule judges the gradient at the input layer, not the branch weights.

    ## Fix
    Multiply each residual branch by ``1/sqrt(2 L)`` in the forward pass (``L`` blocks, two
    branches each), so that the scaling holds after training starts:
    ```python
    x = x + self.attn(self.ln_1(x)) / math.sqrt(2 * n_layer)
    x = x + self.mlp(self.ln_2(x)) / math.sqrt(2 * n_layer)
    ```
    A scaling applied to the init only (``std = 0.02 / sqrt(2 * n_layer)`` on ``c_proj``, or a
    zero-initialised branch end) holds at init only.

    ## Options
    - ``limit`` (default ``0.5``): the largest exponent (either sign) accepted. Calibrated on
      pre-LN stacks of depth 2 to 16 (``benchmarks/bench_sweep.py``, README "Sweep
      calibration"): none of the four recipes lost its best learning rate at depth 16, the
      unscaled stack included (its stream grows at +0.20 at init and up to +0.50 after 3 Adam
      steps at lr 1e-3), so the limit sits above every exponent measured there. A pre-norm
      stream grows at most as ``sqrt(depth)`` at init; a stack whose blocks are not
      normalised grows exponentially (``residual_stack_without_block_norms``: +1.5).
    """

    code = "IL019"
    name = "depth-unstable"
    severity = "warning"
    role = "symptom"
    needs = frozenset({"sweep"})
    summary = "the residual stream or the input layer's gradient growing or shrinking with the model's depth (a sweep)"
    options = {"limit": 0.5}
    option_ranges = {"limit": (0, None)}
    axis = "depth"
    """The axis of a sweep the rule judges."""
    bad = (Example(residual_stack_without_block_norms, expect={"blocks"}, options=_SWEEP),)
    good = (Example(pre_norm_stack_with_branch_multiplier, options=_SWEEP),)

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        return iter(())  # a single audit sees one depth; the rule judges a sweep (judge)

    def judge(self, data: SweepData, drift_limit: Optional[float] = None) -> Iterator[Tuple[Curve, Finding]]:
        """The findings of a sweep, each with the curve it judges: the stream and the input layer's gradient,
        when they drift with depth.

        ``drift_limit``: the signal-drift rule's ``max-scale-ratio`` the depth budget is read against
        (default: that rule's default)."""
        axis = data.axis(self.axis)
        if axis is None:
            return
        ratio = drift_limit or SignalDrift.options["max-scale-ratio"]
        for curve in axis.curves.values():
            if curve.quantity not in (STREAM, INPUT_GRAD):
                continue
            worst = _largest(curve)
            if worst is not None and abs(worst[1].alpha) > self.opts["limit"]:
                yield curve, self._finding(axis, curve, worst[0], worst[1], ratio)

    def _finding(self, axis: Axis, curve: Curve, step: int, fit: Fit, ratio: float) -> Finding:
        start = min(s for s, v in zip(curve.sizes, curve.values[step]) if v is not None)
        budget = start * ratio ** (1 / abs(fit.alpha))
        when = "at init" if step == 0 else f"after step {step}"
        init = curve.fit(0)
        direction = "grows" if fit.alpha > 0 else "shrinks"
        message = (f"{curve.quantity} {direction} with depth as {axis.keyword}^{fit.alpha:+.2f} {when} "
                   f"(limit {fmt(self.opts['limit'])}; fit error {fit.error:.2f} over {fit.points} depths): depth "
                   f"budget {axis.keyword}={_budget(budget)}, where the trend reaches {fmt(ratio)}x its scale at "
                   f"{axis.keyword}={start} (signal-drift's max-scale-ratio)")
        if step > 0 and init is not None and abs(init.alpha) <= self.opts["limit"]:
            message += f"; flat at init ({axis.keyword}^{init.alpha:+.2f}): the depth scaling holds at init only"
        fix = (f"multiply each residual branch by 1/sqrt(2 * {axis.keyword}) in the forward "
               f"(x = x + self.attn(self.ln_1(x)) / math.sqrt(2 * {axis.keyword})); a scaling of the init alone "
               f"(std / sqrt(2 * {axis.keyword}) on the branch ends, zero-initialised branch ends) holds at init only")
        return self.make(curve.layer, message, fix, value=round(fit.alpha, 4), threshold=self.opts["limit"])


def _largest(curve: Curve) -> Optional[Tuple[int, Fit]]:
    """The step whose fit drifts fastest (either way), and its fit."""
    fits: List[Tuple[int, Fit]] = [(s, f) for s, f in enumerate(curve.fits()) if f is not None]
    return max(fits, key=lambda sf: abs(sf[1].alpha)) if fits else None


def _budget(depth: float) -> str:
    return f"{depth:.0f}" if depth < 1e6 else f"{depth:.1e}"
