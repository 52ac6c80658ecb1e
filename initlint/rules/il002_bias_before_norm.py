"""IL002 bias-before-norm."""
from __future__ import annotations

from typing import FrozenSet, Iterator, Optional, Tuple

import torch.nn as nn

from ..capture import ops as O
from ..capture.graph import Op
from ..probe.guard import guarded
from ..report.findings import Finding
from .base import AuditContext, Example, Rule

Shape = Tuple[int, ...]

_SHAPE_KEEPING = frozenset({"dropout", "identity"})
_BIASED_KINDS = O.WEIGHT_KINDS | {"conv_transpose"}
"""Layers whose bias a channel norm can cancel: Linear, Conv and ConvTranspose (1d/2d/3d)."""


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def conv_with_bias_into_batchnorm():
    return nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU())


def linear_with_bias_into_batchnorm1d():
    return nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.1), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))


def dcgan_generator_block():
    return nn.Sequential(nn.ConvTranspose2d(100, 512, 4, 1, 0), nn.BatchNorm2d(512), nn.ReLU(True))


def conv_without_bias_into_batchnorm():
    return nn.Sequential(nn.Conv2d(3, 16, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU())


class _FrozenNormBackbone(nn.Sequential):
    def train(self, mode=True):  # mmdetection's norm_eval=True: BatchNorm stays in eval mode while training
        super().train(mode)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()
        return self


def conv_with_bias_into_frozen_batchnorm():
    return _FrozenNormBackbone(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU())


class BiasBeforeNorm(Rule):
    """## What it does
    Finds a Linear, Conv or ConvTranspose layer (1d, 2d or 3d) with a bias whose output
    goes, through nothing but ops that keep its channel axis (dropout, identity, pooling,
    transposes, reshapes that keep the shape), into a BatchNorm or InstanceNorm that
    normalises over that same channel axis. Module and functional forms (``F.conv2d``,
    ``F.conv_transpose2d``, ``F.batch_norm``, ``F.instance_norm``) all count.

    ## Why is this bad?
    A per-channel norm subtracts each channel's mean over every other axis:
    ``BN(W x + b) = gamma * (W x + b - mean(W x) - b) / std + beta = BN(W x)``. The bias
    is cancelled exactly, in training and (through the running mean) at inference, so it
    is dead weight: parameters, optimizer state and compute that can never affect the
    output, and a gradient that is always zero. The norm's ``beta`` already provides the
    shift.

    Not flagged: a norm the model's own ``train()`` leaves in eval mode (mmdetection's
    ``norm_eval=True``, detectron-style frozen BatchNorm): it subtracts its running mean, not
    the batch mean, so the bias is not cancelled; LayerNorm or GroupNorm (they normalise over other axes, so the bias is not
    cancelled exactly), a nonlinearity or a residual addition between the layer and the
    norm, or a layer output that is also used elsewhere (each intermediate value must have
    exactly one user).

    ## Fix
    ```python
    nn.Sequential(nn.Conv2d(3, 16, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU())
    nn.Sequential(nn.ConvTranspose2d(100, 512, 4, 1, 0, bias=False), nn.BatchNorm2d(512), nn.ReLU(True))
    ```

    ## Options
    None.
    """

    code = "IL002"
    name = "bias-before-norm"
    severity = "warning"
    needs = frozenset({"graph"})
    summary = "a Linear/Conv bias cancelled exactly by a following BatchNorm/InstanceNorm"
    role = "check"
    bad = (Example(conv_with_bias_into_batchnorm, expect={"0"}), Example(linear_with_bias_into_batchnorm1d, expect={"0"}),
           Example(dcgan_generator_block, expect={"0"}))
    good = (Example(conv_without_bias_into_batchnorm), Example(conv_with_bias_into_frozen_batchnorm))

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        seen = set()
        for op in audit.graph:
            if op.kind not in _BIASED_KINDS or "bias" not in op.params or op.module in seen:
                continue
            norm = cancelling_norm(audit, op)
            if norm is None or norm.module in frozen_norms(audit):
                continue
            seen.add(op.module)
            bias = op.params["bias"]
            message = (f"bias {bias} feeds {norm.target} ({norm.module or '<model>'}), whose per-channel mean "
                       f"subtraction cancels it exactly")
            hint = _ctor_hint(audit, op)
            fix = (f"construct {op.module or 'the layer'} with bias=False" + (f": {hint}" if hint else "")
                   if op.module else f"drop the bias argument of {op.target}")
            yield self.finding(audit, op, message, fix, value=1.0, threshold=0.0)


def frozen_norms(audit: AuditContext) -> FrozenSet[str]:
    """Module paths of the norms the model's own ``train()`` leaves in eval mode. The probe sets every
    module to training directly; a model that overrides ``train()`` is asked under the state guard."""
    cached = audit.memo.get("frozen_norms")
    if cached is not None:
        return cached
    model = audit.model
    found: FrozenSet[str] = frozenset()
    if any(_overrides_train(m) for m in model.modules()):
        try:
            with guarded(model, 0):
                model.train()
                found = frozenset(path for path, m in model.named_modules() if not m.training)
        except Exception:  # noqa: BLE001 - a train() that fails here fails in the user's loop too; judge as probed
            found = frozenset()
    audit.memo["frozen_norms"] = found
    return found


def _overrides_train(module: nn.Module) -> bool:
    for cls in type(module).__mro__:
        if "train" in cls.__dict__:
            return not (cls.__module__ or "").startswith("torch.")
    return False


def cancelling_norm(audit: AuditContext, op: Op) -> Optional[Op]:
    """The channel norm that cancels ``op``'s bias, following one single-user path."""
    graph = audit.graph
    shape = audit.shape(op)
    if op.kind in ("conv", "conv_transpose"):
        axis = 1
    elif shape is not None:
        axis = len(shape) - 1
    else:
        return None
    current = op
    for _ in range(16):
        if len(current.users) != 1:
            return None
        nxt = graph[current.users[0]]
        if nxt.inputs[:1] != [current.id]:
            return None
        if nxt.kind in O.CHANNEL_NORM_KINDS:
            return nxt if axis == 1 else None
        new_axis = _follow_axis(nxt, audit.shape(nxt), audit.shape(current), axis)
        if new_axis is None:
            return None
        axis, current = new_axis, nxt
    return None


def _follow_axis(nxt: Op, nxt_shape: Optional[Shape], shape: Optional[Shape], axis: int) -> Optional[int]:
    """Where the bias axis ends up after ``nxt``; None if ``nxt`` may mix channels."""
    if nxt.kind in _SHAPE_KEEPING:
        return axis
    if nxt.kind == "pool":
        return axis if axis == 1 else None
    if nxt.kind != "view":
        return None
    ndim = len(shape) if shape else None
    if "transpose" in nxt.attrs and ndim:
        a, b = (d % ndim for d in nxt.attrs["transpose"])
        return b if axis == a else a if axis == b else axis
    if "permute" in nxt.attrs and ndim:
        perm = [d % ndim for d in nxt.attrs["permute"]]
        return perm.index(axis) if axis in perm else None
    if nxt.attrs.get("shape_only") and shape is not None and nxt_shape == shape:
        return axis
    return None


def _ctor_hint(audit: AuditContext, op: Op) -> str:
    kind = audit.graph.module_types.get(op.module, "")
    if kind in ("Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"):
        return f"nn.{kind}(..., bias=False)"
    return ""
