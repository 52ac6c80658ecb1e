"""IL004 saturated-softmax."""
from __future__ import annotations

from typing import Iterator, Optional

from ..graph import Op
from ..report import Finding
import torch.nn as nn

from .base import Audit, Example, Rule, fmt, py_path, upstream_weight


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
    explicit ``softmax``/``log_softmax`` op, and for the model output when the caller
    declares it to be logits (``logits=True`` / ``--logits``). It reports the mean maximum
    probability and the mean entropy relative to ``ln(C)`` for ``C`` classes (masked
    entries, such as the future positions of causal attention, do not count as classes).

    ## Why is this bad?
    An untrained classifier knows nothing, so its prediction should be close to uniform:
    entropy near ``ln(C)`` and a cross-entropy loss near ``ln(C)`` on the first batch. When
    the logits have a large scale (logit variance grows with every too-large layer) the
    softmax is one-hot before training: the loss starts huge, the gradient of the softmax
    is near zero for every class but two, and the first steps are spent shrinking weights
    instead of learning. Attention scores that saturate the same way attend to a single
    position and pass almost no gradient to the others.

    ## Fix
    Shrink the last layer's init (zero-init it, or scale it by 0.1) and check the signal
    scale upstream (IL001, IL005):
    ```python
    with torch.no_grad():
        model[2].weight.mul_(0.1)
    ```

    ## Options
    - ``min-entropy`` (default ``0.5``): flag when the mean entropy divided by ``ln(C)`` is
      below this. A uniform prediction scores 1; logits with std 1 over 10 classes score
      about 0.8, with std 3 about 0.4, and a one-hot prediction 0.
    """

    code = "IL004"
    name = "saturated-softmax"
    severity = "warning"
    needs = frozenset({"activations"})
    summary = "a softmax, or the model's logits, near one-hot at init"
    role = "symptom"
    bad = (Example(oversized_head_into_softmax, expect={"3"}),)
    good = (Example(lecun_head_into_softmax),)
    options = {"min-entropy": 0.5}

    def check(self, audit: Audit) -> Iterator[Finding]:
        for op in audit.graph.of_kind("softmax", "log_softmax"):
            stats = audit.op_stats(op)
            finding = self._judge(audit, op, stats, f"{op.target} output")
            if finding is not None:
                yield finding
        if audit.logits and audit.probe.logits:
            outputs = [audit.graph[i] for i in audit.graph.outputs]
            if outputs:
                finding = self._judge(audit, outputs[0], audit.probe.logits, "model output (declared logits)")
                if finding is not None:
                    yield finding

    def _judge(self, audit: Audit, op: Op, stats, what: str) -> Optional[Finding]:
        if "entropy" not in stats or stats.get("maxprob") != stats.get("maxprob"):
            return None  # NaN: non-finite logits are IL009's finding
        onehot = stats.get("onehot_rows", 0.0)
        entropy = stats["entropy"] * (1.0 - onehot)  # one-hot rows have entropy 0
        if onehot <= 0.5 and stats["entropy"] >= self.opts["min-entropy"] or entropy != entropy:
            return None
        src = op if op.kind in ("linear", "conv") and "weight" in op.params else upstream_weight(audit.graph, op)
        classes = int(stats.get("classes", 0))
        message = (f"{what} is near one-hot: mean max-probability {fmt(stats['maxprob'])}, entropy "
                   f"{fmt(entropy)} x ln({classes}) (threshold {fmt(self.opts['min-entropy'])} x ln({classes}); "
                   f"a uniform prediction has 1.0)")
        if src is not None:
            fix = f"with torch.no_grad(): {py_path(src.params['weight'])}.mul_(0.1)  # or nn.init.zeros_(...)"
            at = src
        else:
            fix = "scale down the layer that produces these scores, or divide them by a temperature"
            at = op
        return self.finding(audit, at, message, fix, value=entropy, threshold=self.opts["min-entropy"])
