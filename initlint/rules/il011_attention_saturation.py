"""IL011 attention-saturation."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from ..capture.graph import Op
from ..report.findings import Finding
from .base import (AuditContext, Example, RepairPlan, Rule, attention_scores, fmt, fmt_beyond, measured,
                   outside_autograd, projection_of, py_path, reference_std)
from .spread import REFERENCE_KEYS, entropy_limit, row_length


MASKED_ZEROS_MAX_STD = 3.0
"""Scores of a standard deviation up to this cannot leave a row one-hot by themselves: the gap between a row's
two largest scores would have to pass 17 (float16's underflow of ``exp``; float32's is 104). That gap is widest
for a row of two keys, where it is normal with std ``sqrt(2) * 3 = 4.2`` here: 17 is 4 of those, a chance of
6e-5 per row. A row that is one-hot there was made so by a mask (the first row of a causal mask: a share of
the rows that shrinks with the length, so counting it as saturated would judge a short probe more harshly)."""


@dataclass
class _Site:
    """One attention op as measured: its rows, and the three factors of its score scale."""

    op: Op
    entropy: float
    maxprob: float
    raw: float
    """Root mean square of ``q . k`` (the product, before the scale; after any constant applied to q or k)."""
    pre_scale: float
    """Constants applied to q or k before the product (already inside ``raw``)."""
    scale: float
    """The whole factor between ``q . k`` of the projections and the scores."""
    head_dim: int
    scale_at: Op
    """Where the scale is applied (the attention call, or the ``mul`` after the product)."""
    explicit_scale: bool
    """The scale is written in the model (not SDPA's default)."""
    q_from: Optional[int]
    k_from: Optional[int]
    keys: int
    """The rows' key count, ``exp(mean ln(admissible keys))`` over the rows judged (a causal op's rows see
    1 to ``n`` keys; the limit at this count is within 0.003 of the mean of the rows' own)."""

    @property
    def score_std(self) -> float:
        return self.raw / self.pre_scale * self.scale

    @property
    def standard_std(self) -> float:
        """Score scale under the usual ``head_dim ** -0.5``: what q and k alone would give."""
        return self.raw / self.pre_scale / math.sqrt(self.head_dim)



# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def attention_with_its_scale_inverted():
    class Attention(nn.Module):
        def __init__(self, dim=256, heads=8, dim_head=32):
            super().__init__()
            self.heads, self.scale = heads, dim_head ** 0.5  # should be dim_head ** -0.5
            self.to_qkv = nn.Linear(dim, heads * dim_head * 3, bias=False)

        def forward(self, x):
            q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
            attn = (q @ k.transpose(-1, -2) * self.scale).softmax(dim=-1)
            return (attn @ v).transpose(1, 2).flatten(2)

    return Attention(), torch.randn(2, 32, 256)


def attention_scaled_by_dim_head_to_the_minus_half():
    model, x = attention_with_its_scale_inverted()
    model.scale = 32 ** -0.5
    return model, x


class AttentionSaturation(Rule):
    """## What it does
    Measures the attention rows of every attention op at initialisation: calls of
    ``F.scaled_dot_product_attention`` (with ``attn_mask``, ``is_causal``, ``scale`` and grouped
    query heads), ``nn.MultiheadAttention``, and hand-written ``softmax(q @ k^T * scale + mask)``.
    For a sample of heads and query rows it computes each row's entropy divided by
    ``ln(n)``, where ``n`` is the number of keys the row may attend to (the mask decides:
    causal masks, padding masks, boolean masks and additive masks of ``-inf`` or large finite
    negatives such as ``torch.finfo(dtype).min`` or ``-9e15`` all remove keys), and flags ops
    whose mean is low: rows close to one-hot.

    It then names the cause from the scale of the scores, ``std(q . k) * scale``:
    - the **scale**: it differs from ``head_dim ** -0.5`` and q and k are of the usual size
      (the scores would be fine with the usual scale), as with ``dim_head ** 0.5`` written
      for ``dim_head ** -0.5``;
    - the **q/k projections**: their weights are far above ``1 / sqrt(fan_in)`` (gain above 2), or
      above it at all while their input is of about unit scale (rms at most 2, as after a norm),
      so that only the weights can make the scores large;
    - the **signal feeding them**: the weights are normal but their input is large (no
      normalisation before the attention).

    ## Why is this bad?
    For ``q`` and ``k`` with i.i.d. entries of scale ``s_q`` and ``s_k``, ``q . k`` over
    ``d = head_dim`` dimensions has standard deviation ``sqrt(d) * s_q * s_k``; the usual scale
    ``d ** -0.5`` brings the scores to ``s_q * s_k``, about 1 when the projections keep their
    input's scale. With score standard deviation ``sigma`` a row's entropy is about
    ``ln(n) - sigma^2 / 2`` while ``sigma`` is small, and falls to 0 (one-hot) once ``sigma`` is
    several times ``sqrt(2 ln n)``. A one-hot row passes almost no gradient: the softmax
    Jacobian ``diag(p) - p p^T`` vanishes when ``p`` is one-hot, so the queries and keys do not
    learn and each token copies one other token's value. Entropy is judged against the keys a
    query may see, so the first rows of causal attention (one or two keys) and padded keys are
    never mistaken for saturation; rows left with a single key are not judged at all. Where the
    softmax is written out (``softmax(q @ k^T + mask)``), a row whose other probabilities are
    exactly 0 is either masked down to one key or saturated; with scores of std up to 3 a
    gap between a row's two largest scores of 17, at which ``exp`` underflows in float16, has a
    chance of 6e-5 per row, so such rows are a mask's (Grounding DINO's text self-attention on text with no
    phrase delimiters lets each token see only itself) and are not judged.

    How it depends on the sequence's length: the same scores look less saturated over more
    keys, because the entropy's shortfall grows more slowly than ``ln(n)``. Gaussian scores of
    std 3 give a mean normalised entropy of 0.41 over 16 keys, 0.44 over 64, 0.47 over 512
    and 0.51 over 2048; std 2 gives 0.60 to 0.75 and std 4 0.31 to 0.35. A fixed limit on the
    entropy would flag scores of std 2.8 at 16 tokens and pass them at 2048. So the limit is
    stated at 64 keys (``min-entropy``, 0.5: Gaussian scores of std 2.62) and moved to the key
    count of the rows judged (``exp`` of their mean ``ln(keys)``; a causal op's rows see 1 to
    ``n``): it is the entropy that scores of std 2.62 give there, from fixed Gaussian draws
    (0.46 over 8 keys, 0.47 over 16, 0.55 over 512, 0.59 over 2048, 0.69 from 65536 on). The
    verdict is then one of the scores' spread, whatever the probe's length. The finding gives
    the limit it used and the key count.

    What the limit claims about training (``benchmarks/wide_init_proxy.py --inits
    score=2,score=2.5,score=2.8,score=3.1``: the Llama proxy below with q and k drawn for the
    scores' std asked for, audited on the task's 64 tokens): the slowdown grows smoothly with
    the scores' std, with no step. The task was learnt at steps 74-77 with scores of std 1,
    92-102 at std 2, 107-109 at 2.5 (not flagged), 116-120 at 2.8 and 121-124 at 3.1 (both
    flagged), 126-127 at 3.3. The limit flags inits that learn 1.5x slower or more.

    At a width its init was not made for: Hugging Face's fixed std 0.02 in Llama-3-70B's shape
    (hidden 8192, head dim 128) gives q and k a gain of 1.81 each (std x sqrt(fan_in)) on their
    normalised input, and scores of std 3.3 (mean entropy 0.36-0.40 over 32 tokens; the 8B
    shape, hidden 4096: std 1.6, not flagged). A Llama of the same head dimension at hidden 256
    drawn with the same statistics (``benchmarks/wide_init_proxy.py``: a copy task, AdamW, two
    seeds) learnt the task at steps 126-127, against 69-72 with its own width's init and 74-77
    with q and k at std ``1 / sqrt(fan_in)`` and the rest unchanged; scores of std 6 took
    159-168 steps and std 10 231-246; the 8B's statistics 74-80. The finding then names the
    projections, not the input, and the std the width needs.

    The statistics come from at most 512 rows per op, 8 heads x 64 query rows (more heads where
    the sequence is shorter than 64 tokens): a row's normalised entropy lies in [0, 1], so the
    mean's standard error is below 0.022, and the heads of a layer are alike at initialisation
    (i.i.d. weights).

    A layer the model runs with autograd off (a ``torch.no_grad`` block of its own) passes no
    gradient of the model's loss either way: its finding is information.

    ## Fix
    Use the scale ``head_dim ** -0.5`` (or leave SDPA's ``scale`` at its default):
    ```python
    self.scale = dim_head ** -0.5
    ```
    For oversized projections, initialise them with ``std = 1 / sqrt(fan_in)`` (or a
    transformer's usual 0.02) rather than ``N(0, 1)``; for a large input, normalise it
    (``nn.LayerNorm``) before the projections. The value path is not the cause and is never
    the fix.

    ## Options
    - ``min-entropy`` (default ``0.5``): flag when the mean row entropy divided by
      ``ln(admissible keys)`` is below this, over 64 keys; over other key counts, below the
      entropy that scores as spread give there (above). Healthy attention at init scores 0.85
      to 1; scores with standard deviation 3 over 64 keys about 0.44; one-hot rows 0.
    - ``max-standard-score-std`` (default ``2``): the scores q and k would give under the usual
      scale ``head_dim ** -0.5``; at or below this the projections are of a normal size and a
      saturated op's cause is its scale.
    """

    code = "IL011"
    name = "attention-saturation"
    severity = "warning"
    needs = frozenset({"activations"})
    summary = "Attention rows are near one-hot at initialisation (judged against the keys each query may see)."
    role = "symptom"
    repair_after_causes = True
    bad = (Example(attention_with_its_scale_inverted, expect={""}),)
    good = (Example(attention_scaled_by_dim_head_to_the_minus_half),)
    options = {"min-entropy": 0.5, "max-standard-score-std": 2.0}
    option_ranges = {"min-entropy": (0, 1), "max-standard-score-std": (0, None)}

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        for op in audit.graph:
            site = self._site(audit, op)
            if site is not None and self._saturated(site):
                yield outside_autograd(audit, site.op, self._finding(audit, site))

    def _limit(self, site: _Site) -> float:
        return entropy_limit(site.keys, self.opts["min-entropy"])

    def _saturated(self, site: _Site) -> bool:
        return site.entropy < self._limit(site)  # False for NaN

    # ------------------------------------------------------------------ measurement
    def _site(self, audit: AuditContext, op: Op) -> Optional[_Site]:
        stats = audit.op_stats(op)
        if op.kind == "attention" and "entropy" in stats and "raw_rms" in stats:
            if stats.get("onehot_rows", 0.0) >= 1.0:
                return None  # no row sees two keys (SegFormer's reduced keys on a small image: one)
            head_dim = int(stats.get("head_dim", op.attrs.get("head_dim", 0)))
            return _Site(op, stats["entropy"], stats["maxprob"], stats["raw_rms"], 1.0, stats["scale"], head_dim, op,
                         not stats.get("default_scale", 1.0), op.attrs.get("q_input"), op.attrs.get("k_input"),
                         row_length(stats))
        if op.kind != "softmax" or "entropy" not in stats:
            return None
        scores = attention_scores(audit, op)
        raw = audit.op_stats(scores.matmul).get("rms") if scores is not None else None
        if scores is None or not raw:
            return None
        # a row left with one key (p exactly 0 elsewhere) is a mask's first row or a saturated row; scores
        # of a small spread cannot make exact zeros (a gap of 17 underflows in float16, of 104 in float32)
        onehot = stats.get("onehot_rows", 0.0)
        if onehot and raw / scores.pre_scale * scores.scale < MASKED_ZEROS_MAX_STD:
            if onehot >= 1.0:
                return None  # every row left with one key by its mask (Grounding DINO's text without phrases)
            entropy = stats["entropy"]  # over the rows that see two keys or more
        else:
            entropy = 0.0 if onehot > 0.5 else stats["entropy"] * (1.0 - onehot)
        at = next((u for u in audit.graph.consumers(scores.matmul) if u.kind in ("mul", "div")), op)
        return _Site(op, entropy, stats["maxprob"], raw, scores.pre_scale, scores.scale, scores.head_dim, at, True,
                     scores.q.id, scores.k.id, row_length(stats))


    # ------------------------------------------------------------------ reporting
    def _finding(self, audit: AuditContext, site: _Site) -> Finding:
        d = site.head_dim
        limit = self._limit(site)
        at = ("" if site.keys == REFERENCE_KEYS else
              f" at {site.keys} keys, the same score spread as {fmt(self.opts['min-entropy'])} at {REFERENCE_KEYS} keys")
        message = (f"attention rows near one-hot at init: mean entropy {fmt_beyond(site.entropy, limit)} x ln(admissible keys) "
                   f"(threshold {fmt(limit)}{at}; uniform attention has 1), mean max-probability "
                   f"{fmt(site.maxprob)}; the scores have std {fmt(site.score_std)} = q.k std "
                   f"{fmt(site.raw / site.pre_scale)} over head dim {d} x scale {fmt(site.scale)}")
        ratio = site.scale * math.sqrt(d)
        if site.standard_std <= self.opts["max-standard-score-std"] and ratio > 2.0:
            return self._scale_finding(audit, site, message, ratio)
        q_proj = projection_of(audit.graph, site.q_from)
        k_proj = projection_of(audit.graph, site.k_from)
        projections = list({p.id: p for p in (q_proj, k_proj) if p is not None}.values())
        if not projections:
            return self._inner_finding(audit, site, message)
        return self._projection_finding(audit, site, message, projections)

    def _scale_finding(self, audit: AuditContext, site: _Site, message: str, ratio: float) -> Finding:
        d = site.head_dim
        usual = d ** -0.5
        looks = " (it looks like head_dim ** 0.5)" if abs(math.log(site.scale / math.sqrt(d))) < 0.05 else ""
        message += (f"; the scale is {fmt(ratio)}x the usual head_dim ** -0.5 = {fmt(usual)}{looks}, while q and k "
                    f"alone would give scores of std {fmt(site.standard_std)}")
        if site.op.kind == "attention" and site.op.attrs.get("scale") is not None:
            fix = f"F.scaled_dot_product_attention(q, k, v, ..., scale={d} ** -0.5)  # or leave scale out (the default)"
        else:
            fix = f"scale = {d} ** -0.5  # head_dim ** -0.5 = {fmt(usual)}, not {fmt(site.scale)}"
        return self.finding(audit, site.scale_at, message, fix, value=site.entropy, threshold=self._limit(site))

    @staticmethod
    def _oversized(gains: List[Tuple[Op, float, float, int, Any]]) -> List[Tuple[Op, float, float, int, Any]]:
        """Of the q/k projections' ``(projection, gain, std, fan_in, input rms)``, those to redraw: the ones
        whose gain (std x sqrt(fan_in)) is above 2; or, when their input is of about unit scale (rms at most 2,
        as a norm leaves it), so that only the weights make the scores large, those whose gain is above 1 (a
        fixed std 0.02 at hidden 8192: gain 1.81 each, scores of std 3.3)."""
        large = [g for g in gains if g[1] > 2.0]
        if large:
            return large
        if all(g[4] is not None and g[4] <= 2.0 for g in gains):
            return [g for g in gains if g[1] > 1.0]
        return []

    def _projection_finding(self, audit: AuditContext, site: _Site, message: str, projections: List[Op]) -> Finding:
        gains = [(p, *self._gain(audit, p)) for p in projections]
        large = [(p, std, fan) for p, _, std, fan, _ in self._oversized(gains)]
        if large:
            parts = [f"{p.module or '<model>'} has weight std {fmt(std)}, {fmt(std * math.sqrt(fan))}x the "
                     f"1/sqrt(fan_in {fan}) = {fmt(fan ** -0.5)} that keeps its output at its input's scale"
                     for p, std, fan in large]
            fix = "; ".join(f"nn.init.normal_({py_path(p.params['weight'])}, std={fmt(fan ** -0.5)})"
                            for p, _, fan in large)
            at = large[0][0]  # the query projection when it is too large, else the key projection
            return self.finding(audit, at, message + "; the q/k projection " + " and ".join(parts), fix,
                                value=site.entropy, threshold=self._limit(site))
        p, _, _, _, in_rms = max(gains, key=lambda g: g[4] or 0.0)
        message += (f"; the input of the q/k projection {p.module or '<model>'} has scale (rms) {fmt(in_rms)}, "
                    f"and q and k grow with it")
        fix = (f"normalise the input of {p.module or 'the projection'} (an nn.LayerNorm before it) so that q and k "
               f"keep a unit scale")
        return self.finding(audit, p, message, fix, value=site.entropy, threshold=self._limit(site))

    def _inner_finding(self, audit: AuditContext, site: _Site, message: str) -> Finding:
        """q and k come from projections inside the op (``nn.MultiheadAttention``) or from no weight layer."""
        stats = audit.op_stats(site.op)
        if "q_rms" in stats:
            message += f"; q and k have scale (rms) {fmt(stats['q_rms'])} and {fmt(stats['k_rms'])}"
        inner = [n for n in site.op.params.values() if n.endswith(("in_proj_weight", "q_proj_weight", "k_proj_weight"))]
        if inner:
            fix = "; ".join(f"nn.init.xavier_uniform_({py_path(n)})" for n in inner)  # MultiheadAttention's own init
        else:
            fix = (f"bring q and k of {site.op.module or 'this attention'} to unit scale (normalise them, or shrink "
                   f"what produces them)")
        return self.finding(audit, site.op, message, fix, value=site.entropy, threshold=self._limit(site))

    @staticmethod
    def _gain(audit: AuditContext, proj: Op):
        """``(gain, weight std, fan_in, input rms)`` of a projection: gain is std * sqrt(fan_in)."""
        stats = audit.probe.params.get(proj.params["weight"], {})
        fan = audit.fan_in(proj) or 1
        std = stats.get("rms", 0.0)
        src = measured(audit, audit.graph[proj.inputs[0]]) if proj.inputs else None
        in_rms = audit.op_stats(src).get("rms") if src is not None else None
        return std * math.sqrt(fan), std, fan, in_rms

    # ------------------------------------------------------------------ repair (initlint.fix)
    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        """Bring the scores of each saturated attention op reported at ``module`` to std 1: redraw q/k
        projections that are oversized (the finding's fix), otherwise shrink q and k by the factor the
        measured score std asks for (a wrong scale, or a large input)."""
        if plan.through_cause(finding):
            return
        for op in plan.graph:
            site = self._site(plan.ctx, op)
            if site is None or not self._saturated(site):
                continue
            if self._finding(plan.ctx, site).module == module:
                self._repair_site(plan, site)

    def _repair_site(self, plan: RepairPlan, site: _Site) -> None:
        graph = plan.graph
        sides = [projection_of(graph, site.q_from), projection_of(graph, site.k_from)]
        projections = list({p.id: p for p in sides if p is not None}.values())
        why = f"attention rows near one-hot (scores std {fmt(site.score_std)})"
        ratio = site.scale * math.sqrt(site.head_dim)
        wrong_scale = site.standard_std <= self.opts["max-standard-score-std"] and ratio > 2.0
        large = [g[0] for g in self._oversized([(p, *self._gain(plan.ctx, p)) for p in projections])]
        if large and not wrong_scale:
            for p in large:
                std = reference_std(plan, p)
                plan.redraw(p, std, self.code, f"{why}: the q/k projection {p.module or '<model>'} is oversized "
                            f"(gain {fmt(self._gain(plan.ctx, p)[0])}), redrawn at std {fmt(std)}")
            return
        target = plan.lsuv_target
        if not site.score_std > target:
            plan.note(f"{self.code} {site.op.module or '<model>'}: saturated with scores of std "
                      f"{fmt(site.score_std)}; no init of q and k explains it")
            return
        factor = target / site.score_std
        inner = [n for n in site.op.params.values() if n.endswith(("in_proj_weight", "q_proj_weight", "k_proj_weight"))]
        if projections:  # q and k both scaled (one fused projection, or two): the square root on each
            both = all(p is not None for p in sides)
        else:  # nn.MultiheadAttention's own: in_proj_weight holds q and k, or q_proj_weight and k_proj_weight
            both = any(n.endswith("in_proj_weight") for n in inner) or len(inner) >= 2
        per = math.sqrt(factor) if both else factor
        each = "q and k " if per != factor else ""
        why += f"; {each}x{fmt(per)} {'each bring' if each else 'brings'} it to {fmt(target)}"
        for p in projections:
            plan.scale(p, per, self.code, why)
        if not projections:
            for name in inner:
                plan.scale(site.op, per, self.code, why, param=name)
            if not inner:
                plan.note(f"{self.code} {site.op.module or '<model>'}: no weight layer produces q and k; "
                          f"normalise them")
