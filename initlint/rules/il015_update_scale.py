"""IL015 update-scale."""
from __future__ import annotations

import math
from typing import Dict, Iterator, Optional, Tuple

import torch
import torch.nn as nn

from ..capture import ops as O
from ..probe.step import ParamStep, StepStats
from ..report.findings import Finding
from .base import AuditContext, Example, Rule, fmt, fmt_beyond, py_path
from .il002_bias_before_norm import cancelling_norm, frozen_norms


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def mlp_at_gpt_init(std: float = 0.02) -> nn.Module:
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    for layer in (model[0], model[2]):
        nn.init.normal_(layer.weight, std=std)
        nn.init.zeros_(layer.bias)
    return model


def adam_at_3e_2(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=3e-2)


def adam_at_1e_3(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def gpt_init_mlp_trained_with_adam_at_3e_2():
    # every weight has std 0.02; Adam's first step moves each entry by about lr = 0.03
    return mlp_at_gpt_init(), torch.randn(16, 256)


def gpt_init_mlp_trained_with_adam_at_1e_3():
    return mlp_at_gpt_init(), torch.randn(16, 256)


def zero_initialised_head_trained_with_adam_at_1e_3():
    model = mlp_at_gpt_init()
    nn.init.zeros_(model[2].weight)  # judged against 1/sqrt(fan_in), not against 0
    return model, torch.randn(16, 256)


def conv_bn_net():
    def block(cin: int, cout: int):
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(*block(3, 16), nn.MaxPool2d(2), *block(16, 32), nn.MaxPool2d(2), *block(32, 32),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def adam_at_2e_2(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=2e-2)


def conv_bn_net_trained_with_adam_at_2e_2():
    # each conv moves by about 0.6 of its rms, but feeds a BatchNorm: this is the net's best lr
    return conv_bn_net(), torch.randn(32, 3, 16, 16)


class UpdateScale(Rule):
    """## What it does
    Takes one real step of the optimizer the model will train with (``initlint.audit(model, x,
    optimizer=...)``, ``--optimizer``, or ``initlint_optimizer(model)`` in the target file) on a
    private copy of the parameters and of the optimizer's state, and measures, for every weight
    tensor (two or more dimensions; biases and norm gains are not judged), the ratio
    ``rms(first update) / rms(weight)``. A weight initialised to zero (a deliberate head, a
    residual branch's last layer) is judged against the scale a sound init gives it,
    ``1 / sqrt(fan_in)``, not against 0. It reports the weights whose ratio is above ``limit``,
    with the param group's lr. A weight whose output goes straight into a BatchNorm or
    InstanceNorm in training mode (through views and elementwise ops, as IL002 follows a bias) is
    not judged: the norm divides each channel by its batch statistics, so the loss does not
    depend on the weight's scale.

    ## Why is this bad?
    The first steps of Adam move every entry by about ``lr`` whatever the gradient's size
    (``m / sqrt(v) = sign(g)`` at step one). On a weight of std 0.02, the usual GPT init, lr 1e-2
    moves each entry by half its typical size: one step rewrites the layer, the carefully
    chosen init is gone, and the loss jumps or diverges before any warm-up helps. nanoGPT's
    usual Adam lr 1e-3 gives a ratio near 0.14 on its output projections and is the best lr on a
    small task, while 1e-2 (ratio 0.5) ends 2.3x worse. For SGD the ratio is ``lr * rms(grad) /
    rms(weight)``, and the same limit holds.

    A weight that feeds a BatchNorm is another matter. Its scale cannot change the loss, and its
    gradient is orthogonal to it, so a large step only grows its norm, which shrinks the next
    steps relative to it: the step size corrects itself. In ``benchmarks/bench_first_step.py``
    the conv-BatchNorm CNN trains best at Adam lr 2e-2, where its convs move by 0.59 of their
    rms, and still trains at lr 0.1 (2.9); counting those convs cost 20 false alarms out of 160
    findings and caught no troubled run that the other weights did not. ResNet-50's stem conv
    moves by 2.2 of its rms in the first step of He et al.'s SGD (lr 0.1, momentum 0.9), a
    recipe that trains. Judged without them, the calibration's limit 0.5 has precision 67% and
    recall 100% for Adam (40 of 40 troubled runs flagged), 63% and 100% for AdamW, 95% and 46%
    for SGD (its trouble builds up with momentum after the first step).

    A run with gradient accumulation, or data-parallel over several ranks, steps on the mean gradient
    of several batches, and the training callbacks audit one of them (``batches_per_step=``, which
    they pass as accumulation steps x ranks). Adam's first step moves each element its gradient
    reaches by about lr, on one batch as on their mean (an embedding's rows one batch does not use
    stay put: the run moves more of them). SGD's step is the gradient: the noise of one batch is
    ``sqrt(k)`` times that of the mean of ``k``, so one batch's step is larger than the run's, up to
    ``sqrt(k)`` times in expectation. For SGD the rule warns when the ratio divided by
    ``sqrt(batches_per_step)``, the least the run's step is expected to be, is above the limit, and
    reports the ratios between as information. Where norm clipping scaled the probe's gradients by
    ``c``, the run's, smaller, are scaled less: the divisor is ``max(1, c sqrt(k))``, and a step
    whose elements were clamped (``clip_grad_value_``) is judged as the probe took it. In
    ``benchmarks/bench_micro_batch.py`` (the 160 SGD runs of the calibration, each audited again on
    1/8 of its first batch), one micro-batch's ratio flagged 33 runs, 13 of them clean on the run's
    own batch, at 73% precision; divided by ``sqrt(8)`` it flagged 15, none clean on the run's
    batch, at 93% precision.

    ## Fix
    Lower the param group's lr to the value the finding names (the first step is proportional
    to lr, so ``lr * limit / ratio`` brings the worst weight of the group to the limit), add a
    warm-up that starts there, or give the weight a larger init if its scale is the odd one out.

    ## Options
    - `limit` (default 0.5): the largest ratio of the first update's rms to the weight's rms.
    """

    code = "IL015"
    name = "update-scale"
    severity = "warning"
    needs = frozenset({"step"})
    summary = "the optimizer's first step moves a weight by a large share of its size"
    role = "cause"
    options = {"limit": 0.5}
    option_ranges = {"limit": (0.0, None)}
    bad = (Example(gpt_init_mlp_trained_with_adam_at_3e_2, expect={"0", "2"}, options={"optimizer": adam_at_3e_2}),)
    good = (Example(gpt_init_mlp_trained_with_adam_at_1e_3, options={"optimizer": adam_at_1e_3}),
            Example(zero_initialised_head_trained_with_adam_at_1e_3, options={"optimizer": adam_at_1e_3}),
            Example(conv_bn_net_trained_with_adam_at_2e_2, options={"optimizer": adam_at_2e_2}))

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        step = audit.step
        if step is None or not step.stepped:
            return
        limit = float(self.opts["limit"])
        fans = _fan_ins(audit)
        invariant = scale_invariant(audit)
        ratios: Dict[str, float] = {}
        for name, s in step.params.items():
            if name in invariant:  # the norm after it undoes its scale: the step's size tells nothing of harm
                continue
            ratio = judged_ratio(s, fans.get(name))
            if ratio is not None:
                ratios[name] = ratio
        worst: Dict[int, float] = {}
        for name, ratio in ratios.items():
            group = step.params[name].group
            worst[group] = max(worst.get(group, 0.0), ratio)
        divisor, widest = _run_bounds(step)
        for name, ratio in ratios.items():
            if not ratio > limit:
                continue
            s = step.params[name]
            module = name.rpartition(".")[0]
            against = "its rms" if s.weight_rms > 0 else \
                f"the scale a sound init gives it, 1/sqrt(fan_in) = {fmt(1 / math.sqrt(fans.get(name) or 1))}"
            lr = f"lr {fmt(s.lr)}" if s.lr is not None else "its step size"
            at = f"(limit {fmt(limit)}) at {lr} (param group {s.group})"
            least, k = ratio / divisor, step.batches_per_step
            if divisor == 1.0:
                message = (f"{name}: the first {step.optimizer} step moves it by {fmt_beyond(ratio, limit)} of "
                           f"{against} {at}")
                yield self.finding(audit, module, message, _fix(s, limit, worst[s.group], name),
                                   value=ratio, threshold=limit)
            elif least > limit:
                message = (f"{name}: the run's first {step.optimizer} step moves it by an expected "
                           f"{fmt_beyond(least, limit)} or more of {against} {at}: {fmt(ratio)} on the probe's batch "
                           f"over {fmt(divisor)}, for the run's step on the mean of {k} such batches, "
                           f"{_shrinks(k, step.clip_factor)}")
                yield self.finding(audit, module, message, _fix(s, limit, worst[s.group], name, probed=True),
                                   value=least, threshold=limit)
            else:
                message = (f"{name}: the first {step.optimizer} step moves it by {fmt(ratio)} of {against} on the "
                           f"probe's batch {at}, and by an expected {fmt(least)} to {fmt(ratio * widest)} on the run's "
                           f"mean of {k} such batches, {_shrinks(k, step.clip_factor)}: the probe cannot tell")
                yield self.finding(audit, module, message, f"audit on a batch as large as the run's step to judge it; "
                                   f"or: {_fix(s, limit, worst[s.group], name, probed=True)}", value=ratio,
                                   threshold=limit, severity="info")


def _run_bounds(step: "StepStats") -> Tuple[float, float]:
    """How the run's first step compares with the probe's, for a step proportional to the gradient (SGD) on the
    mean of ``k = batches_per_step`` batches like the probe's: ``(d, w)``, the run's ratio expected between the
    probe's over ``d`` and the probe's times ``w``; ``(1, 1)``: the probe's ratio is the run's.

    The mean's noise is ``sqrt(k)`` times smaller, its signal the same. Without clipping the run's step is expected
    between the probe's over ``sqrt(k)`` (all noise) and the probe's (all signal). Norm clipping that scaled the
    probe's gradients by ``c`` scales the run's less: the run's step is at least the probe's over ``max(1, c
    sqrt(k))`` and at most the probe's unclipped, over ``c``. A step whose elements were clamped
    (``clip_grad_value_``) is judged as the probe took it."""
    k, factor = step.batches_per_step, step.clip_factor
    if not step.linear or k <= 1 or factor is None or factor <= 0:
        return 1.0, 1.0
    return max(1.0, factor * math.sqrt(k)), 1.0 / factor


def _shrinks(k: int, factor: Optional[float]) -> str:
    """Why the run's step is smaller than the probe's (see :func:`_run_bounds`)."""
    said = f"where the noise of one batch's gradient shrinks by sqrt({k})"
    if factor is not None and factor < 1:
        said += f" and the clipping that scaled the probe's by {fmt(factor)} eases"
    return said


def judged_ratio(s: ParamStep, fan_in: Optional[int]) -> Optional[float]:
    """The update's rms over the weight's, or over ``1/sqrt(fan_in)`` for a weight of rms 0; None for
    tensors of fewer than two dimensions and for updates that are not finite numbers."""
    if len(s.shape) < 2 or not math.isfinite(s.update_rms):
        return None
    if s.weight_rms > 0:
        return s.update_rms / s.weight_rms
    fan = fan_in or (math.prod(s.shape) // max(s.shape[0], 1))
    return s.update_rms * math.sqrt(max(fan, 1))


def _fix(s: ParamStep, limit: float, worst: float, name: str, probed: bool = False) -> str:
    if s.lr is not None and s.lr > 0 and worst > 0:
        what = "its worst weight on the probe's batch" if probed else "its worst weight"
        return (f"param group {s.group}: lr = {fmt(s.lr * limit / worst)} (brings {what} to the limit), "
                f"or warm up from there; or initialise {py_path(name)} larger if its scale is the odd one out")
    return f"scale param group {s.group}'s step size by {fmt(limit / worst) if worst else 'less than 1'}"


_NORM_FED_KINDS = O.WEIGHT_KINDS | {"conv_transpose"}


def scale_invariant(audit: AuditContext) -> Dict[str, str]:
    """Weights whose layer's output goes straight into a BatchNorm or InstanceNorm in training mode
    (through views and elementwise ops on a single path, as IL002 follows a bias): weight name -> the
    norm's module. The norm divides each channel by its batch statistics, so the loss does not depend
    on the weight's scale."""
    out: Dict[str, str] = {}
    frozen = frozen_norms(audit)
    for op in audit.graph:
        name = op.params.get("weight")
        if op.kind not in _NORM_FED_KINDS or not name or name in out:
            continue
        norm = cancelling_norm(audit, op)
        if norm is not None and norm.module not in frozen:
            out[name] = norm.module or norm.target
    return out


def _fan_ins(audit: AuditContext) -> Dict[str, int]:
    """Fan-in of each weight of a Linear/Conv op, read from the graph (the layout of ``x @ W`` included)."""
    out: Dict[str, int] = {}
    for op in audit.graph:
        name = op.params.get("weight")
        if op.kind in O.WEIGHT_KINDS and name and name not in out:
            fan = audit.fan_in(op)
            if fan:
                out[name] = int(fan)
    return out
