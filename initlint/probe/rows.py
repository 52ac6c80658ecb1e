"""Statistics read from sampled rows: attention rows per head, softmax rows and the logits, and the
similarity of token vectors. Each reads a bounded sample, whatever the batch and sequence."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..capture import ops as O

from .collector import _Collector


def put_softmax(c: _Collector, scope: str, key: Any, y: torch.Tensor, dim: int, log: bool,
                cross_entropy: bool = False) -> None:
    """Mean max-probability and entropy / ln(C) of a (log-)probability tensor, on at most
    :data:`SOFTMAX_ROWS` rows (see :func:`sample_rows`); with ``cross_entropy``, also ``xent``: the
    expected cross-entropy of a uniformly drawn label, ``-mean(log p)`` over the classes."""
    classes = y.shape[dim]
    if classes < 2:
        return
    y = sample_rows(y, dim).float()
    logp = y if log else y.clamp_min(1e-30).log()
    p = logp.exp() if log else y
    # An entry with probability exactly 0 is masked (causal attention, padding: -inf, finfo.min,
    # -1e4 and -9e15 all underflow to 0) or underflowed. Entropy is taken over the admissible
    # entries of each row, normalised by ln(count); rows with a single admissible entry are
    # counted apart as one-hot rows: a few of them are masks (the first position of causal
    # attention), most of them mean saturation.
    # (int32 sums of a mask and entr(p) = -xlogy(p, p) give the same bits at about half the cost)
    admissible = ((logp > -1e20) if log else (y > 0)).sum(-1, dtype=torch.int32)
    rows = (admissible >= 2).float()
    count = rows.sum().clamp_min(1.0)
    log_keys = admissible.clamp_min(2).float().log()
    entropy = torch.special.entr(p).sum(-1) / log_keys
    c.put(scope, key, "maxprob", p.amax(-1).mean())
    _put_row_means(c, scope, key, {"entropy": entropy, "log_keys": log_keys}, rows, count)
    c.put(scope, key, "onehot_rows", 1.0 - rows.mean())
    if cross_entropy:
        c.put(scope, key, "xent", -logp.clamp_min(-1e30).mean())
    c.const(scope, key, "classes", float(classes))




ATTENTION_HEADS = 8
"""Heads (with their batch items) whose attention rows are measured per attention op; more where the
sequence is shorter than ``ATTENTION_ROWS``, to measure as many rows (see :func:`_head_pairs`)."""
ATTENTION_ROWS = 64
"""Query rows measured per sampled head: ``ATTENTION_HEADS * ATTENTION_ROWS = 512`` rows in all.

Why that is enough: each row's entropy over ``ln(admissible keys)`` lies in [0, 1], so the
mean over 512 rows has a standard error below ``0.5 / sqrt(512) = 0.022``, against a decision
threshold (0.5) that healthy attention at init (0.85 and more) and saturated attention (below
0.1) miss by far more. At initialisation the heads of a layer are statistically alike (their
weights are i.i.d.), so a few heads stand for all of them; the rows are spread evenly over the
query positions, so causal attention's short early rows are weighed as they occur. The cost,
``512 * keys * head_dim`` multiply-adds per op, is a few per cent of the op's own
``batch * heads * queries * keys * head_dim`` on a probe batch of 16 sequences with 12 heads,
and independent of the batch size."""
SOFTMAX_ROWS = 512
"""Rows of a large softmax output (or of the logits) measured; same reasoning as above."""
LOGIT_VALUES = 1 << 21
"""Logits measured: whole rows, ``LOGIT_VALUES // classes`` of them but at least
:data:`MIN_LOGIT_ROWS` and at most :data:`SOFTMAX_ROWS` (:func:`logit_rows`)."""
MIN_LOGIT_ROWS = 64


def logit_rows(classes: int) -> int:
    """Rows of the logits measured: their statistics take a few passes over each value, and a
    vocabulary of 50k-260k classes makes each row costly, while 64 rows already bound the standard
    error of the mean entropy / ln(C) by ``0.5 / sqrt(64) = 0.06`` (and at initialisation the rows
    are alike: see ``benchmarks/logit_rows.py`` for how far the figures move)."""
    return max(MIN_LOGIT_ROWS, min(SOFTMAX_ROWS, LOGIT_VALUES // max(classes, 1)))


def _row_positions(length: int, limit: int) -> Tuple[int, int]:
    """``(count, step)``: rows ``offset + step * i`` for ``i < count`` spread evenly over ``length``."""
    count = min(length, limit)
    return count, max(1, length // count)


def _head_pairs(batch: int, heads: int, rows: int) -> List[Tuple[int, int]]:
    """(batch item, head) pairs: heads spread evenly, batch items cycled. ``ATTENTION_HEADS`` of them, or
    more where a head has fewer than ``ATTENTION_ROWS`` query rows, up to ``ATTENTION_HEADS * ATTENTION_ROWS``
    rows in all: a short probe measures as many rows as a long one (a causal op's short rows vary most)."""
    count = min(max(ATTENTION_HEADS, ATTENTION_HEADS * ATTENTION_ROWS // max(rows, 1)), batch * heads)
    if heads >= count:
        return [(i % batch, i * heads // count) for i in range(count)]
    return [((i // heads) % batch, i % heads) for i in range(count)]


def put_attention(c: _Collector, key: Any, call: O.AttentionCall) -> None:
    """Attention-row statistics of one attention op, on a sample of heads and query rows.

    Queues ``entropy`` (mean over rows with at least two admissible keys of the row's entropy
    divided by ``ln(admissible keys)``), ``maxprob`` (mean largest probability of those rows),
    ``onehot_rows`` (fraction of rows the mask leaves with fewer than two keys), ``log_keys`` (mean
    ``ln(admissible keys)`` of the rows judged), ``raw_rms``
    (root mean square of ``q . k`` over the admissible pairs, before the scale), ``q_rms`` and
    ``k_rms``; and the constants ``keys``, ``head_dim``, ``scale`` and ``default_scale``.
    Admissible keys are the ones the mask allows: boolean masks, ``is_causal``, and additive
    biases above :data:`~initlint.capture.ops.MASKED_BIAS`.
    """
    with torch.no_grad():
        sample = _sample_sdpa(call) if call.form == "sdpa" else _sample_mha(call)
        if sample is None:
            return
        q, k, allowed, bias = sample
        head_dim = call.head_dim
        scale = call.scale if call.scale is not None else head_dim ** -0.5
        _attention_rows(c, key, q, k, scale, allowed, bias)
    c.const("ops", key, "keys", float(call.keys))
    c.const("ops", key, "head_dim", float(head_dim))
    c.const("ops", key, "scale", float(scale))
    c.const("ops", key, "default_scale", 1.0 if call.scale is None else 0.0)


_Sample = Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]


def _sample_sdpa(call: O.AttentionCall) -> Optional[_Sample]:
    q, k = call.q, call.k
    lead_q, lead_k = tuple(q.shape[:-2]), tuple(k.shape[:-2])
    length, keys = int(q.shape[-2]), int(k.shape[-2])
    heads = lead_q[-1] if lead_q else 1
    batch = math.prod(lead_q[:-1]) if len(lead_q) > 1 else 1
    rows, step = _row_positions(length, ATTENTION_ROWS)
    pairs = _head_pairs(batch, heads, rows)
    qs, ks, masks = [], [], []
    for i, (b, h) in enumerate(pairs):
        index = _unravel(b, lead_q[:-1]) + ((h,) if lead_q else ())
        offset = i * step // len(pairs)
        qs.append(q[index][offset::step][:rows])
        ks.append(k[_broadcast_index(index, lead_q, lead_k, call.gqa)])
        if call.mask is not None:
            masks.append(_mask_rows(call.mask, index, lead_q, length, offset, step, rows, keys))
    allowed, bias = _split_mask(torch.stack(masks), sdpa=True) if masks else (None, None)
    if call.is_causal:
        causal = _causal(len(pairs), rows, step, keys, q.device)
        allowed = causal if allowed is None else allowed & causal
    return torch.stack(qs), torch.stack(ks), allowed, bias


def _sample_mha(call: O.AttentionCall) -> Optional[_Sample]:
    query, key, heads = call.q, call.k, call.heads
    length, batch, keys = int(query.shape[0]), int(query.shape[1]), int(key.shape[0])
    head_dim = call.head_dim
    rows, step = _row_positions(length, ATTENTION_ROWS)
    pairs = _head_pairs(batch, heads, rows)
    xq, xk, wq, wk, bq, bk, masks, pads = [], [], [], [], [], [], [], []
    for i, (b, h) in enumerate(pairs):
        offset = i * step // len(pairs)
        part = slice(h * head_dim, (h + 1) * head_dim)
        xq.append(query[offset::step, b][:rows])
        xk.append(key[:, b])
        wq.append(call.q_weight[part])
        wk.append(call.k_weight[part])
        if call.q_bias is not None:
            bq.append(call.q_bias[part])
            bk.append(call.k_bias[part])
        if isinstance(call.mask, torch.Tensor):
            plane = call.mask if call.mask.dim() == 2 else call.mask[b * heads + h]
            masks.append(plane[offset::step][:rows] if plane.shape[0] == length else plane.expand(rows, keys))
        if isinstance(call.padding, torch.Tensor):
            pads.append(call.padding[b].expand(rows, keys))
    q = torch.bmm(torch.stack(xq).float(), torch.stack(wq).float().transpose(1, 2))
    k = torch.bmm(torch.stack(xk).float(), torch.stack(wk).float().transpose(1, 2))
    if bq:
        q, k = q + torch.stack(bq).float()[:, None], k + torch.stack(bk).float()[:, None]
    allowed, bias = _split_mask(torch.stack(masks), sdpa=False) if masks else (None, None)
    if pads:
        pad_allowed, pad_bias = _split_mask(torch.stack(pads), sdpa=False)
        allowed = pad_allowed if allowed is None else allowed if pad_allowed is None else allowed & pad_allowed
        bias = pad_bias if bias is None else bias if pad_bias is None else bias + pad_bias
    return q, k, allowed, bias


def _unravel(flat: int, shape: Tuple[int, ...]) -> Tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _broadcast_index(index: Tuple[int, ...], lead_q: Tuple[int, ...], lead_k: Tuple[int, ...],
                     gqa: bool) -> Tuple[int, ...]:
    """The key tensor's index for query index ``index`` (right-aligned broadcasting; grouped heads)."""
    out = []
    for pos in range(1, len(lead_k) + 1):
        size_k = lead_k[-pos]
        i = index[-pos] if pos <= len(index) else 0
        if size_k == 1:
            i = 0
        elif pos == 1 and gqa and size_k != lead_q[-1]:
            i = i // (lead_q[-1] // size_k)
        out.append(i)
    return tuple(reversed(out))


def _mask_rows(mask: torch.Tensor, index: Tuple[int, ...], lead_q: Tuple[int, ...], length: int, offset: int,
               step: int, rows: int, keys: int) -> torch.Tensor:
    """The sampled rows of an SDPA mask broadcastable to ``(*lead_q, L, S)``, as ``(rows, keys)``."""
    lead_m = tuple(mask.shape[:-2])
    plane = mask[_broadcast_index(index, lead_q, lead_m, False)] if lead_m else mask
    if plane.dim() < 2:
        plane = plane.reshape(1, -1)
    if plane.shape[0] == length:
        plane = plane[offset::step][:rows]
    return plane.expand(rows, keys)


def _split_mask(mask: torch.Tensor, sdpa: bool) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(allowed, bias)``: a boolean mask as admissibility (SDPA: True attends; MHA: True is masked),
    an additive one as a bias whose entries at or below ``MASKED_BIAS`` are masks."""
    if mask.dtype == torch.bool:
        return (mask if sdpa else ~mask), None
    bias = mask.float()
    return bias > O.MASKED_BIAS, bias


def _causal(pairs: int, rows: int, step: int, keys: int, device: torch.device) -> torch.Tensor:
    """SDPA's ``is_causal`` (top-left aligned: query ``i`` sees keys ``j <= i``) for the sampled rows."""
    offsets = torch.arange(pairs, device=device) * step // pairs
    positions = offsets[:, None] + torch.arange(rows, device=device)[None, :] * step
    return torch.arange(keys, device=device)[None, None, :] <= positions[:, :, None]


def _attention_rows(c: _Collector, key: Any, q: torch.Tensor, k: torch.Tensor, scale: float,
                    allowed: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> None:
    """Row statistics of ``softmax(q @ k^T * scale + bias)`` over the admissible keys."""
    q, k = q.float(), k.float()
    raw = torch.bmm(q, k.transpose(1, 2))
    scores = raw * scale if bias is None else bias + raw * scale
    if allowed is None:
        admissible = torch.full(raw.shape[:-1], raw.shape[-1], device=raw.device)
        pairs = float(raw.numel())
        raw_sq = raw.square().sum()
    else:
        allowed = allowed.expand(raw.shape)
        admissible = allowed.sum(-1, dtype=torch.int32)
        # a row with no admissible key would be NaN: give it uniform scores (it is counted apart)
        scores = scores.masked_fill(~allowed, float("-inf")).masked_fill((admissible == 0)[..., None], 0.0)
        pairs = allowed.sum().clamp_min(1)
        raw_sq = raw.square().masked_fill(~allowed, 0.0).sum()
    logp = torch.log_softmax(scores, dim=-1)
    p = logp.exp()
    log_keys = admissible.clamp_min(2).float().log()
    entropy = torch.special.entr(p).sum(-1) / log_keys
    rows = (admissible >= 2).float()
    count = rows.sum().clamp_min(1.0)
    _put_row_means(c, "ops", key, {"entropy": entropy, "maxprob": p.amax(-1), "log_keys": log_keys}, rows, count)
    c.put("ops", key, "onehot_rows", 1.0 - rows.mean())
    c.put("ops", key, "raw_rms", (raw_sq / pairs).sqrt())
    c.put("ops", key, "q_rms", q.square().mean().sqrt())
    c.put("ops", key, "k_rms", k.square().mean().sqrt())


def _put_row_means(c: _Collector, scope: str, key: Any, per_row: Dict[str, torch.Tensor], rows: torch.Tensor,
                   count: torch.Tensor) -> None:
    """The means of several per-row statistics over the rows ``rows`` marks (1 or 0), ``count`` of them: one
    product and one division for all of them (each statistic is then a view of the result)."""
    stacked = torch.stack(list(per_row.values()), dim=-1).reshape(-1, len(per_row))
    means = (rows.reshape(1, -1) @ stacked).reshape(-1) / count
    for i, name in enumerate(per_row):
        c.put(scope, key, name, means[i])


def sample_rows(y: torch.Tensor, dim: int, limit: int = SOFTMAX_ROWS) -> torch.Tensor:
    """At most ``limit`` rows of ``y`` along ``dim``, as ``(rows, size)``, spread over the other axes.

    The stride between the chosen rows is a prime, so it does not alias with a sequence length
    or a head count (every query position and head is reached, not one position over and over).
    """
    flat = y.movedim(dim, -1).reshape(-1, y.shape[dim])
    total = flat.shape[0]
    if total <= limit:
        return flat
    step = _prime_at_most(total // limit)
    return flat[::step][:limit]


def _prime_at_most(n: int) -> int:
    for candidate in range(max(n, 2), 1, -1):
        if all(candidate % d for d in range(2, int(candidate ** 0.5) + 1)):
            return candidate
    return 1


TOKEN_SEQUENCES = 2
"""Sequences of the probe batch whose token vectors IL013 compares."""
LEAD_TOKENS = 16
"""Leading positions of a sequence whose scale IL012 compares (``lead_rms``): position ``t`` of a causal
model sees only the tokens up to ``t``, so these statistics do not depend on the sequence's length."""
TOKEN_COUNT = 64
"""Tokens per sequence compared pairwise (``64 * 63 / 2 = 2016`` pairs per sequence): the mean
cosine has a standard error below 0.01 even when the tokens are independent."""


def put_token_cosine(c: _Collector, key: Any, y: torch.Tensor, batch_first: bool) -> None:
    """Mean pairwise cosine similarity of the token vectors of a ``(batch, tokens, features)`` output
    (``(tokens, batch, features)`` when not ``batch_first``), on a sample of sequences and tokens."""
    seqs = y[:TOKEN_SEQUENCES] if batch_first else y[:, :TOKEN_SEQUENCES].transpose(0, 1)
    count, step = _row_positions(int(seqs.shape[1]), TOKEN_COUNT)
    if count < 2:
        return
    # a float32 copy: the model may write the output in place later in its forward
    c.put_batched("ops", key, "token_cos", seqs[:, ::step][:, :count].to(torch.float32, copy=True), _mean_cosines)


def _mean_cosines(v: torch.Tensor) -> torch.Tensor:
    """Per sample of ``v`` (``(samples, sequences, tokens, features)``): the mean cosine of its token vectors'
    pairs within a sequence. The cosines of all pairs sum, over i != j, to |sum_i v_i|^2 - sum_i |v_i|^2: sums
    over the tokens, not the (tokens x tokens) Gram matrix (half the time at 768 features, a third at 3072);
    the two sums are at most tokens^2 and tokens, so their difference is off by about tokens^2 * 1e-7 and the
    mean by 1e-7. The sum of the unit vectors is one batched product of the inverse norms with ``v`` (no
    normalised copy of ``v``), and each unit vector's squared norm is 1 (0 for a zero vector): taken from the
    norms, not from ``v`` again (a third of the time)."""
    norms = torch.linalg.vector_norm(v, dim=-1)
    inverse = 1.0 / norms.clamp_min(1e-30)
    total = (inverse.unsqueeze(-2) @ v).squeeze(-2)
    off_diagonal = total.square().sum(dim=(1, 2)) - (norms * inverse).square().sum(dim=(1, 2))
    count = v.shape[2]
    return off_diagonal / (v.shape[1] * count * (count - 1))
