"""IL016 not-optimized."""
from __future__ import annotations

from typing import Dict, Iterator, List, Set

import torch
import torch.nn as nn

from ..report.findings import Finding
from .base import AuditContext, Example, Rule, enclosing_paths, fmt, py_path


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class ClassifierWithLeftoverHead(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.old_head = nn.Linear(64, 10)  # replaced by self.head, still registered

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def adam_over_the_body_only(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.body.parameters(), lr=1e-3)


def adam_over_everything(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def optimizer_built_over_the_body_only():
    # the optimizer was built before the head existed, or over model.body.parameters()
    return Classifier(), torch.randn(8, 32)


def leftover_layer_the_forward_never_uses():
    return ClassifierWithLeftoverHead(), torch.randn(8, 32)


def optimizer_over_every_parameter():
    return Classifier(), torch.randn(8, 32)


class NotOptimized(Rule):
    """## What it does
    With the optimizer the model will train with (``optimizer=``, ``--optimizer`` or
    ``initlint_optimizer(model)``), compares its param groups with the model: a parameter that
    requires grad and gets a nonzero gradient from the loss but that no group holds, a parameter
    held by two groups (or twice by one), a frozen parameter held (information) and tensors held
    that are not parameters of the model any more (a replaced head's old weights).

    With or without an optimizer, it also reports modules whose parameters require grad but
    that the forward pass never uses (a leftover layer): as information, or as a warning when
    the audited model is wrapped in ``DistributedDataParallel``.

    ## Why is this bad?
    A parameter no group holds keeps its init for the whole run: a head added after the
    optimizer was built, or ``optimizer = Adam(model.encoder.parameters())``, trains the
    encoder under a random, frozen head, and nothing fails. A parameter held twice is stepped
    twice (torch refuses it only at construction; ``group["params"].append`` slips past). A
    replaced module's old parameters still held cost optimizer memory and, with weight decay,
    are decayed for nothing. An unused module gets no gradient: ``DistributedDataParallel``
    stops with "Expected to have finished reduction in the prior iteration" unless
    ``find_unused_parameters=True`` (which costs a graph walk every step).

    ## Fix
    Build the optimizer once the model is complete, over ``model.parameters()`` (or param
    groups that together cover them); freeze on purpose with ``requires_grad_(False)`` and
    leave frozen parameters out of the groups; delete a leftover module (or call it).

    ## Options
    None.
    """

    code = "IL016"
    name = "not-optimized"
    severity = "warning"
    needs = frozenset({"activations"})
    summary = "a trainable parameter no param group holds, one held twice or stale, or a module the forward never uses"
    role = "check"
    bad = (Example(optimizer_built_over_the_body_only, expect={"head"}, options={"optimizer": adam_over_the_body_only}),
           Example(leftover_layer_the_forward_never_uses, expect={"old_head"}))
    good = (Example(optimizer_over_every_parameter, options={"optimizer": adam_over_everything}),)

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        step = audit.step
        if step is not None:
            yield from self._membership(audit)
        yield from self._unused(audit)

    def _membership(self, audit: AuditContext) -> Iterator[Finding]:
        step = audit.step
        opt = step.optimizer
        for module, names in _by_module(step.unheld).items():
            shown = ", ".join(f"{n} (gradient rms {fmt(step.unheld[n])})" for n in names)
            refs = ", ".join(py_path(n) for n in names)
            they = len(names) > 1
            yield self.finding(audit, module, f"{shown}: {'get' if they else 'gets'} a gradient, but no param group "
                               f"of the {opt} holds {'them' if they else 'it'}, so {'they keep their' if they else 'it keeps its'} "
                               f"init for the whole run",
                               f"build the optimizer after the model is complete, over model.parameters(); or "
                               f"optimizer.add_param_group({{'params': [{refs}]}})")
        for module, names in _by_module(step.doubly_held).items():
            where = "; ".join(f"{n} in groups {', '.join(map(str, step.doubly_held[n]))}" for n in names)
            yield self.finding(audit, module, f"held more than once by the {opt}: {where}; each copy is stepped",
                               "list each parameter in exactly one param group")
        for module, names in _by_module(step.frozen_held).items():
            yield self.finding(audit, module, f"{', '.join(names)}: frozen (requires_grad=False) but held by param "
                               f"group {step.frozen_held[names[0]]} of the {opt}",
                               "leave frozen parameters out of the optimizer: "
                               "Adam(p for p in model.parameters() if p.requires_grad)", severity="info")
        if step.stale:
            groups = sorted({g for g, _ in step.stale})
            shapes = ", ".join(str(list(s)) for _, s in step.stale[:4]) + (" ..." if len(step.stale) > 4 else "")
            yield self.finding(audit, "", f"the {opt} holds {len(step.stale)} tensor(s) that are not parameters of "
                               f"the model (param group {', '.join(map(str, groups))}; shapes {shapes}): the old "
                               f"parameters of a replaced module",
                               "build the optimizer after replacing modules, over model.parameters()")

    def _unused(self, audit: AuditContext) -> Iterator[Finding]:
        trainable = {n for n, p in audit.model.named_parameters() if p.requires_grad}
        if not trainable:
            return
        used: Set[str] = {n for op in audit.graph for n in op.params.values()}
        unused = trainable - used
        if audit.step is not None and audit.step.grads_taken:
            unused &= set(audit.step.unused)  # nor does the loss reach it
        if not unused:
            return
        severity = "warning" if audit.ddp else "info"
        reported: List[str] = []
        # only a module that holds an unused parameter can be reported: its path is a prefix of that name
        holders = {path for name in unused for path in enclosing_paths(name)}
        for path, module in audit.model.named_modules():
            if path not in holders or any(path.startswith(r + ".") for r in reported):
                continue
            own = [f"{path}.{n}" for n, p in module.named_parameters() if p.requires_grad]
            if own and all(n in unused for n in own):
                reported.append(path)
                ddp = ("DistributedDataParallel stops on it unless find_unused_parameters=True" if audit.ddp else
                       "under DistributedDataParallel it needs find_unused_parameters=True")
                yield self.finding(audit, path, f"{type(module).__name__} with {len(own)} trainable parameter(s) "
                                   f"that the forward pass never uses; {ddp}",
                                   f"delete {py_path(path)} if it is a leftover, or call it in forward",
                                   severity=severity)


def _by_module(names: Dict[str, object]) -> Dict[str, List[str]]:
    out: Dict[str, List[str]] = {}
    for name in names:
        out.setdefault(name.rpartition(".")[0], []).append(name)
    return out
