"""IL012 residual-growth."""
from __future__ import annotations

import math
from typing import Iterator, Optional, Set

import torch
import torch.nn as nn

from .. import ops as O
from ..graph import Op
from ..report import Finding
from .base import Audit, Example, Residual, Rule, fmt, measured, py_path, residual_adds



# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def pre_norm_transformer_with_output_projections_times_twenty():
    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True, norm_first=True)
    model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
    with torch.no_grad():
        for block in model.layers:
            block.linear2.weight.mul_(20)  # the MLP branch's output projection
    return model, torch.randn(2, 32, 256)


def pre_norm_transformer_at_default_init():
    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False), torch.randn(2, 32, 256)


class ResidualGrowth(Rule):
    """## What it does
    Finds the residual additions of the model (``x + f(x)``: an ``add`` whose one input is
    computed from the other through at least one weight layer) and compares, at each, the
    scale (root mean square) of what the branch adds with the scale of the stream it is added
    to. It flags branches that dwarf the stream at initialisation, at the block where it
    happens, with the fix on the branch's output projection. The first branch added to an
    embedding (or the input) is judged against a much larger limit than the others: the
    embedding's scale is a convention of each model (Llama's is 0.02, its branches add 0.15
    to 0.7).

    ## Why is this bad?
    After ``x_{l+1} = x_l + f_l(x_l)`` with a branch independent of the stream,
    ``Var(x_{l+1}) = Var(x_l) + Var(f_l)``: the stream is the sum of the embedding and every
    earlier branch, and what reaches the output is that sum. A branch ``r`` times larger than
    the stream leaves the stream's earlier content (the embedding, the earlier blocks) with
    a share ``1 / (1 + r^2)`` of the variance: the skip connection, whose point is to carry
    the input and the gradient through depth unchanged, is drowned. In a post-norm block
    (``LN(x + f(x))``, BERT, the original Transformer) this happens at every layer and
    compounds: the identity path shrinks by ``sqrt(1 + r^2)`` per block, and deep post-norm
    models with large branches train slowly or diverge. In a pre-norm block
    (``x + f(LN(x))``, GPT-2, Llama) scaling every branch alike only changes the embedding's
    share (the norms undo the rest), so what counts is a branch that dwarfs everything the
    stream has gathered before it, or an embedding drowned far beyond the usual.

    Calibration. Default initialisations, measured at real width and depth, stay far below
    the limits: GPT-2 (12 x 768) at most 2.0 (its first MLP; the first attention adds 0.8x the
    embedding), Llama (1024 wide, 32 layers) 1.5 and 7.6x the embedding, BERT-base 0.35,
    T5-small 0.8, ViT-B/16 0.65, ``nn.TransformerEncoder`` 0.24, x-transformers' ``Decoder``
    1.6. ``benchmarks/residual_training.py`` trains a small GPT on a copy task with the output
    projections of every block scaled up: with post-norm blocks, 3x (branch ratio 1-3) already
    slows learning and 10x (ratio 4 and more) stops it within the run; with pre-norm blocks
    the forward pass is unchanged by a uniform scale but for the embedding's share, and
    training suffers once the first branch drowns the embedding by more than a hundred.

    ## Fix
    Initialise the branch's output projection smaller, so that what the branch adds is at
    most comparable with the stream (GPT-2 and nanoGPT use ``0.02 / sqrt(2 * n_layers)``):
    ```python
    nn.init.normal_(block.output.dense.weight, std=0.02)
    ```

    ## Options
    - ``max-branch-ratio`` (default ``4``): flag when a branch's scale exceeds the stream's
      by more than this factor.
    - ``max-embedding-ratio`` (default ``100``): the same for the first branch added to an
      embedding or to the model input.
    """

    code = "IL012"
    name = "residual-growth"
    severity = "warning"
    needs = frozenset({"activations"})
    summary = "A residual branch dwarfs the stream it is added to at initialisation."
    role = "symptom"
    bad = (Example(pre_norm_transformer_with_output_projections_times_twenty, expect={"layers.0.linear2"}),)
    good = (Example(pre_norm_transformer_at_default_init),)
    options = {"max-branch-ratio": 4.0, "max-embedding-ratio": 100.0}

    def check(self, audit: Audit) -> Iterator[Finding]:
        adds = residual_adds(audit.graph)
        streams: Set[int] = {r.add.id for r in adds}
        seen: Set[str] = set()
        for res in adds:
            stream_op, branch_op = measured(audit, res.stream), measured(audit, res.branch)
            if stream_op is None or branch_op is None:
                continue
            stream, branch = audit.op_stats(stream_op)["rms"], audit.op_stats(branch_op)["rms"]
            if not (_finite(stream) and _finite(branch)) or stream <= 0:
                continue  # non-finite values are IL009's finding
            fresh = _from_embedding(audit, res, streams)
            limit = self.opts["max-embedding-ratio" if fresh else "max-branch-ratio"]
            ratio = branch / stream
            proj = res.layers[-1]
            if ratio <= limit or proj.module in seen:
                continue
            seen.add(proj.module)
            yield self._finding(audit, res, proj, stream, branch, ratio, limit, fresh)

    def _finding(self, audit: Audit, res: Residual, proj: Op, stream: float, branch: float, ratio: float,
                 limit: float, fresh: bool) -> Finding:
        onto = "the embedding (the first branch)" if fresh else "the residual stream"
        message = (f"residual branch dwarfs the stream at init: the branch ending at {proj.module or '<model>'} adds "
                   f"a signal of scale (rms) {fmt(branch)} to {onto} of scale {fmt(stream)}, {fmt(ratio)}x "
                   f"(limit {fmt(limit)}x); the stream's earlier content keeps "
                   f"{fmt(100.0 / (1.0 + ratio * ratio))}% of the variance")
        return self.finding(audit, proj, message, _fix(audit, proj, ratio), value=ratio, threshold=limit)


def _fix(audit: Audit, proj: Op, ratio: float) -> str:
    """Shrink the branch's output projection so that the branch is about the stream's scale."""
    name = proj.params.get("weight")
    if proj.kind == "attention":  # nn.MultiheadAttention: its output projection is inside the op
        name = next((n for n in proj.params.values() if n.endswith("out_proj.weight")), None)
    stats = audit.probe.params.get(name or "", {})
    if name is None or "rms" not in stats:
        return f"initialise the output projection of the branch at {proj.module or '<model>'} smaller"
    std = stats["rms"] / ratio
    return f"nn.init.normal_({py_path(name)}, std={fmt(std)})  # now {fmt(stats['rms'])}; the branch then matches the stream"


def _from_embedding(audit: Audit, res: Residual, streams: Set[int], limit: int = 64) -> bool:
    """The stream is an embedding or the model input, with no residual addition or norm before this add."""
    frontier = [res.stream]
    seen: Set[int] = set()
    reached = False
    while frontier and len(seen) < limit:
        op = frontier.pop()
        if op.id in seen:
            continue
        seen.add(op.id)
        if op.id in streams or op.kind in O.NORM_KINDS:
            return False
        if op.kind in ("embedding", "input"):
            reached = True
            continue
        if op.kind in O.PASS_KINDS or op.kind in ("add", "mul", "other", "conv", "linear"):
            frontier.extend(audit.graph[i] for i in op.inputs)
    return reached


def _finite(x: Optional[float]) -> bool:
    return x is not None and x == x and abs(x) != math.inf
