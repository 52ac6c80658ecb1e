"""Entropy limits that follow the length of the rows judged.

The same scores give a softmax row a higher entropy over ``ln(n)`` the more entries ``n`` it spreads
over: Gaussian scores of std 3 give 0.41 over 16 entries and 0.51 over 2048. A limit on the normalised
entropy that does not move with ``n`` would judge one set of weights differently at 16 and at 2048 tokens.
So a limit is stated at :data:`REFERENCE_KEYS` entries and moved to the rows' own length: to the entropy that
scores of the spread which meets it there give over that length."""
from __future__ import annotations

import functools
import math
from typing import Any, Optional

import torch


REFERENCE_KEYS = 64
"""The key count ``min-entropy`` is stated at. Over ``n`` keys the limit is the mean entropy that scores of the
same spread give there (:func:`entropy_limit`), so that one set of weights gets one verdict at any length."""
MAX_KEYS = 1 << 16
"""Key counts above this are judged as this many (the limit moves by about 0.02 per doubling there)."""
_DRAWS = 1 << 16
"""Normal values drawn per key count for :func:`gaussian_entropy` (at least 64 rows)."""


def _normal_rows(keys: int) -> torch.Tensor:
    """The same ``rows x keys`` standard normal draws on every call and machine (a CPU generator, seed 0)."""
    generator = torch.Generator(device="cpu").manual_seed(0)  # on the CPU whatever the default device
    return torch.randn(max(64, _DRAWS // keys), keys, generator=generator, device="cpu", dtype=torch.float32)


def gaussian_entropy(keys: int, std: float, draws: Optional[torch.Tensor] = None) -> float:
    """Mean entropy over ``ln(keys)`` of softmax rows over ``keys`` i.i.d. Gaussian scores of std ``std``.
    The draws are fixed, so the value falls smoothly as ``std`` grows (standard error below 0.004)."""
    draws = _normal_rows(keys) if draws is None else draws
    logp = torch.log_softmax(draws * std, dim=-1)
    return -float((logp.exp() * logp).sum(-1).mean()) / math.log(keys)


@functools.lru_cache(maxsize=16)
def limit_std(min_entropy: float) -> float:
    """The score std at which Gaussian scores over :data:`REFERENCE_KEYS` keys have mean entropy ``min_entropy``
    (x ln(keys)): 2.64 for the default 0.5."""
    draws = _normal_rows(REFERENCE_KEYS)
    lo, hi = 0.0, 64.0
    for _ in range(24):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if gaussian_entropy(REFERENCE_KEYS, mid, draws) < min_entropy else (mid, hi)
    return (lo + hi) / 2


@functools.lru_cache(maxsize=256)
def entropy_limit(keys: int, min_entropy: float) -> float:
    """The mean entropy (x ln(keys)) below which rows over ``keys`` keys are flagged: what scores of the std
    :func:`limit_std` gives over :data:`REFERENCE_KEYS` keys give over ``keys`` (``min_entropy`` itself at
    64 keys; for 0.5: 0.47 over 16 keys, 0.55 over 512, 0.59 over 2048)."""
    keys = min(max(int(keys), 2), MAX_KEYS)
    if keys == REFERENCE_KEYS or not 0.0 < min_entropy < 1.0:
        return min_entropy
    return gaussian_entropy(keys, limit_std(min_entropy))


def row_length(stats: Any) -> int:
    """The length the rows of a softmax or attention op are judged at: ``exp`` of the mean ``ln(admissible
    entries)`` of the rows measured (``log_keys``; a causal op's rows see 1 to ``n`` keys, and the limit at this
    length is within 0.003 of the mean of the rows' own); :data:`REFERENCE_KEYS` where it was not measured."""
    log_keys = stats.get("log_keys")
    if log_keys is None:
        return REFERENCE_KEYS
    return int(round(math.exp(min(log_keys, math.log(MAX_KEYS)))))
