"""IL004 saturated-softmax."""
from __future__ import annotations

import math
from typing import Iterator, Optional, Tuple

from ..capture import ops as O
from ..capture.graph import Graph, Op
from ..report.findings import Finding
import torch.nn as nn

from .base import (AuditContext, Example, RepairPlan, Rule, attention_scores, fmt, fmt_beyond, measured, outside_autograd,
                   py_path, shared_by, upstream_weight)
from .spread import REFERENCE_KEYS, entropy_limit, row_length


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def oversized_head_into_softmax():
    head = nn.Linear(256, 10)
    nn.init.normal_(head.weight, std=1.0)  # logits with std ~ 16
    return nn.Sequential(nn.Linear(32, 256), nn.LayerNorm(256), nn.ReLU(), head, nn.Softmax(dim=-1))


def lecun_head_into_softmax():
    head = nn.Linear(256, 10)
    nn.init.kaiming_normal_(head.weight, nonlinearity="linear")
    return nn.Sequential(nn.Linear(32, 256), nn.LayerNorm(256), nn.ReLU(), head, nn.Softmax(dim=-1))


class SaturatedSoftmax(Rule):
    """## What it does
    Measures how peaked the probability distributions are at initialisation: for every
    explicit ``softmax``/``log_softmax`` op that is not attention (attention rows are IL011's),
    and for the model output when it is logits. The output is logits when the caller says so
    (``logits=True`` / ``--logits``), and without being told when that is certain: the
    ``logits`` field of a Hugging Face style output, or a Linear head whose weight is also the
    input embedding table (a tied language-model head). ``--no-logits`` turns both off. It
    reports the mean maximum probability, the mean entropy relative to ``ln(C)`` for ``C``
    classes (masked entries, such as the future positions of causal attention, do not count
    as classes; a row with one entry left counts as saturated, unless the softmax's input
    holds the mask's ``-inf`` itself, as in PhiMoE's sparse router, which masks every score
    but the top one: then only rows with two or more entries are judged) and, for the logits,
    the expected cross-entropy at init against ``ln(C)``. A softmax the model runs with
    autograd off (a ``torch.no_grad`` block of its own: the key pooling of GLM-5-Next's
    sparse-attention indexer) passes no gradient of the model's loss either way: it is
    reported as information.

    ## Why is this bad?
    An untrained classifier knows nothing, so its prediction should be close to uniform:
    entropy near ``ln(C)`` and a cross-entropy loss near ``ln(C)`` on the first batch. When
    the logits have a large scale (logit variance grows with every too-large layer) the
    softmax is one-hot before training: the loss starts huge, the gradient of the softmax
    is near zero for every class but two, and the first steps are spent shrinking weights
    instead of learning. With logits of standard deviation ``sigma`` over many classes the
    expected cross-entropy of a random label is about ``ln(C) + sigma^2 / 2`` while ``sigma``
    is small and grows like ``sigma * sqrt(2 ln C)`` beyond: a T5 whose untied ``lm_head`` is
    ``N(0, 1)`` starts near 110 instead of ``ln(32128) = 10.4``.

    How it depends on the rows' length: the same scores give a higher entropy over ``ln(C)`` the
    more entries a row has (Gaussian scores of std 3: 0.41 over 16 entries, 0.51 over 2048), and a
    softmax op may run over a sequence's positions (a pooling, a sparse-attention indexer's key pools),
    whose count is the probe's length. So for a softmax op the limit is stated at 64 entries and moved
    to the rows' length as IL011's is (the entropy there of the score spread that meets it at 64: 0.46
    over 8 entries, 0.55 over 512); for the model's logits, whose classes the model fixes, it is the
    limit as stated.

    The statistics come from at most 512 rows of the output (rows spread over the batch and
    positions), which bounds their cost and keeps the mean's standard error below 0.022. For the
    model's logits, whose rows are as wide as the vocabulary, the rows read are ``2^21 / classes``
    but at least 64 (standard error below 0.06): 64 rows of a 32k-260k vocabulary.

    ## Fix
    Shrink the last layer's init (zero-init it, or scale it down) and check the signal
    scale upstream (IL001, IL005):
    ```python
    with torch.no_grad():
        model[2].weight.mul_(0.1)
    ```
    A head whose weight is shared with the input embedding (tied weights) keeps its table:
    zeroing or shrinking it would change the embedding too, so the fix scales the head's
    input instead (as T5 does with ``d_model ** -0.5``). A layer whose output also feeds
    other paths is scaled, never zeroed.

    ## Options
    - ``min-entropy`` (default ``0.5``): flag when the mean entropy divided by ``ln(C)`` is
      below this (for a softmax op: at 64 entries, and moved to its rows' length, above). A
      uniform prediction scores 1; logits with std 1 over 10 classes score about 0.8, with std
      3 about 0.4, and a one-hot prediction 0.
    - ``max-cross-entropy`` (default ``1.5``): for the model's logits, flag only when, in
      addition, the expected cross-entropy at init exceeds this multiple of ``ln(C)``. A tied
      head whose stream still carries each token's own embedding gives that token a spike
      (T5's default: mean max-probability 0.67, entropy 0.37 x ``ln(C)``) that lowers the
      entropy but costs a random label only 1.2 x ``ln(C)``. Gaussian logits cost 1.6 to 1.9 x
      ``ln(C)`` (10 to 32128 classes) by the time their entropy falls to 0.5 x ``ln(C)``, so
      for them the entropy decides.
    """

    code = "IL004"
    name = "saturated-softmax"
    severity = "warning"
    needs = frozenset({"activations"})
    summary = "a softmax, or the model's logits, near one-hot at init"
    role = "symptom"
    repair_after_causes = True
    bad = (Example(oversized_head_into_softmax, expect={"3"}),)
    good = (Example(lecun_head_into_softmax),)
    options = {"min-entropy": 0.5, "max-cross-entropy": 1.5}
    option_ranges = {"min-entropy": (0, 1), "max-cross-entropy": (0, None)}

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        for op in audit.graph.of_kind("softmax", "log_softmax"):
            if attention_scores(audit, op) is not None:
                continue  # attention rows are IL011's (judged against the keys each query may see)
            stats = audit.op_stats(op)
            src = measured(audit, audit.graph[op.inputs[0]]) if op.inputs else None
            scale = audit.op_stats(src).get("rms") if src is not None else None
            # an infinite input scale is a mask's -inf (or finfo.min) entries: rows left with one
            # entry are the mask's doing (a sparse router keeps only its top score), not saturation
            masked = scale is not None and not math.isfinite(scale)
            finding = outside_autograd(audit, op, self._judge(audit, op, stats, f"{op.target} output",
                                                                None if masked else scale, masked, row_length(stats)))
            if finding is not None:
                yield finding
        logits = audit.probe.logits
        if logits:
            op = self._logits_op(audit)
            if op is not None:
                what = "model output (declared logits)" if logits.get("declared", 1.0) else "model output (logits)"
                scale = audit.op_stats(op).get("rms")
                finding = self._judge(audit, op, logits, what, scale)
                if finding is not None:
                    yield finding

    @staticmethod
    def _logits_op(audit: AuditContext) -> Optional[Op]:
        op_id = audit.probe.logits_op
        if op_id is not None and 0 <= op_id < len(audit.graph):
            return audit.graph[op_id]
        outputs = [audit.graph[i] for i in audit.graph.outputs]
        return outputs[0] if outputs else None

    def _judge(self, audit: AuditContext, op: Op, stats, what: str, scale: Optional[float],
               masked: bool = False, length: Optional[int] = None) -> Optional[Finding]:
        """``length``: the rows' length where the limit follows it (a softmax op); None: the limit as stated
        (the logits, whose classes the model fixes)."""
        if "entropy" not in stats or stats.get("maxprob") != stats.get("maxprob"):
            return None  # NaN: non-finite logits are IL009's finding
        onehot = stats.get("onehot_rows", 0.0)
        if masked:  # judged on the rows the mask leaves two or more entries, if any
            if onehot >= 1.0:
                return None
            onehot = 0.0
        limit = self.opts["min-entropy"] if length is None else entropy_limit(length, self.opts["min-entropy"])
        entropy = stats["entropy"] * (1.0 - onehot)  # one-hot rows have entropy 0
        if onehot <= 0.5 and stats["entropy"] >= limit or entropy != entropy:
            return None
        classes = int(stats.get("classes", 0))
        if "xent" in stats and classes >= 2 and stats["xent"] <= self.opts["max-cross-entropy"] * math.log(classes):
            return None  # peaked rows, but a random label costs little more than a uniform guess
        src = op if op.kind in ("linear", "conv") and "weight" in op.params else upstream_weight(audit.graph, op)
        moved = "" if length is None or length == REFERENCE_KEYS else (
            f" for rows of {length} entries, the same score spread as {fmt(self.opts['min-entropy'])} at "
            f"{REFERENCE_KEYS}")
        message = (f"{what} is near one-hot: mean max-probability {fmt(stats['maxprob'])}, entropy "
                   f"{fmt_beyond(entropy, limit)} x ln({classes}) (threshold {fmt(limit)} x ln({classes}){moved}; "
                   f"a uniform prediction has 1.0)")
        if "xent" in stats and classes >= 2:
            message += (f"; the expected cross-entropy at init is {fmt(stats['xent'])} against "
                        f"ln({classes}) = {fmt(math.log(classes))} for a uniform prediction")
        if src is None:
            fix = "scale down the layer that produces these scores, or divide them by a temperature"
            return self.finding(audit, op, message, fix, value=entropy, threshold=limit)
        message, fix = _fix(audit, src, op, message, scale)
        return self.finding(audit, src, message, fix, value=entropy, threshold=limit)

    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        """Shrink the layer that produces the scores so that their rms is at most 1."""
        op = plan.weight_op(module)
        if op is None:
            return
        why = f"softmax near one-hot (entropy {fmt(finding.value)} x ln(C))"
        scores = _scores_of(plan, op)
        if scores is None or _feeds_directly(plan.graph, op, scores):
            plan.lsuv(op, self.code, why, shrink_only=True)
            return
        rms = plan.ctx.op_stats(scores).get("rms")
        target = plan.lsuv_target
        if rms and math.isfinite(rms) and rms > target:
            plan.scale(op, target / rms, self.code, why + f"; scores rms {fmt(rms)} -> {fmt(target)}")


def _scores_of(plan: RepairPlan, op: Op) -> Optional[Op]:
    """The op whose output the saturated softmax reads (the model output for declared logits)."""
    for sm in plan.graph.of_kind("softmax", "log_softmax"):
        if sm.inputs and upstream_weight(plan.graph, sm) is op:
            return plan.graph[sm.inputs[0]]
    outputs = [plan.graph[i] for i in plan.graph.outputs]
    return outputs[0] if outputs else None


def _feeds_directly(graph: Graph, op: Op, scores: Op) -> bool:
    for current in graph.back(scores):
        if current.id == op.id:
            return True
        if current.kind not in O.PASS_KINDS:
            return False
    return False


def _fix(audit: AuditContext, src: Op, end: Op, message: str, scale: Optional[float]) -> Tuple[str, str]:
    """How to shrink the scores at ``src``, the weight layer that produces them.

    A table shared with an embedding (tied weights) is neither zeroed nor rescaled: that would
    change the input embedding too; the head's input is scaled instead. A layer whose output
    also feeds other paths (a fused projection whose other part is a value path) is rescaled,
    never zeroed."""
    name = src.params["weight"]
    factor = 0.1 if not scale or scale != scale else min(0.1, 1.0 / scale)  # scores of unit scale
    users = [u for u in shared_by(audit.graph, name) if u.id != src.id and u.module != src.module]
    if users:
        roles = ", ".join(f"{'the input embedding' if u.kind == 'embedding' else 'a layer'} "
                          f"{u.module or '<model>'}" for u in users)
        message += f"; its weight {name} is shared by {roles} and the output head {src.module or '<model>'}"
        head = src.module.rsplit(".", 1)[-1] if src.module else "head"
        fix = (f"logits = self.{head}(hidden * {fmt(factor)})  # scale the head's input: the shared table "
               f"{name} also embeds the input tokens")
        return message, fix
    weight = py_path(name)
    if _only_path(audit, src, end):
        return message, f"with torch.no_grad(): {weight}.mul_({fmt(factor)})  # or nn.init.zeros_({weight})"
    return message, f"with torch.no_grad(): {weight}.mul_({fmt(factor)})"


def _only_path(audit: AuditContext, src: Op, end: Op) -> bool:
    """``src``'s output reaches nothing but ``end`` (through reshapes and the like)."""
    current = src
    for _ in range(32):
        if current.id == end.id:
            return True
        users = audit.graph.consumers(current)
        if len(users) != 1:
            return not users  # the model output itself
        current = users[0]
    return False
