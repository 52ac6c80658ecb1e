"""IL017 precision-headroom."""
from __future__ import annotations

import math
from typing import Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from ..capture import ops as O
from ..capture.graph import Op
from ..probe.precision import SCALER_INIT_SCALE, PrecisionStats
from ..report.findings import Finding
from .base import AuditContext, Example, Rule, fmt, gated_ops, measured, py_path, residuals_of

FP16_MAX = 65504.0
"""The largest finite float16."""
RESOLUTION = {"bf16": 2.0 ** -9, "fp16": 2.0 ** -12}
"""A value ``x`` added to a stream of rms ``s`` in this dtype is lost to rounding below about ``s * RESOLUTION``
(half a unit in the last place of a typical stream entry: 8 significant bits in bfloat16, 11 in float16)."""
JUDGED_KINDS = O.WEIGHT_KINDS | O.NORM_KINDS | frozenset(O.ACTIVATIONS) | {"matmul", "attention", "conv_transpose"}
"""Ops whose output overflowing float16 is the signal's own scale; an addition counts when it is a residual
one (an attention mask filled with ``finfo(float16).min`` sits at the limit on purpose)."""


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def mlp_whose_first_layer_outputs_exceed_fp16():  # audited with precision="fp16"
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    with torch.no_grad():
        model[0].weight.mul_(3e4)  # hidden activations reach ~1e5; float16 holds at most 65504
        model[2].weight.div_(3e4)  # the function is unchanged in float32
    return model, torch.randn(32, 64)


def mlp_at_default_init():  # audited with precision="fp16", and "bf16"
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)), torch.randn(32, 64)


class PrecisionHeadroom(Rule):
    """## What it does
    Runs only when the audit is given the precision training will use (``precision="fp16"`` or
    ``"bf16"``, ``--precision``). The probe then runs the forward and backward pass once more under
    ``torch.autocast`` at that dtype, with a training loss (the model's own, cross-entropy against
    random labels for logits, else a mean squared error), and checks:
    - fp16: an op whose output (or the gradient reaching it, or a weight's gradient) overflows to
      ``inf`` under autocast while it is finite in float32 (error), or comes within ``headroom``
      of float16's largest value 65504 (warning); the first layer where it happens is named;
    - fp16: the share of each weight's gradient entries that are nonzero in float32 and exactly
      zero under autocast: lost to underflow (float16's smallest subnormal is 6e-8). Without a
      ``GradScaler`` the loss is unscaled; with one (``grad_scaler=True``, ``--grad-scaler``) it is
      judged at the scaler's initial scale, 65536;
    - bf16 (and fp16) residual additions made in the half dtype (a model stored in bfloat16)
      whose branch is below the stream's resolution: branch rms < stream rms x 2^-9 in bfloat16
      (2^-12 in float16), so most of what the branch adds rounds away (information: see the
      calibration). Branches that start at zero or behind a near-zero gate (ReZero, LayerScale,
      zero-initialised ends) are deliberate and passed over;
    - with an optimizer of Adam's family (its first step taken on a private copy), weight tensors
      stored in bfloat16 or float16 whose first update is mostly below half a unit in the last
      place of the weight: the step is lost to rounding.

    ## Why is this bad?
    float16 keeps 5 exponent bits: values above 65504 become ``inf``, and the loss, every
    gradient and then every weight become NaN at the first step. A model that sits within a
    small factor of the limit at initialisation crosses it once training grows its weights
    (trained T5 checkpoints do: their FFN output ``DenseReluDense.wo`` exceeds 65504, which is
    why Hugging Face keeps ``wo`` in float32). At the other end, gradients below 6e-8 flush to
    zero: a mean-reduced loss over many outputs, a small output layer or a deep stack with
    shrinking gradients leaves whole layers with no gradient in float16, which is what a loss
    scaler is for. bfloat16 has float32's range but 8 significant bits: ``x + f(x)`` with
    ``|f(x)|`` under half a unit in the last place of ``x`` returns ``x``, so a branch that small
    does not change the stream at all. The same holds for a weight stored in bfloat16: a weight
    of 0.02 has a unit in the last place of 1.2e-4, so an Adam update of lr 5e-5 leaves it as it
    was, step after step (mixed precision keeps float32 master weights for that reason).

    Calibration. ``benchmarks/bench_precision.py`` (table in ``benchmarks/results/precision.md``)
    trains a small classifier (64-256-32, a LayerNorm, 10 classes; Adam, 200 steps, 5 seeds) from
    the same init in float32 and under fp16 autocast, with and without a ``GradScaler``. Trouble:
    a non-finite loss, the scaler skipping most steps, or less than half the float32 run's
    progress. Activations were pushed towards 65504 by unnormalised inputs: at Adam lr 1e-3 the
    runs whose largest activation sat at 0.6 of the limit overflowed in 3 of 5 seeds and from
    0.7 on (already inf under fp16 arithmetic at init) in all; at lr 1e-2, where the weights
    and activations grow faster, every run from 1/8 of the limit up overflowed within 200 steps
    and none at 1/16: hence ``headroom`` 8. Gradients were shrunk by a loss weight (every
    gradient small for good: at 1e-5 and 1e-6, 94-100% of the first layer's gradient flushes and
    the runs learn nothing; at 1e-4, 4.7% flushes and they learn) and by a small output layer
    (at 1e-6 the earlier layers' gradients flush entirely at init, but Adam grows the head
    within a few steps and the run learns as in float32: the finding's known false alarm).
    Over the 250 runs: a finding came before trouble in 89 of 127 flagged runs (all 50 errors
    did), a clean audit in 4 of 123 (an activation at 0.12 of the limit, just under 1/8, with
    lr 1e-2); the flushed shares of untroubled runs stay at 0.05 and below, of troubled ones at
    0.94 and above, hence ``flush`` 0.25.

    Lost updates. ``benchmarks/bench_lost_updates.py`` (table in
    ``benchmarks/results/lost_updates.md``) trains an MLP on a teacher task and a small nanoGPT (0.02
    init) on a token task for 200 steps, stored in bfloat16 and, from the same init and batches, in
    float32, with Adam and AdamW at 9 lrs from 1e-5 to 3e-3 and SGD (momentum 0.9) at 6 from 1e-3
    to 0.3, 3 seeds; trouble: the bfloat16 run made less than half the float32 run's progress. The
    figure is the largest share, over the weight tensors, of the elements whose gradient moves them
    and whose first update leaves the stored value unchanged. For Adam and AdamW (108 runs, 28 in
    trouble) a figure above 0.5 came before trouble in 78% of the flagged runs (28 of 36) and in
    every troubled one, and no clean audit came before trouble; the troubled runs had figures of
    0.746 and above (the MLP at lr 1e-4 and below, the GPT at 1e-5), the flagged runs that still
    learnt 0.70-0.75 (the GPT at 2e-5, which made 66% of float32's progress, and one MLP seed at
    1e-4). SGD's first step is the smallest of its run (momentum grows the later ones up to tenfold):
    its figures were 0.63-1.0 at every lr, and none of its 36 runs was in trouble (59% to 142% of
    float32's progress), so it is not judged, nor are other optimizers
    whose step scales with the gradient. Two things that look lost are not counted: elements without
    a gradient (embedding rows the batch does not use) move by weight decay alone, and norm gains
    and biases are not weight tensors (a LayerNorm gain of 1.0 cannot move by less than 0.004 in
    bfloat16; the GPT's were stuck in every bfloat16 run at these rates, and at lr 2e-4 and above it
    learnt as in float32).

    ``benchmarks/bench_precision.py`` also trains a pre-norm residual MLP stored in bfloat16 (no
    float32 master weights) with its branch ends scaled down: from x1e-3 on its branches round away at init,
    yet it learns as well as at x1e-2 (the gradient reaches the branch's weights whatever the
    rounding, and Adam grows them out of it), so a branch that rounds away is reported as
    information.

    ## Fix
    Overflow: train in bfloat16 (float32's range), keep the overflowing layer in float32, or
    bring its scale down (a norm before it, a clamp, a smaller init):
    ```python
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x)
    ```
    Gradient underflow in fp16: use a loss scaler, which scales the loss before ``backward`` and
    unscales the gradients before the step:
    ```python
    scaler = torch.amp.GradScaler()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```
    A branch that rounds away in bfloat16: keep float32 master weights and compute under
    autocast (the stream stays float32), or initialise the branch at a scale the stream can
    resolve.

    ## Options
    - ``headroom`` (default ``8``): warn when an fp16 activation or gradient comes within this
      factor of 65504 (its largest magnitude above 65504 / headroom = 8188).
    - ``flush`` (default ``0.25``): flag a weight when more than this share of its nonzero float32
      gradient entries are zero under fp16 autocast.
    - ``lost-update`` (default ``0.5``): with an optimizer of Adam's family, flag a weight tensor
      stored in bfloat16 or float16 when more than this share of the entries its gradient moves are
      left unchanged by the first update (calibrated above).
    """

    code = "IL017"
    name = "precision-headroom"
    severity = "warning"
    role = "check"
    needs = frozenset({"activations", "precision"})
    summary = "An activation or gradient overflows or underflows at the precision training uses."
    bad = (Example(mlp_whose_first_layer_outputs_exceed_fp16, expect={"0"}, options={"precision": "fp16"}),)
    good = (Example(mlp_at_default_init, options={"precision": "fp16"}),
            Example(mlp_at_default_init, options={"precision": "bf16"}))
    options = {"headroom": 8.0, "flush": 0.25, "lost-update": 0.5}
    option_ranges = {"headroom": (1, None), "flush": (0, 1), "lost-update": (0, 1)}

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        stats = audit.precision_probe
        if audit.precision is None or stats is None:
            return
        overflowed = False
        if audit.precision == "fp16":
            for finding in self._forward(audit, stats):
                overflowed = overflowed or finding.severity == "error"
                yield finding
            if not overflowed and stats.backward_ran and stats.reference_finite:
                if not audit.grad_scaler:
                    yield from self._backward(audit, stats)
                yield from self._flush(audit, stats)
        yield from self._rounded_branches(audit, stats)
        yield from self._lost_updates(audit)

    # ------------------------------------------------------------------ fp16 range
    def _judged(self, audit: AuditContext) -> List[Op]:
        residual = {r.add.id for r in residuals_of(audit)}
        return [op for op in audit.graph if op.kind in JUDGED_KINDS or op.id in residual]

    def _forward(self, audit: AuditContext, stats: PrecisionStats) -> Iterator[Finding]:
        near: List[Tuple[Op, float]] = []
        for op in self._judged(audit):
            rec = stats.ops.get(op.id)
            if rec is None or rec.dtype != "float16" or not _finite_in_float32(audit, op):
                continue
            if not rec.finite:
                yield self.finding(
                    audit, op, f"{_name(op)} overflows float16 under fp16 autocast: its output holds inf or NaN, "
                    f"while in float32 it is finite (rms {fmt(audit.op_stats(op).rms)}); float16 holds at most "
                    f"65504 (limit)", _overflow_fix(op), value=float("inf"), threshold=FP16_MAX,
                    severity="error")
                return
            if rec.absmax >= FP16_MAX / self.opts["headroom"]:
                near.append((op, rec.absmax))
        if near:
            yield self._near(audit, near, "output", "activations")

    def _backward(self, audit: AuditContext, stats: PrecisionStats) -> Iterator[Finding]:
        """Gradients at scale 1 (no loss scaler): the op nearest the loss where one overflows, else weights."""
        ops = [op for op in self._judged(audit) if (rec := stats.ops.get(op.id)) is not None
               and rec.dtype == "float16" and rec.grad_absmax is not None]
        broken = [op for op in ops if not stats.ops[op.id].grad_finite]
        weights = {op.params.get("weight"): op for op in audit.graph if op.kind in O.WEIGHT_KINDS}
        broken_weights = [weights[n] for n, w in stats.weights.items() if not w.finite and n in weights]
        if broken or broken_weights:
            op = broken[-1] if broken else broken_weights[-1]
            what = "the gradient reaching its output" if broken else "its weight's gradient"
            yield self.finding(audit, op, f"{_name(op)}: {what} overflows float16 in the fp16 backward pass "
                               f"(inf or NaN, while finite in float32); float16 holds at most 65504 (limit)",
                               "scale the loss down or train in bfloat16: with torch.autocast(device, "
                               "dtype=torch.bfloat16)", value=float("inf"), threshold=FP16_MAX, severity="error")
            return
        near = [(op, stats.ops[op.id].grad_absmax) for op in ops
                if stats.ops[op.id].grad_absmax >= FP16_MAX / self.opts["headroom"]]
        near = sorted(near, key=lambda pair: -pair[0].id)  # from the loss back
        if near:
            yield self._near(audit, near, "gradient", "gradients")

    def _near(self, audit: AuditContext, near: List[Tuple[Op, float]], what: str, plural: str) -> Finding:
        op, peak = near[0]
        top = max(v for _, v in near)
        limit = FP16_MAX / self.opts["headroom"]
        more = f"; {len(near)} ops in all, the largest at {fmt(top)}" if len(near) > 1 else ""
        return self.finding(
            audit, op, f"{_name(op)}: fp16 {what} reaches {fmt(peak)}, {fmt(FP16_MAX / peak)}x below float16's "
            f"largest value 65504 (limit: {fmt(self.opts['headroom'])}x, {fmt(limit)}){more}; training "
            f"grows the {plural} and crosses it", _overflow_fix(op), value=peak, threshold=limit)

    # ------------------------------------------------------------------ fp16 underflow
    def _flush(self, audit: AuditContext, stats: PrecisionStats) -> Iterator[Finding]:
        limit = self.opts["flush"]
        weights = {op.params.get("weight"): op for op in audit.graph if op.kind in O.WEIGHT_KINDS}
        over = [(name, w) for name, w in stats.weights.items() if w.share > limit and name in weights]
        if not over:
            return
        name, worst = max(over, key=lambda item: item[1].share)
        total = sum(w.flushed for w in stats.weights.values()) / max(sum(w.nonzero for w in stats.weights.values()), 1)
        scaled = (f"even at GradScaler's initial loss scale {fmt(SCALER_INIT_SCALE)}" if audit.grad_scaler
                  else "without a loss scaler")
        more = f"; {len(over)} of {len(stats.weights)} weights above the limit" if len(over) > 1 else ""
        message = (f"{name}: {fmt(100 * worst.share)}% of its nonzero float32 gradient entries are zero under fp16 "
                   f"autocast {scaled} (limit {fmt(100 * limit)}%): they underflow float16 (loss: {stats.loss}){more}; "
                   f"{fmt(100 * total)}% of all weight-gradient entries are lost")
        if audit.grad_scaler:
            fix = ("scaler = torch.amp.GradScaler(init_scale=2.0 ** 24)  # or train in bfloat16: "
                   "torch.autocast(device, dtype=torch.bfloat16)")
        else:
            fix = ("scaler = torch.amp.GradScaler(); scaler.scale(loss).backward(); scaler.step(optimizer); "
                   "scaler.update()")
        yield self.finding(audit, weights[name], message, fix, value=worst.share, threshold=limit)

    # ------------------------------------------------------------------ half-precision residual stream
    def _rounded_branches(self, audit: AuditContext, stats: PrecisionStats) -> Iterator[Finding]:
        gated = gated_ops(audit)
        rounded: List[Tuple[Op, float, float]] = []
        for res in residuals_of(audit):
            rec = stats.ops.get(res.add.id)
            if rec is None or rec.dtype not in ("bfloat16", "float16"):
                continue  # an addition made in float32 resolves any branch
            resolution = RESOLUTION["bf16" if rec.dtype == "bfloat16" else "fp16"]
            stream_op, branch_op = measured(audit, res.stream), measured(audit, res.branch)
            if stream_op is None or branch_op is None or gated.get(res.layers[-1].id):
                continue
            stream, branch = audit.op_stats(stream_op).rms, audit.op_stats(branch_op).rms
            if not stream or not branch or not math.isfinite(stream) or not math.isfinite(branch):
                continue  # a zero branch starts the block as the identity on purpose
            if branch / stream < resolution:
                rounded.append((res.layers[-1], branch / stream, resolution))
        if not rounded:
            return
        op, ratio, resolution = rounded[0]
        dtype = "bfloat16" if resolution == RESOLUTION["bf16"] else "float16"
        more = f"; {len(rounded)} residual branches in all" if len(rounded) > 1 else ""
        weight = op.params.get("weight")
        fix = (f"keep float32 master weights and train under torch.autocast(device, dtype=torch.bfloat16) "
               f"(the residual stream stays float32)")
        if weight:
            fix += f"; or initialise {py_path(weight)} at a scale the stream resolves"
        yield self.finding(
            audit, op, f"the residual branch ending at {_name(op)} rounds away in {dtype}: its rms is {fmt(ratio)}x "
            f"the stream's, below the stream's resolution {fmt(resolution)} (limit; half a unit in the last place "
            f"of {dtype}){more}", fix, value=ratio, threshold=resolution,
            severity="info")  # no measured harm: the branch's weights still learn and grow out of it


    # ------------------------------------------------------------------ weights stored in half precision
    def _lost_updates(self, audit: AuditContext) -> Iterator[Finding]:
        """With an optimizer (the first step's statistics), weights stored in float16/bfloat16 whose first
        update mostly leaves them unchanged: the update is below half a unit in the last place of the weight."""
        step = step_of(audit)
        if step is None or not getattr(step, "stepped", False) or step.optimizer not in SCALE_FREE_STEPS:
            return  # SGD's first step is the smallest of its run (momentum builds up): it tells nothing here
        limit = self.opts["lost-update"]
        lost = [(name, p) for name, p in step.params.items()  # weight tensors: norm gains and biases not judged
                if p.dtype in ("bfloat16", "float16") and len(p.shape) >= 2 and p.lost > limit]
        if not lost:
            return
        users = {}
        for op in audit.graph:
            for name in op.params.values():
                users.setdefault(name, op)
        name, worst = max(lost, key=lambda item: item[1].lost)
        more = f"; {len(lost)} weights in all" if len(lost) > 1 else ""
        lr = f", lr {fmt(worst.lr)}" if worst.lr is not None else ""
        message = (f"{name} is stored in {worst.dtype}: {fmt(100 * worst.lost)}% of its first update "
                   f"({step.optimizer}{lr}) is below half a unit in the last place of the weight and leaves it "
                   f"unchanged (limit {fmt(100 * limit)}%){more}")
        fix = ("keep float32 master weights: model.float(), and train under torch.autocast(device, "
               "dtype=torch.bfloat16)")
        yield self.finding(audit, users.get(name) or name.rsplit(".", 1)[0], message, fix, value=worst.lost,
                           threshold=limit)


SCALE_FREE_STEPS = frozenset({"Adam", "AdamW", "NAdam", "RAdam", "Adamax"})
"""Optimizers whose first step moves each element by about lr whatever its gradient's size (``m / sqrt(v)``):
the step of the whole run, whose rounding the first step shows (calibrated with Adam and AdamW)."""


def step_of(audit: AuditContext):
    """The first optimizer step's statistics (``AuditContext.step``), when the audit was given an optimizer."""
    return getattr(audit, "step", None)


def _finite_in_float32(audit: AuditContext, op: Op) -> bool:
    rms = audit.op_stats(op).rms
    return rms is not None and math.isfinite(rms)


def _name(op: Op) -> str:
    return op.module or op.target


def _overflow_fix(op: Op) -> str:
    where = py_path(op.module) if op.module else "the layer"
    return (f"train in bfloat16 (float32's range): torch.autocast(device, dtype=torch.bfloat16); or keep {where} "
            f"in float32, or bring its scale down (a norm before it, a smaller init)")
