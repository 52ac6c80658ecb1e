"""IL012 residual-growth."""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Set, Tuple

import torch
import torch.nn as nn

from ..capture import ops as O
from ..capture.graph import Op
from ..probe.stats import OpStats
from ..report.findings import Finding
from .base import (AuditContext, Example, RepairPlan, Residual, Rule, activation_after, downstream, fmt, fmt_beyond,
                   measured, output_weight, py_path, residuals_of, shrink_branch, zeroable_end)



# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def pre_norm_transformer_with_one_output_projection_times_thirty():
    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True, norm_first=True)
    model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
    with torch.no_grad():
        model.layers[2].linear2.weight.mul_(30)  # the third block's MLP output projection
    return model, torch.randn(2, 32, 256)


def pre_norm_transformer_at_default_init():
    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False), torch.randn(2, 32, 256)


class ResidualGrowth(Rule):
    """## What it does
    Finds the residual additions of the model (``x + f(x)``: an ``add`` whose one input is
    computed from the other through at least one weight layer, and not only through the branch
    of an earlier residual addition: RT-DETR's next query, ``norm(h + attn(h + pos)) + pos``,
    is no residual of its positions ``pos``; nor is a sum read only as the queries or keys of
attentions, as SAM's ``attn(q=queries + pe, ...)`` while ``queries`` goes on as the stream) and compares, at each, the
    scale (root mean square) of what the branch adds with the scale of the stream it is added
    to. It flags branches that dwarf the stream at initialisation, at the layer the excess comes
    from: a weight layer of the branch whose scale is more than 4x what a sound init gives it
    (``gain / sqrt(fan_in)`` for the activation after it) or 4x the same layer in the other
    blocks (``h.0.mlp.c_fc`` for ``h.1.mlp.c_fc``), else the branch's output projection.
    Three kinds of addition have
    their own limit: post-norm ones (``LN(x + f(x))`` on a normalised stream: BERT, the
    original Transformer), the first branch added to an embedding or to the model input, and
    all others (pre-norm blocks ``x + f(LN(x))`` as in GPT-2 and Llama, plain residuals). An
    embedding into which a vision-language model writes its image features
    (``masked_scatter``, as GOT-OCR2 and LLaVA do) is still an embedding: the vision tower's
    final norm does not make it a built-up stream.

    A branch over the limit on a pre-norm stream is reported as information, not a warning,
    when a later branch on the same stream adds at least ``1 / max-branch-ratio`` of what it
    adds and none of its layers is out of scale against the same layer in the other blocks:
    the stream is then rebuilt at the branches' scale, as when every block is scaled alike,
    not drowned by one block (hybrids whose first mixer adds little at init: Nemotron-H's and
    Lara-mini's MLPs after a Mamba or linear-attention layer).

    On sequences longer than 16 tokens, both scales are taken over each sequence's first 16
    positions. Causal attention at init spreads each query evenly over the tokens before it, so
    what it adds at position ``t`` shrinks as ``1 / sqrt(t)``: over a whole sequence of 512
    tokens, Llama's first attention branch adds 0.12 to an embedding of 0.02, over 16 tokens
    0.44, and the MLP branch after it (0.72 at any length) would be judged 5.7x the stream at
    512 tokens and 1.6x at 16. Training sharpens the attention within a few steps, so the
    averaged scale says nothing of the weights. Position ``t`` of a causal model sees only the
    tokens up to ``t``, so the first 16 positions give the same ratio at 16, 512 or 2048
    tokens. Bidirectional attention averages over the whole sequence at every position; there
    the attention branches shrink with the length at all positions, and what follows them is
    compared with a smaller stream (ModernBERT and x-transformers' ``Encoder`` audit clean at
    16, 512 and 2048 tokens, BERT at 16 and 512).

    ## Why is this bad?
    After ``x_{l+1} = x_l + f_l(x_l)`` with a branch independent of the stream,
    ``Var(x_{l+1}) = Var(x_l) + Var(f_l)``: the stream is the sum of the embedding and every
    earlier branch. A branch ``r`` times larger than the stream leaves the stream's earlier
    content (the embedding, the earlier blocks) a share ``1 / (1 + r^2)`` of the variance: the
    skip connection, whose point is to carry the input and the gradient through depth, is
    drowned. In a post-norm block the norm then rescales everything, so the identity path
    shrinks by ``sqrt(1 + r^2)`` at every block and compounds. In a pre-norm stack, scaling
    every branch alike changes nothing but the embedding's share (each branch sees a
    normalised input, and the final norm undoes the scale); a single block that dwarfs what
    the stream gathered before it does matter.

    Calibration. ``benchmarks/residual_training.py`` trains a small GPT (width 128, 4 blocks,
    GPT-2's init) on a copy task, with output projections scaled up, 2 seeds each, 250 AdamW
    steps; the unscaled model learns the copy (loss below 1) after about 85-110 steps:
    - post-norm, every block scaled: learning slows as the ratio grows (0.02 unscaled: 85
      steps; 0.19: 108-118; 0.6: 192 steps in one seed, never in the other) and stops from
      ratio 2 (x100) on. BERT-base's default (0.37) and ``nn.TransformerEncoder``'s (0.26) lie
      in the range where this model still learns; the limit 1 sits between them and the
      ratio at which it never learns (2);
    - pre-norm, one block (the third of four) scaled: ratio 2.6 (x10) learns 25-45% later and
      its loss spikes afterwards; ratio 5 (x30) takes 1.5-2x as long, ratio 16 (x100) 1.5-2.3x;
    - pre-norm, every block scaled: no harm up to x1000 (the first branch 193x the
      embedding); it even learns sooner (69 steps);
    - pre-norm, only the MLP's output projection of every block scaled (``--branch mlp``,
      3 seeds), so that the first MLP dwarfs a stream of the embedding and one small attention
      branch and every later MLP matches it: ratio 6.6 (x10), 20 (x30) and 66 (x100) learned
      at steps 84-90, the unscaled model at 96-109. A branch that later branches match is
      therefore information; one that stands out (the single scaled block above) warns.
    On 255 tokens (the 32 tokens repeated 8 times, batch 8) every model the limits flag failed
    to learn in 250 steps (post-norm x100, one pre-norm block x30), and so did post-norm x30
    (ratio 0.58) below them; the unscaled pre-norm model learned it in one seed of two, too few
    to move the limits.
    Post-norm recipes train with a learning-rate warm-up (BERT, ALBERT), so the post-norm runs
    were repeated with one (``--warmup``): over 25 of the 250 steps, x30 (ratio 0.59) learned at
    steps 124-126 (without: 192 in one seed, never in the other) and x100 (ratio 1.95) never did;
    over 100 steps, x100 learned in one seed of two, at step 239. The limit holds with a warm-up.
    ALBERT's default config (xxlarge: hidden 4096, feed-forward 16384, std 0.02) is flagged at
    2.2x; it was pre-trained from that init with LAMB and a 3125-step warm-up, a recipe these
    runs do not reproduce.
    Default initialisations stay below the limits with room to spare, measured at real width
    and depth: post-norm BERT-base at most 0.37, ``nn.TransformerEncoder`` 0.26; pre-norm GPT-2
    (12 x 768) at most 2.0 (its first MLP on 32 tokens; 2.55 on 1024), Llama (hidden 1024, 32
    layers) 1.5, T5-small 0.72, ViT-B/16 0.65, x-transformers' ``Decoder`` 1.34; first branches
    on the embedding: Llama 7.7, x-transformers 1.6, GPT-2 0.8. An embedding drowned beyond
    ``max-embedding-ratio`` is reported as information only, since the experiment found no
    harm in it.

    One layer out of scale inside a branch. ``benchmarks/gpt2_corrupt_layer.py`` redraws one
    weight of Hugging Face GPT-2 (width 768, 2 blocks) at std 1 (27.7x ``1/sqrt(768)``) and
    trains a copy task, 3 seeds, 100 AdamW steps; the intact model learns it after 37-41
    steps. The last block's ``c_fc`` (branch 47x the stream) learns it after 48-49 steps, 25%
    later, like the calibration's single over-scaled block; the first block's ``c_fc`` (151x)
    and its ``c_proj`` scaled x50 (127x) learn it sooner (27-34 steps); ``c_attn`` at std 1
    never learns it (IL011). So the branch keeps its warning, located at the layer whose
    scale is off, and that layer gets no separate IL001 finding (the norm after the branch
    undoes its scale, and what harm there is is the branch's).

    ## Fix
    When one layer of the branch is out of scale (a weight drawn with ``randn``, a layer
    multiplied by mistake), re-initialise that layer, at the scale of the same layer in the
    other blocks or of a sound init for its fan-in; shrinking the healthy output projection to
    compensate would hide it:
    ```python
    nn.init.normal_(model.transformer.h[1].mlp.c_fc.weight, std=0.02)  # as transformer.h.0.mlp.c_fc
    ```
    When every layer is at a sound scale, initialise the branch's output projection smaller,
    so that what the branch adds is at most comparable with the stream (GPT-2 and nanoGPT use
    ``0.02 / sqrt(2 * n_layers)``):
    ```python
    nn.init.normal_(block.output.dense.weight, std=0.02)
    ```

    ## Options
    - ``max-post-norm-ratio`` (default ``1``): flag a post-norm block whose branch is larger
      than the normalised stream it is added to.
    - ``max-branch-ratio`` (default ``4``): flag any other residual branch that exceeds the
      stream by more than this factor.
    - ``max-embedding-ratio`` (default ``100``): report (as information) a first branch that
      exceeds the embedding or model input it is added to by more than this factor.
    - ``zero-branch-ends`` (default ``false``): when no layer of the branch is out of scale,
      ``initlint fix`` zeroes the branch's last layer (weight and bias; the block starts as the
      identity, as in Fixup, SkipInit and DiT's adaLN-Zero) instead of drawing it at the
      depth-aware scale, where that layer's output goes to the addition and nowhere else and its
      weight is not shared. The branch's earlier layers then get no gradient in the first step
      only. ``benchmarks/bench_trainability.py`` trains both repairs (column ``fix, zero ends``).
    """

    code = "IL012"
    name = "residual-growth"
    severity = "warning"
    needs = frozenset({"activations"})
    summary = "A residual branch dwarfs the stream it is added to at initialisation."
    role = "symptom"
    repair_after_causes = True
    bad = (Example(pre_norm_transformer_with_one_output_projection_times_thirty, expect={"layers.2.linear2"}),)
    good = (Example(pre_norm_transformer_at_default_init),)
    options = {"max-post-norm-ratio": 1.0, "max-branch-ratio": 4.0, "max-embedding-ratio": 100.0,
               "zero-branch-ends": False}
    option_ranges = {"max-post-norm-ratio": (0, None), "max-branch-ratio": (0, None), "max-embedding-ratio": (0, None)}

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        adds = residuals_of(audit)
        streams: Set[int] = {r.add.id for r in adds}
        seen: Set[str] = set()
        for res in adds:
            stream_op, branch_op = measured(audit, res.stream), measured(audit, res.branch)
            if stream_op is None or branch_op is None:
                continue
            stream, branch = _scales(audit.op_stats(stream_op), audit.op_stats(branch_op))
            if not (_finite(stream) and _finite(branch)) or stream <= 0:
                continue  # non-finite values are IL009's finding
            place = _placement(audit, res, streams)
            limit = self.opts[_LIMITS[place]]
            ratio = branch / stream
            if ratio <= limit:
                continue
            culprits = _over_scaled(audit, res.layers)
            at = culprits[0].op if culprits else res.layers[-1]
            if at.module in seen:
                continue
            seen.add(at.module)
            matched = None
            if place == "stream" and not any(c.sibling_rms is not None for c in culprits):
                later = _largest_later_branch(audit, res, adds)
                matched = later if later is not None and later * limit >= branch else None
            yield self._finding(audit, res, culprits, stream, branch, ratio, limit, place, matched)

    def _finding(self, audit: AuditContext, res: Residual, culprits: List[_Scaled], stream: float, branch: float,
                 ratio: float, limit: float, place: str, matched: Optional[float] = None) -> Finding:
        proj = res.layers[-1]
        onto = {"embedding": "the embedding (the first branch)", "post-norm": "a normalised stream (post-norm block)",
                "stream": "the residual stream"}[place]
        message = (f"residual branch dwarfs the stream at init: the branch ending at {proj.module or '<model>'} adds "
                   f"a signal of scale (rms) {fmt(branch)} to {onto} of scale {fmt(stream)}, {fmt_beyond(ratio, limit)}x "
                   f"(limit {fmt(limit)}x); the stream's earlier content keeps "
                   f"{fmt(100.0 / (1.0 + ratio * ratio))}% of the variance")
        if culprits:
            message += "; the scale comes from " + "; ".join(c.describe() for c in culprits)
            fix = _culprit_fix(culprits)
        elif self.opts["zero-branch-ends"] and zeroable_end(audit, res, proj, output_weight(proj) or ""):
            name = output_weight(proj)
            fix = f"nn.init.zeros_({py_path(name)})  # the block starts as the identity"
            if audit.param(name[:-len("weight")] + "bias") is not None:
                fix += f"; nn.init.zeros_({py_path(name[:-len('weight')] + 'bias')})"
        else:
            fix = _fix(audit, proj, ratio)
        if matched is not None:
            message += (f"; a later branch on the same stream adds {fmt(matched)}, within {fmt(limit)}x of it, so the "
                        f"stream is rebuilt at the branches' scale rather than drowned (reported as information: "
                        f"stacks whose every block is scaled alike trained unharmed)")
        # no measured harm: worth knowing, not failing
        severity = "info" if place == "embedding" or matched is not None else None
        return self.finding(audit, culprits[0].op if culprits else proj, message, fix, value=ratio, threshold=limit,
                            severity=severity)

    # ------------------------------------------------------------------ repair (initlint.fix)
    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        """The branch holding ``module``: the over-scaled layers the finding names are redrawn at the scale
        its help gives (their siblings', else a sound init's); with none, a layer of the branch that is off
        in gain, else its last layer, as ``shrink_branch`` in ``rules/base.py`` decides."""
        if plan.through_cause(finding):
            return
        for res in residuals_of(plan.ctx):
            if module in {op.module for op in res.layers}:
                culprits = _over_scaled(plan.ctx, res.layers)
                for c in culprits:
                    std, why = c.target()
                    plan.redraw(c.op, std, self.code, f"the residual branch dwarfs the stream: {c.describe()}; "
                                f"redrawn at std {fmt(std)} ({why})", param=None if c.weight == c.op.params.get("weight")
                                else c.weight)
                if not culprits:
                    shrink_branch(plan, res, self.code, "the residual branch dwarfs the stream",
                                  zero_end=self.opts["zero-branch-ends"])
                return


OVER_SCALED = 4.0
"""A weight layer of a branch whose scale (rms) is more than this many times what a sound init gives it
(``gain / sqrt(fan_in)`` of the activation after it), or than the same layer in the other blocks, is
where the branch's excess comes from: by itself it makes the branch as much larger as
``max-branch-ratio`` allows."""


@dataclass
class _Scaled:
    """A weight layer of a branch against a sound init for its fan-in, and against its siblings."""

    op: Op
    weight: str
    rms: float
    sound: float
    """``gain / sqrt(fan_in)`` for the activation after the layer (the upper edge of its band)."""
    gain: float
    fan_in: int
    siblings: List[str]
    """The same layer in the other blocks (``h.0.mlp.c_fc`` for ``h.1.mlp.c_fc``), when all are sound."""
    sibling_rms: Optional[float]
    """Their median weight rms."""

    @property
    def excess(self) -> float:
        return self.rms / min(self.sound, self.sibling_rms or self.sound)

    def describe(self) -> str:
        against = f"a sound init for its fan-in, gain {fmt(self.gain)} / sqrt(fan_in {self.fan_in}) = {fmt(self.sound)}"
        if self.sibling_rms is not None and self.sibling_rms < self.sound:
            against = f"the {fmt(self.sibling_rms)} of {_names(self.siblings)}"
        return f"{self.op.module}: weight rms {fmt(self.rms)} is {fmt(self.excess)}x {against}"

    def target(self) -> Tuple[float, str]:
        """The std to re-initialise it with, and why."""
        if self.sibling_rms is not None:
            return self.sibling_rms, f"as {_names(self.siblings)}"
        return self.sound, f"gain {fmt(self.gain)} / sqrt(fan_in {self.fan_in})"


def _names(modules: List[str], most: int = 2) -> str:
    return ", ".join(modules[:most]) + (f" and {len(modules) - most} more" if len(modules) > most else "")


def _over_scaled(audit: AuditContext, layers: List[Op]) -> List[_Scaled]:
    """The weight layers of a branch more than ``OVER_SCALED`` times a sound init's scale or their
    siblings', in the order the signal passes them."""
    found = []
    for op in layers:
        name = op.params.get("weight")
        rms = audit.probe.params.get(name or "", {}).get("rms")
        fan = audit.fan_in(op) if op.kind in O.WEIGHT_KINDS and name else None
        if rms is None or not fan:
            continue
        _, (_, gain) = activation_after(downstream(audit.graph, op))
        sound = gain / math.sqrt(fan)
        siblings = _siblings(audit, op)
        sound_siblings = bool(siblings) and all(r <= OVER_SCALED * sound for _, r in siblings)
        scaled = _Scaled(op, name, rms, sound, gain, fan, [m for m, _ in siblings] if sound_siblings else [],
                         statistics.median(r for _, r in siblings) if sound_siblings else None)
        if scaled.excess > OVER_SCALED:
            found.append(scaled)
    return found


def _culprit_fix(culprits: List[_Scaled]) -> str:
    """Re-initialise the over-scaled layers (one line of code; the reasons in a trailing comment)."""
    calls, notes = [], []
    for c in culprits:
        std, why = c.target()
        calls.append(f"nn.init.normal_({py_path(c.weight)}, std={fmt(std)})")
        notes.append(f"{c.op.module.rsplit('.', 1)[-1]} now {fmt(c.rms)}; {why}" if len(culprits) > 1
                     else f"now {fmt(c.rms)}; {why}")
    return "; ".join(calls) + "  # " + "; ".join(notes)


def _siblings(audit: AuditContext, op: Op) -> List[Tuple[str, float]]:
    """``(module, weight rms)`` of the layers at the same place in the other blocks: the module path with
    its block indices replaced matches, the weight has the same shape."""
    pattern = _DIGITS.sub(".#", op.module)
    shape = audit.param(op.params["weight"]).shape
    found: Dict[str, float] = {}
    for other in audit.graph:
        name = other.params.get("weight")
        if other.module == op.module or other.module in found or not name or _DIGITS.sub(".#", other.module) != pattern:
            continue
        rms = audit.probe.params.get(name, {}).get("rms")
        weight = audit.param(name)
        if rms is not None and weight is not None and weight.shape == shape:
            found[other.module] = rms
    return sorted(found.items())


_DIGITS = re.compile(r"\.\d+(?=\.|$)")

_LIMITS = {"embedding": "max-embedding-ratio", "post-norm": "max-post-norm-ratio", "stream": "max-branch-ratio"}


def _placement(audit: AuditContext, res: Residual, streams: Set[int]) -> str:
    """``embedding``: the first branch on an embedding or the input; ``post-norm``: ``LN(x + f(x))`` on a
    normalised stream; ``stream``: any other residual addition (pre-norm blocks, plain residuals)."""
    if _from_embedding(audit, res.stream, streams):
        return "embedding"
    if _through_pass(audit, res.stream, back=True) and _through_pass(audit, res.add, back=False):
        return "post-norm"
    return "stream"


def _through_pass(audit: AuditContext, op: Op, back: bool, limit: int = 16) -> bool:
    """``op`` (going back: ``op`` itself or its producers; going forward: its consumers) reaches a norm
    through nothing but views and dropout, on a single path."""
    current = op
    for step in range(limit):
        if current.kind in O.NORM_KINDS and (back or step):
            return True
        if (step or back) and current.kind not in O.PASS_KINDS:
            return False
        nxt = [audit.graph[current.inputs[0]]] if back and current.inputs else [] if back else \
            audit.graph.consumers(current)
        if len(nxt) != 1:
            return False
        current = nxt[0]
    return False


def _fix(audit: AuditContext, proj: Op, ratio: float) -> str:
    """Shrink the branch's output projection so that the branch is about the stream's scale."""
    name = proj.params.get("weight")
    if proj.kind == "attention":  # nn.MultiheadAttention: its output projection is inside the op
        name = next((n for n in proj.params.values() if n.endswith("out_proj.weight")), None)
    stats = audit.probe.params.get(name or "", {})
    if name is None or "rms" not in stats:
        return f"initialise the output projection of the branch at {proj.module or '<model>'} smaller"
    std = stats["rms"] / ratio
    return f"nn.init.normal_({py_path(name)}, std={fmt(std)})  # now {fmt(stats['rms'])}; the branch then matches the stream"


def _from_embedding(audit: AuditContext, stream: Op, streams: Set[int], limit: int = 64) -> bool:
    """``stream`` is an embedding or the model input, with no residual addition or norm before it.

    What an op of kind ``other`` writes into its first input (a vision-language model's
    ``inputs_embeds.masked_scatter(mask, image_features)``: the image features come from a tower
    that ends in a norm) is not the stream's history: the walk follows such an op's first input."""
    frontier = [stream]
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
        if op.kind == "other" and _scatters_into(audit, op):
            frontier.append(audit.graph[op.inputs[0]])
        elif op.kind in O.PASS_KINDS or op.kind in ("add", "mul", "other", "conv", "linear"):
            frontier.extend(audit.graph[i] for i in op.inputs)
    return reached


def _scatters_into(audit: AuditContext, op: Op) -> bool:
    """``op`` writes values into a copy of its first input, of which its output has the shape
    (``masked_scatter``, ``index_put``, ``scatter``, ``index_copy`` of features into embeddings)."""
    name = str(op.target).rsplit(".", 1)[-1].rstrip("_")
    return len(op.inputs) > 1 and name in ("masked_scatter", "index_put", "scatter", "index_copy") \
        and audit.shape(op) == audit.shape(audit.graph[op.inputs[0]])


def _largest_later_branch(audit: AuditContext, res: Residual, adds: List[Residual]) -> Optional[float]:
    """The largest scale a residual branch after ``res`` adds to the stream ``res`` builds (its sum, and the
    sums after it, read through views and dropout), as :func:`_scales` measures it; ``None`` if none."""
    after: Dict[int, List[Residual]] = audit.memo.get("il012_after")  # type: ignore[assignment]
    if after is None:
        sums = {r.add.id for r in adds}
        after = audit.memo["il012_after"] = {}
        for r in adds:
            source = next((op for op in audit.graph.back(r.stream, through=O.PASS_KINDS, limit=16)
                           if op.id in sums), None)
            if source is not None:
                after.setdefault(source.id, []).append(r)
    largest: Optional[float] = None
    frontier, seen = [res.add.id], set()
    while frontier:
        for r in after.get(frontier.pop(), []):
            if r.add.id in seen:
                continue
            seen.add(r.add.id)
            frontier.append(r.add.id)
            stream_op, branch_op = measured(audit, r.stream), measured(audit, r.branch)
            if stream_op is None or branch_op is None:
                continue
            _, scale = _scales(audit.op_stats(stream_op), audit.op_stats(branch_op))
            if _finite(scale) and (largest is None or scale > largest):
                largest = scale
    return largest


def _scales(stream: OpStats, branch: OpStats) -> Tuple[Optional[float], Optional[float]]:
    """The rms of the stream and of the branch over the sequences' first ``LEAD_TOKENS`` positions
    when both were measured there (sequences longer than that), else over the whole outputs."""
    if stream.lead_rms is not None and branch.lead_rms is not None:
        return stream.lead_rms, branch.lead_rms
    return stream.rms, branch.rms


def _finite(x: Optional[float]) -> bool:
    return x is not None and x == x and abs(x) != math.inf
