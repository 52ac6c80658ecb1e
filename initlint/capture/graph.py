"""The project's own graph model: what every capture backend produces and every rule reads.

An :class:`Op` is one call observed in the model's forward pass (a module call, a
functional call or a tensor method), normalised to a small vocabulary of *kinds*
(see :mod:`initlint.capture.ops`). Edges link an op to the ops that produced its tensor inputs.
Rules never see torch.fx nodes or hook objects, only this.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Dict, Iterator, List, Mapping, Optional, Tuple

from . import ops as O


class FrozenGraph(TypeError):
    """A write to the graph after its capture ended: statistics belong in the probe's result."""


@dataclass
class Op:
    """One operation of the captured graph."""

    id: int
    kind: str
    """Normalised kind, e.g. ``linear``, ``conv``, ``relu``, ``batch_norm``, ``add``."""
    target: str
    """What was called, as the user would recognise it (``nn.Linear``, ``F.relu``, ``Tensor.relu_``)."""
    module: str
    """Qualified path of the module the op belongs to (``layer1.0.conv1``; ``""`` is the root)."""
    inputs: List[int] = field(default_factory=list)
    """Ids of the ops that produced this op's tensor inputs, in argument order."""
    params: Dict[str, str] = field(default_factory=dict)
    """Role -> qualified parameter name, e.g. ``{"weight": "fc.weight", "bias": "fc.bias"}``."""
    attrs: Dict[str, Any] = field(default_factory=dict)
    """Kind-specific facts: ``negative_slope``, ``dim``, ``fan_in``, ``channel_axis``, ``shape`` ...;
    ``norm_statistic`` on the ops that compute what a normalisation written as functional ops divides
    by (:func:`initlint.capture.ops.own_norm_statistic`)."""
    location: Optional[Tuple[str, int]] = None
    """Source file and line that created the module (module ops) or made the call (functional ops)."""
    users: List[int] = field(default_factory=list)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            raise FrozenGraph(f"op {self.id} ({self.kind}) is read-only after capture: cannot set '{name}'")
        object.__setattr__(self, name, value)

    def freeze(self) -> None:
        """Make the op read-only: its fields, ``attrs``, ``params``, ``inputs`` and ``users``."""
        if self.__dict__.get("_frozen"):
            return
        self.attrs = _FrozenDict(self.attrs)
        self.params = _FrozenDict(self.params)
        self.inputs = _FrozenList(self.inputs)
        self.users = _FrozenList(self.users)
        object.__setattr__(self, "_frozen", True)

    @property
    def shape(self) -> Optional[Tuple[int, ...]]:
        """Shape of the op's output as the capture recorded it (graph inputs of the runtime capture);
        the shapes the probe measured are :meth:`initlint.rules.base.AuditContext.shape`."""
        return self.attrs.get("shape")

    def describe(self) -> str:
        """Short human description used in error messages."""
        where = self.module or "<model>"
        return f"{self.target} in {where}"


def _refuse(self: Any, *args: Any, **kwargs: Any) -> None:
    raise FrozenGraph("the graph is read-only after capture")


class _FrozenList(list):
    """A list that refuses changes; it still compares equal to a plain list, copies and pickles."""

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> Any:
        return type(self), (list(self),)


class _FrozenDict(dict):
    """A dict that refuses changes; it still compares equal to a plain dict, copies and pickles."""

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]
    __ior__ = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> Any:
        return type(self), (dict(self),)


class Graph:
    """Ops in execution order plus the edges between them.

    The capture builds it; once the capture's forward pass is over it is frozen (:meth:`freeze`)
    and read-only: what the probe measures (output shapes, units) lives in its result, not here."""

    def __init__(self) -> None:
        self.ops: List[Op] = []
        self.inputs: List[int] = []
        self.outputs: List[int] = []
        self.module_types: Dict[str, str] = {}
        self.module_locations: Mapping[str, Tuple[str, int]] = {}
        self.frozen = False

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("frozen"):
            raise FrozenGraph(f"the graph is read-only after capture: cannot set '{name}'")
        object.__setattr__(self, name, value)

    def freeze(self) -> "Graph":
        """End the capture: every op, the op list, inputs, outputs and module tables become read-only."""
        if self.frozen:
            return self
        for op in self.ops:
            op.freeze()
        self.ops = _FrozenList(self.ops)
        self.inputs = _FrozenList(self.inputs)
        self.outputs = _FrozenList(self.outputs)
        self.module_types = _FrozenDict(self.module_types)
        if isinstance(self.module_locations, dict):  # a read-only mapping (locate.ModuleLocations) stays
            self.module_locations = _FrozenDict(self.module_locations)
        self.frozen = True
        return self

    def add(self, kind: str, target: str, module: str, inputs: List[int], **extra: Any) -> Op:
        """Append an op and wire the user edges of its inputs."""
        if self.frozen:
            raise FrozenGraph("the graph is read-only after capture: cannot add an op")
        statistic = O.own_norm_statistic(self.ops, kind, inputs, extra.get("params"))
        if statistic is not None:
            kind = "rms_norm"  # a normalisation written as functional ops: it resets the scale as a module does
            for i in statistic:
                self.ops[i].attrs["norm_statistic"] = True
        op = Op(id=len(self.ops), kind=kind, target=target, module=module, inputs=list(inputs), **extra)
        self.ops.append(op)
        for i in op.inputs:
            if op.id not in self.ops[i].users:
                self.ops[i].users.append(op.id)
        return op

    def __getitem__(self, op_id: int) -> Op:
        return self.ops[op_id]

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def producers(self, op: Op) -> List[Op]:
        """Ops whose outputs feed ``op``."""
        return [self.ops[i] for i in op.inputs]

    def consumers(self, op: Op) -> List[Op]:
        """Ops that read ``op``'s output."""
        return [self.ops[i] for i in op.users]

    def back(self, op: Op, through: Optional[Collection[str]] = None, limit: Optional[int] = None) -> Iterator[Op]:
        """``op``, then the producer of its first input, and so on: the main path of the signal back
        towards an input, nearest first. With ``through``, the walk ends after the first op whose
        kind is not in it; with ``limit``, after that many ops. Every walk back along first inputs
        is this one."""
        current: Optional[Op] = op
        count = 0
        while current is not None and (limit is None or count < limit):
            yield current
            count += 1
            if not current.inputs or (through is not None and current.kind not in through):
                return
            current = self.ops[current.inputs[0]]

    def unit_axis(self, op: Op) -> int:
        """Axis indexing the units (features, channels) of ``op``'s output: the one fixed by the nearest
        op on its main path whose kind fixes it (a conv: 1; a linear or layer norm: -1); -1 if none."""
        for current in self.back(op, limit=64):
            axis = O.unit_axis(current.kind)
            if axis is not None:
                return axis
        return -1

    def of_kind(self, *kinds: str) -> List[Op]:
        """Every op whose kind is one of ``kinds``."""
        return [op for op in self.ops if op.kind in kinds]

    def summary(self) -> Dict[str, int]:
        """Count of ops per kind (for debugging and tests)."""
        counts: Dict[str, int] = {}
        for op in self.ops:
            counts[op.kind] = counts.get(op.kind, 0) + 1
        return counts


def enclosing_paths(name: str) -> List[str]:
    """The paths of the modules that hold a parameter or module named ``name``, outermost first,
    without the root: ``a.b.weight`` -> ``a``, ``a.b``."""
    return [name[:i] for i, ch in enumerate(name) if ch == "."]
