"""Stage 2, capture: turn an ``nn.Module`` into the project's :class:`~initlint.capture.graph.Graph`.

Backends are tried in order. ``fx`` traces symbolically (no execution, module structure
kept); ``runtime`` records the dataflow while the probe batch runs (module hooks plus a
``TorchFunctionMode``) and so handles anything that can run a forward pass. A capture
object exposes ``name``, ``graph`` and ``run(args, kwargs, observe)``, which executes the
model once, calling ``observe(op, value)`` after every op.
"""
from __future__ import annotations

from typing import List, Sequence

import torch.nn as nn

from .base import Capture, CaptureError, Observer
from .fx import FxCapture
from .runtime import RuntimeCapture

__all__ = ["Capture", "CaptureError", "Observer", "FxCapture", "RuntimeCapture", "capture", "BACKENDS"]

BACKENDS = {"fx": FxCapture, "runtime": RuntimeCapture}


def capture(model: nn.Module, order: Sequence[str] = ("fx", "runtime")) -> Capture:
    """First backend in ``order`` that accepts ``model``; ``runtime`` always does.

    The reasons earlier backends gave are kept on ``capture.fallback_reasons``.
    """
    reasons: List[str] = []
    for name in order:
        try:
            cap = BACKENDS[name](model)
        except CaptureError as exc:
            reasons.append(f"{name}: {exc}")
            continue
        cap.fallback_reasons = reasons
        return cap
    raise CaptureError("no capture backend accepted the model: " + "; ".join(reasons))
