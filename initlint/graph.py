"""The project's own graph model: what every capture backend produces and every rule reads.

An :class:`Op` is one call observed in the model's forward pass (a module call, a
functional call or a tensor method), normalised to a small vocabulary of *kinds*
(see :mod:`initlint.ops`). Edges link an op to the ops that produced its tensor inputs.
Rules never see torch.fx nodes or hook objects, only this.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple


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
    """Kind-specific facts: ``negative_slope``, ``dim``, ``fan_in``, ``channel_axis``, ``shape`` ..."""
    location: Optional[Tuple[str, int]] = None
    """Source file and line that created the module (module ops) or made the call (functional ops)."""
    users: List[int] = field(default_factory=list)

    @property
    def shape(self) -> Optional[Tuple[int, ...]]:
        """Shape of the op's (first) output tensor, when the capture knows it."""
        return self.attrs.get("shape")

    def describe(self) -> str:
        """Short human description used in error messages."""
        where = self.module or "<model>"
        return f"{self.target} in {where}"


class Graph:
    """Ops in execution order plus the edges between them."""

    def __init__(self) -> None:
        self.ops: List[Op] = []
        self.inputs: List[int] = []
        self.outputs: List[int] = []
        self.module_types: Dict[str, str] = {}
        self.module_locations: Dict[str, Tuple[str, int]] = {}

    def add(self, kind: str, target: str, module: str, inputs: List[int], **extra: Any) -> Op:
        """Append an op and wire the user edges of its inputs."""
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

    def of_kind(self, *kinds: str) -> List[Op]:
        """Every op whose kind is one of ``kinds``."""
        return [op for op in self.ops if op.kind in kinds]

    def summary(self) -> Dict[str, int]:
        """Count of ops per kind (for debugging and tests)."""
        counts: Dict[str, int] = {}
        for op in self.ops:
            counts[op.kind] = counts.get(op.kind, 0) + 1
        return counts
