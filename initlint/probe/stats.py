"""Typed statistics of one probe run: what the probe measured per op, per parameter, per gradient.

Each record is a dataclass whose fields are floats, or ``None`` where nothing was measured. A
rule reads them by attribute (``stats.rms``) or by name (``stats.get("rms")``, ``"rms" in stats``,
``stats["rms"]``); a name that is not a field raises, so a typo is an error, not a silent
``None``. The probe collects plain dictionaries on the device side and turns them into these
records once, when the run is over (:meth:`initlint.probe.run.ProbeResult.seal`).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, FrozenSet, Iterator, Optional, Tuple, Type, TypeVar

S = TypeVar("S", bound="Stats")


_NAMES: Dict[type, Tuple[str, ...]] = {}
_NAME_SETS: Dict[type, FrozenSet[str]] = {}


class UnknownStatistic(KeyError):
    """A statistic name that the record does not have."""


@dataclass
class Stats:
    """Base of the records: lookups by name for rules that choose a statistic at run time."""

    @classmethod
    def names(cls) -> Tuple[str, ...]:
        # cached per class: rules look statistics up by name thousands of times per audit
        found = _NAMES.get(cls)
        if found is None:
            found = _NAMES[cls] = tuple(f.name for f in fields(cls))
            _NAME_SETS[cls] = frozenset(found)
        return found

    @classmethod
    def from_dict(cls: Type[S], values: Dict[str, float]) -> S:
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise UnknownStatistic(f"{cls.__name__} has no statistic {', '.join(unknown)}")
        return cls(**values)

    def _check(self, name: str) -> None:
        if name not in _NAME_SETS.get(type(self), ()) and name not in self.names():
            raise UnknownStatistic(f"{type(self).__name__} has no statistic '{name}'")

    def get(self, name: str, default: Any = None) -> Any:
        """The value of ``name``, or ``default`` when it was not measured."""
        self._check(name)
        value = getattr(self, name)
        return default if value is None else value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __getitem__(self, name: str) -> float:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __bool__(self) -> bool:
        return any(getattr(self, n) is not None for n in self.names())

    def measured(self) -> Iterator[str]:
        """Names of the measured statistics (iterating a record gives the same)."""
        return (n for n in self.names() if getattr(self, n) is not None)

    def items(self) -> Iterator[Tuple[str, float]]:
        """``(name, value)`` of the measured statistics."""
        return ((n, getattr(self, n)) for n in self.measured())

    def __iter__(self) -> Iterator[str]:
        return self.measured()

    def __len__(self) -> int:
        return sum(1 for _ in self.measured())


@dataclass
class TensorStats(Stats):
    """Scale and extremes of a tensor (a weight's gradient under the backward probe)."""

    rms: Optional[float] = None
    """Root mean square: the scale the variance analysis propagates."""
    std: Optional[float] = None
    mean: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None
    absmax: Optional[float] = None
    spread: Optional[float] = None
    """``high - low``; zero for a constant tensor."""


_EXTREMES = frozenset({"low", "high", "absmax", "spread"})


@dataclass
class ParamStats(TensorStats):
    """A weight of a Linear/Conv layer (scale, copies of units, extremes), or a bias (``mean``).

    The probe measures the extremes of the weights that may be zero or constant; the others' are
    taken when asked for by name (``stats.get("absmax")``, ``stats["spread"]``, ``"low" in stats``),
    one pass over that weight then. Reading the field (``stats.spread``) does not take them: None
    there means "measured neither zero nor constant", which is all the built-in rules need."""

    _source = None  # not a field: the weight whose extremes are taken on request (:meth:`extremes_from`)

    def extremes_from(self, weight: Any) -> None:
        """Take ``low``, ``high``, ``absmax`` and ``spread`` from ``weight`` when one of them is asked for."""
        object.__setattr__(self, "_source", weight)

    def get(self, name: str, default: Any = None) -> Any:
        if self._source is not None and name in _EXTREMES and getattr(self, name) is None:
            self._take_extremes()
        return super().get(name, default)

    def _take_extremes(self) -> None:
        import torch

        weight, self._source = self._source, None
        with torch.no_grad():
            low, high = (float(v) for v in torch.aminmax(weight.detach()))
        self.low, self.high, self.spread = low, high, high - low
        self.absmax = max(high, -low) if low == low and high == high else float("nan")

    rows: Optional[float] = None
    """Units (output features or channels)."""
    dup_rows: Optional[float] = None
    """Units that are exact copies of another unit, weights and bias compared in full."""
    groups: Optional[float] = None
    """Groups of a grouped convolution (copies are only counted within a group)."""
    biased: Optional[float] = None
    """1 when the layer's bias was compared with its weights."""


@dataclass
class SoftmaxStats(Stats):
    """A probability distribution per row: a softmax, or the model's logits."""

    maxprob: Optional[float] = None
    """Mean largest probability of a row."""
    entropy: Optional[float] = None
    """Mean entropy of a row over ln(its admissible classes): 1 for a uniform row, 0 for one-hot."""
    onehot_rows: Optional[float] = None
    """Fraction of rows with a single admissible entry."""
    log_keys: Optional[float] = None
    """Mean ``ln(admissible entries)`` of the rows with two or more (the rows :attr:`entropy` is taken over)."""
    classes: Optional[float] = None
    xent: Optional[float] = None
    """Expected cross-entropy of a uniformly drawn label (logits only)."""
    declared: Optional[float] = None
    """1 when the user declared the output to be logits, 0 when it was known from the output."""


@dataclass
class OpStats(TensorStats, SoftmaxStats):
    """The output of one op of the graph."""

    dead: Optional[float] = None
    """ReLU family: units whose output is zero for the whole batch."""
    units: Optional[float] = None
    """ReLU family: the units of the output (its size along :attr:`unit_axis`)."""
    unit_axis: Optional[float] = None
    """ReLU family: the axis of the output that indexes units (features, channels)."""
    saturated: Optional[float] = None
    """Bounded activations: fraction of outputs within 1% of a bound."""
    token_cos: Optional[float] = None
    """Mean pairwise cosine of the token vectors of a sequence (IL013)."""
    lead_rms: Optional[float] = None
    """A ``(batch, tokens, features)`` output longer than :data:`~initlint.probe.rows.LEAD_TOKENS`: the rms
    over its first ``LEAD_TOKENS`` positions (IL012), which a causal model computes alike at any length."""
    head_dim: Optional[float] = None
    """Attention: the width of a head."""
    keys: Optional[float] = None
    """Attention: mean number of keys a query may attend to."""
    q_rms: Optional[float] = None
    k_rms: Optional[float] = None
    raw_rms: Optional[float] = None
    """Attention: rms of the scores before the softmax scale."""
    scale: Optional[float] = None
    """Attention: the softmax scale used."""
    default_scale: Optional[float] = None
    """Attention: ``head_dim ** -0.5``."""
