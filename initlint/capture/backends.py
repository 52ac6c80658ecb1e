"""The capture backends, tried in order: the first that accepts a model captures it."""
from __future__ import annotations

from typing import List, Sequence

import torch.nn as nn

from .base import Capture, CaptureError
from .fx import FxCapture
from .runtime import RuntimeCapture

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
