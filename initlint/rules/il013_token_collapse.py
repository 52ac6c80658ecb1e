"""IL013 token-collapse."""
from __future__ import annotations

import math
from typing import Dict, Iterator, List, Optional, Set, Tuple

import torch
import torch.nn as nn

from ..capture import ops as O
from ..capture.graph import Graph, Op
from ..report.findings import Finding
from .base import (BRANCH_GAIN_MAX, AuditContext, Example, RepairPlan, Residual, Rule, attention_scores, created_tensor,
                   fmt, gain_of, measured_rms, output_weight, projection_of, residuals_of, shrink_branch)



# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def attention_only_stack():
    class AttentionOnly(nn.Module):
        def __init__(self, dim=256, heads=8, depth=6):
            super().__init__()
            self.layers = nn.ModuleList(nn.MultiheadAttention(dim, heads, batch_first=True) for _ in range(depth))

        def forward(self, x):
            for attn in self.layers:
                x = attn(x, x, x, need_weights=False)[0]  # no residual path
            return x

    return AttentionOnly(), torch.randn(2, 32, 256)


def attention_stack_with_residuals_and_norms():
    class Residual(nn.Module):
        def __init__(self, dim=256, heads=8, depth=6):
            super().__init__()
            self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(depth))
            self.layers = nn.ModuleList(nn.MultiheadAttention(dim, heads, batch_first=True) for _ in range(depth))

        def forward(self, x):
            for norm, attn in zip(self.norms, self.layers):
                h = norm(x)
                x = x + attn(h, h, h, need_weights=False)[0]
            return x

    return Residual(), torch.randn(2, 32, 256)


def residual_attention_stack_with_output_projections_times_thirty():
    model, x = attention_stack_with_residuals_and_norms()
    with torch.no_grad():
        for attn in model.layers:
            attn.out_proj.weight.mul_(30)  # each branch adds ~the same average to every token, 30x the stream
    return model, x


NO_RESIDUAL = "no residual connection carries each token's own vector"
"""What the finding says of a stack without residual connections (which no init repairs)."""


class TokenCollapse(Rule):
    """## What it does
    Follows how similar the tokens of one sequence are as the signal goes through depth:
    at every block output (the residual stream after each residual addition, or, in a stack
    without residual connections, the output of each attention layer) it measures the mean
    pairwise cosine similarity of the token vectors, and flags a sequence whose tokens have
    become near-identical by the last block although they were not at the start.

    ## Why is this bad?
    At initialisation attention is close to uniform, so an attention layer replaces every
    token by nearly the same average of all tokens: ``softmax(Q K^T) V ~ (1/n) 1 1^T V``.
    Without a residual path that carries each token's own vector, the tokens' differences
    shrink with every layer, doubly exponentially in depth for pure attention (Dong et al.
    2021, "Attention is not all you need: pure attention loses rank doubly exponentially with
    depth"): the representation collapses to rank one. Then every token gets the same output,
    and the gradients of the queries and keys vanish (Noci et al. 2022, "Signal propagation in
    transformers: theoretical perspectives and the role of rank collapse"), so the attention
    cannot learn to tell the tokens apart. The mean pairwise cosine of the token vectors is 1
    exactly when they are all parallel.

    Healthy transformers drift towards it slowly at init (near-uniform attention adds the
    same vector to every token): GPT-2 (12 layers) ends near 0.6, Llama (32 layers) near 0.8,
    the T5 decoder near 0.85; attention-only stacks reach 0.99 within a few layers. A stream
    that attends to another sequence (a decoder's cross-attention to the encoder output) is
    not judged from that block on: near-uniform cross-attention adds the same summary of the
    other sequence to every token by design (``nn.Transformer``'s post-norm decoder reaches
    0.98 at its default init and trains). Each residual stream is judged from where it
    begins (an encoder's and a decoder's, a backbone's patches and a DETR-style decoder's
    object queries), and a stream that begins at a tensor the forward creates is not judged:
    DETR's and MaskFormer's queries start as one zero vector (``torch.zeros_like``), told
    apart only by the positions added to their queries and keys; nor is one that begins as
    copies of one token (OneFormer's task token, repeated for every query). Where every
    residual block also attends to another sequence (LightGlue's self- and cross-attention
    between two images), no stream is judged, and the one attention layer of each block is
    not read as a stack without residual connections. The
    similarity is measured on 2 sequences of the probe batch, 64 tokens each (2016 pairs per
    sequence), cheap next to the layer itself.

    How it depends on the sequence's length: the 64 tokens are spread evenly over the
    sequence. Uniform attention over more tokens gives each token an average of more values,
    and those averages of independent values are smaller, so in a model with residual paths
    they move each token less and the similarity falls as the sequence grows: GPT-2 124M at
    default init ends at 0.55 on 64 tokens, 0.46 on 512 and 0.44 on 1024. A stack without
    residual paths collapses at any length. The real-size zoo audits clean at 16 and 512 tokens
    and, for the models whose positions and depth allow it, at 2048.

    ## Fix
    Keep a residual path around every attention layer (and normalise the branch input):
    ```python
    x = x + attn(norm(x), norm(x), norm(x), need_weights=False)[0]
    ```
    When the model has residual connections and still collapses, its branches dwarf the
    stream (see IL012): scale each block's output projection down, for example by
    ``1 / sqrt(2 * n_layers)``.

    ## Options
    - ``max-cosine`` (default ``0.95``): flag when the mean pairwise cosine of the tokens at
      the last block output is above this.
    - ``min-rise`` (default ``0.3``): and it rose by at least this much from the start of the
      network (inputs that are already alike are not a collapse of the network's making).
    """

    code = "IL013"
    name = "token-collapse"
    severity = "warning"
    needs = frozenset({"activations"})
    summary = "The tokens of a sequence become near-identical through depth (rank collapse)."
    role = "symptom"
    repair_after_causes = True
    bad = (Example(attention_only_stack, expect={"layers.1"}),
           Example(residual_attention_stack_with_output_projections_times_thirty, expect={""}))
    good = (Example(attention_stack_with_residuals_and_norms),)
    options = {"max-cosine": 0.95, "min-rise": 0.3}
    option_ranges = {"max-cosine": (0, 1), "min-rise": (0, 1)}

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        for points, residual in self._streams(audit):
            yield from self._judge(audit, points, residual)

    def _judge(self, audit: AuditContext, points: List[Tuple[Op, float]], residual: bool) -> Iterator[Finding]:
        points = [p for p in points if math.isfinite(p[1])]  # non-finite tokens are IL009's finding
        if len(points) < 2:
            return
        start, end = points[0], points[-1]
        rise = end[1] - start[1]
        if end[1] <= self.opts["max-cosine"] or rise < self.opts["min-rise"]:
            return
        first = next(p for p in points if p[1] > self.opts["max-cosine"])
        blocks = len(points) - 1
        where = self._where
        message = (f"the tokens of a sequence become near-identical through depth: mean pairwise cosine of the token "
                   f"vectors {fmt(start[1])} at {where(start[0])} -> {fmt(first[1])} at {where(first[0])} -> "
                   f"{fmt(end[1])} after the last of {blocks} block(s) (threshold {fmt(self.opts['max-cosine'])})")
        if residual:
            message += "; the residual stream does not keep each token's own vector"
            fix = ("scale each residual branch's output projection down (see IL012), e.g. "
                   "nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * n_layers))")
        else:
            message += f"; {NO_RESIDUAL} past the attention layers"
            fix = "x = x + attn(norm(x))  # a residual path around each attention layer"
        at = first[0] if self._where(first[0]) == (first[0].module or "<model>") else self._where(first[0])
        yield self.finding(audit, at, message, fix, value=end[1], threshold=self.opts["max-cosine"])

    def _streams(self, audit: AuditContext) -> List[Tuple[List[Tuple[Op, float]], bool]]:
        """Each residual stream's block outputs in order, as ``(where to report, token cosine)`` after its
        start, and whether the model has residual additions. Streams are told apart by where they begin
        (back from a block's stream through earlier additions, norms and views): an encoder's and a
        decoder's, a backbone's and a DETR-style decoder's object queries. A stream that begins at a
        tensor the forward creates (DETR's ``tgt = torch.zeros_like(query_embed)``: every query the same
        zero vector, told apart only by the positions added to its queries and keys) has no start of its
        own to rise from, and is not judged; nor is one that begins as copies of one token (OneFormer's
        queries: its task token, repeated for every query)."""
        stats = audit.probe.ops
        residuals = residuals_of(audit)
        adds = self_attending(audit, residuals)
        if not adds:
            return [self._points(audit, residuals)]
        measured = [op for op in audit.graph if "token_cos" in stats.get(op.id, {})]
        every = {r.add.id: r for r in residuals}
        streams: Dict[int, List[Residual]] = {}
        for r in adds:
            if "token_cos" in stats.get(r.add.id, {}):
                streams.setdefault(_root(audit.graph, r, every).id, []).append(r)
        found = []
        for root_id, members in streams.items():
            root = audit.graph[root_id]
            ordered = sorted(members, key=lambda r: r.add.id)
            if created_tensor(root) or _copies_one_token(audit, ordered[0].stream, root):
                continue
            start = next((op for op in audit.graph.back(root, limit=64) if "token_cos" in stats.get(op.id, {})),
                         measured[0] if measured else None)
            if start is None or start.id >= ordered[0].add.id:
                continue
            found.append(([(start, stats[start.id]["token_cos"])]
                          + [(r.add, stats[r.add.id]["token_cos"]) for r in ordered], True))
        return found

    def _points(self, audit: AuditContext, adds: List[Residual]) -> Tuple[List[Tuple[Op, float]], bool]:
        """A stack without residual additions around its attention: each attention layer's output in order as
        ``(where to report, token cosine)``, after the network's start. The one attention layer of a residual
        block (its stream's own vector added back past it) is not one: where every such block attends to
        another sequence too (LightGlue's self- and cross-attention between two images' keypoints), the
        streams are conditioned (:func:`self_attending`) and nothing is judged. A skip around a whole stack
        of attention layers leaves the stack judged."""
        stats = audit.probe.ops
        measured = [op for op in audit.graph if "token_cos" in stats.get(op.id, {})]
        every = self._attention(audit)
        own = [inside[0] for r in adds
               if len(inside := [site for site in every if r.stream.id < site.id < r.add.id]) == 1]
        sites = [site for site in every if site not in own]
        outputs = [(site, out) for site in sites if (out := self._block_output(audit, site)) is not None]
        if not measured or not outputs or measured[0].id >= outputs[0][1].id:
            return [], False
        start = measured[0]
        ordered = sorted({out.id: (site, out) for site, out in outputs}.values(), key=lambda pair: pair[1].id)
        return [(start, stats[start.id]["token_cos"])] + [(site, stats[out.id]["token_cos"]) for site, out in ordered], \
            False

    @staticmethod
    def _attention(audit: AuditContext) -> List[Op]:
        return [op for op in audit.graph if op.kind == "attention"
                or op.kind == "softmax" and attention_scores(audit, op) is not None]

    @staticmethod
    def _where(op: Op) -> str:
        """The module to report: an attention op's own, or the block around an ``nn.Softmax``."""
        module = op.module.rsplit(".", 1)[0] if op.kind == "softmax" and op.attrs.get("module_op") and "." in op.module \
            else op.module
        return module or "<model>"

    @staticmethod
    def _block_output(audit: AuditContext, op: Op, limit: int = 32) -> Optional[Op]:
        """The first op at or after an attention op whose token similarity was measured."""
        frontier, seen = [op], {op.id}
        for _ in range(limit):
            if not frontier:
                return None
            current = frontier.pop(0)
            if "token_cos" in audit.probe.ops.get(current.id, {}):
                return current
            for user in audit.graph.consumers(current):
                if user.id not in seen:
                    seen.add(user.id)
                    frontier.append(user)
        return None

    # ------------------------------------------------------------------ repair (initlint.fix)
    @classmethod
    def repairs(cls, finding: Finding) -> bool:
        """A stack without residual connections collapses whatever its init: the fix is in the architecture."""
        return super().repairs(finding) and NO_RESIDUAL not in finding.message

    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        """Through its cause: every self-attending residual branch that outweighs its stream (so the stream
        no longer carries each token's own vector), or holds a layer off in scale, gets the branch repair of
        ``shrink_branch`` (a branch after oversized ones may be smaller than the stream they grew)."""
        if plan.through_cause(finding):
            return
        for res in self_attending(plan.ctx, residuals_of(plan.ctx)):
            stream, branch = measured_rms(plan.ctx, res.stream), measured_rms(plan.ctx, res.branch)
            off = any(gain_of(plan.ctx, op, output_weight(op))[0] > BRANCH_GAIN_MAX for op in res.layers
                      if output_weight(op))
            if off or (stream and branch and branch > stream):
                shrink_branch(plan, res, self.code, "tokens collapse as the branches outweigh the residual stream")


def self_attending(audit: AuditContext, adds: List[Residual]) -> List[Residual]:
    """The residual additions of streams that only attend to themselves.

    A block that attends to another sequence (a decoder's cross-attention to the encoder output)
    adds the same summary of that sequence to every token by design: its stream, and every
    stream that continues it, is conditioned, not collapsing."""
    graph = audit.graph
    by_add = {r.add.id: r for r in adds}
    conditioned: Set[int] = set()
    for r in adds:
        if _attends_elsewhere(graph, r) or _stream_add(graph, r.stream, by_add) in conditioned:
            conditioned.add(r.add.id)
    return [r for r in adds if r.add.id not in conditioned]


def _attends_elsewhere(graph: Graph, r: Residual) -> bool:
    """An attention op of the block reads keys computed from an op older than the block's stream."""
    for op in graph:
        if op.kind != "attention" or not r.stream.id < op.id < r.add.id:
            continue
        key = op.attrs.get("k_input", op.inputs[1] if len(op.inputs) > 1 else None)
        proj = projection_of(graph, key)
        source = _origin(graph, proj.inputs[0] if proj is not None and proj.inputs else key)
        if source is not None and source < r.stream.id:
            return True
    return False


COPY_TARGETS = ("repeat", "expand", "expand_as", "tile", "broadcast_to")
"""Ops that make copies of their input along an axis of size 1."""


def _copies_one_token(audit: AuditContext, stream: Op, root: Op, limit: int = 64) -> bool:
    """Whether a stream begins as copies of one token: on the way back from its first value to where it
    begins (``root``) and a little past, an op that copies an axis of size 1 to a size other than the probe
    batch's (``task_token.repeat(num_queries, 1, 1)``; a learned table broadcast over the batch,
    ``latents.expand(batch, -1, -1)``, is not one)."""
    first = audit.shape(audit.graph[audit.graph.inputs[0]]) if audit.graph.inputs else None
    batch = first[0] if first else None
    past = 0
    for op in audit.graph.back(stream, limit=limit):
        past += op.id <= root.id
        if past > 4:
            return False
        if str(op.target).rsplit(".", 1)[-1] not in COPY_TARGETS or not op.inputs:
            continue
        before, after = audit.shape(audit.graph[op.inputs[0]]), audit.shape(op)
        if before and after and len(before) == len(after) and any(
                b == 1 and a > 1 and a != batch for b, a in zip(before, after)):
            return True
    return False


def _origin(graph: Graph, op_id: Optional[int], limit: int = 16) -> Optional[int]:
    """The op a value comes from, through views, dropout and identities."""
    if op_id is None:
        return None
    origin = graph[op_id]
    for origin in graph.back(origin, through=O.PASS_KINDS, limit=limit + 1):
        pass
    return origin.id


def _root(graph: Graph, r: Residual, every: Dict[int, Residual], limit: int = 4096) -> Op:
    """Where the stream of the residual addition ``r`` begins: back from its stream value through earlier
    residual additions (their stream side), normalisations and views."""
    current = r.stream
    for _ in range(limit):
        if current.id in every:
            current = every[current.id].stream
        elif (current.kind in O.NORM_KINDS or current.kind in O.PASS_KINDS) and current.inputs:
            current = graph[current.inputs[0]]
        else:
            break
    return current


def _stream_add(graph: Graph, op: Op, by_add: Dict[int, Residual], limit: int = 16) -> Optional[int]:
    """The residual addition a stream value comes from (through norms and views), if any."""
    return next((current.id for current in graph.back(op, limit=limit) if current.id in by_add), None)
