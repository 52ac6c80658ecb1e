"""Typed statistics of a sweep (``initlint.sweep``): the scale of each layer measured at several model
sizes, at initialisation and after each optimizer step, and the power law fitted to it.

The rules that judge a sweep (width-unstable, depth-unstable) read these records, never the hooks
that made them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

OUTPUT = "output"
"""Quantity: the rms of a layer's output (a module that holds parameters of its own)."""
LOGITS = "attention logits"
"""Quantity: the rms of ``q . k * scale``, the attention scores before the softmax."""
STREAM = "residual stream"
"""Quantity: the rms of the last block's output of the model's main stack of blocks."""
INPUT_GRAD = "input-layer gradient"
"""Quantity: the norm of the gradient of the first layer's parameters (the layer that reads the input)."""

QUANTITIES = (OUTPUT, LOGITS, STREAM, INPUT_GRAD)


@dataclass(frozen=True)
class Fit:
    """``value ~ c * size ** alpha``, fitted by least squares on log-log axes."""

    alpha: float
    """The exponent."""
    error: float
    """Standard deviation of the residuals in log(value) (0 with two points)."""
    points: int
    """How many (size, value) pairs the fit used."""
    log_c: float
    """The intercept: ``log(value)`` at size 1."""

    def predict(self, size: float) -> float:
        """The fitted value at ``size``."""
        return math.exp(self.log_c + self.alpha * math.log(size))


def fit_power(sizes: Sequence[float], values: Sequence[Optional[float]]) -> Optional[Fit]:
    """The power law through the positive, finite values; None with fewer than two of them.

    A value of exactly zero (a zero-initialised query projection gives attention logits of 0) has no
    logarithm: it is left out, so a quantity that is zero at every size has no fit."""
    points = [(math.log(s), math.log(v)) for s, v in zip(sizes, values)
              if v is not None and math.isfinite(v) and v > 0 and s > 0]
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    alpha = sum((x - mx) * (y - my) for x, y in points) / sxx
    log_c = my - alpha * mx
    residuals = [y - (log_c + alpha * x) for x, y in points]
    error = math.sqrt(sum(r * r for r in residuals) / (n - 2)) if n > 2 else 0.0
    return Fit(alpha=alpha, error=error, points=n, log_c=log_c)


@dataclass
class Curve:
    """One quantity of one layer across the sizes of an axis: ``values[step][i]`` at ``sizes[i]``
    (step 0 is the initialisation; None where the layer was not measured at that size)."""

    layer: str
    """The module path, numbered blocks pooled by role (``transformer.h.{i}.mlp.c_fc``)."""
    quantity: str
    """One of :data:`QUANTITIES`."""
    sizes: List[int]
    values: List[List[Optional[float]]]

    def fit(self, step: int) -> Optional[Fit]:
        """The power law of step ``step``'s values against size."""
        return fit_power(self.sizes, self.values[step])

    def fits(self) -> List[Optional[Fit]]:
        """One fit per step (init first)."""
        return [self.fit(s) for s in range(len(self.values))]

    @property
    def label(self) -> str:
        """``layer`` for an output, else ``layer [quantity]``."""
        return self.layer if self.quantity == OUTPUT else f"{self.layer} [{self.quantity}]"


@dataclass
class Axis:
    """What one axis of a sweep measured: the factory keyword it varied, the sizes and the curves."""

    kind: str
    """``width`` or ``depth``."""
    keyword: str
    """The factory's keyword (``d_model``, ``n_layer``)."""
    sizes: List[int]
    """The sizes asked for, in increasing order."""
    steps: int
    """Optimizer steps taken at each size (the curves have ``steps + 1`` rows)."""
    curves: Dict[Tuple[str, str], Curve] = field(default_factory=dict)
    """``(layer, quantity)`` -> curve."""
    failed: Dict[int, str] = field(default_factory=dict)
    """Size -> one sentence on why it could not be measured."""
    params: Dict[int, int] = field(default_factory=dict)
    """Size -> the parameter count of the model built at that size."""
    readout: Optional[str] = None
    """The layer whose output is the model's output (the readout), when one is."""
    input_layer: Optional[str] = None
    """The first layer to run (the one that reads the input)."""

    @property
    def measured(self) -> List[int]:
        """The sizes that were measured."""
        return [s for s in self.sizes if s not in self.failed]


@dataclass
class SweepData:
    """Everything a sweep measured, as the sweep rules read it."""

    axes: List[Axis] = field(default_factory=list)
    target_width: Optional[int] = None
    """The width to extrapolate to (default 8x the largest width tried)."""

    def axis(self, kind: str) -> Optional[Axis]:
        """The axis of ``kind`` (``width`` or ``depth``), if the sweep had one."""
        return next((a for a in self.axes if a.kind == kind), None)
