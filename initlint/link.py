"""Root causes: point consequences (dead units, drift, saturation) at the init findings that explain them."""
from __future__ import annotations

from typing import Any, Dict, List

from .report import Finding

CAUSES = ("IL001", "IL008")
"""Codes that name a root cause (a weight's scale or symmetry)."""
CONSEQUENCES = ("IL003", "IL004", "IL005", "IL006", "IL007")
"""Codes that describe a measured symptom an init problem can explain."""


def link_findings(findings: List[Finding], graph: Any = None) -> List[Finding]:
    """Fill ``caused_by`` of symptom findings with the root-cause findings that precede them.

    A symptom at module ``m`` is explained by a cause at a module that runs before it (or
    is ``m`` itself), in the graph's execution order; IL005 and IL006 describe a stretch of
    the network, so every cause explains them.
    """
    causes: List[Finding] = [f for f in findings if f.code in CAUSES and f.severity != "info"]
    if not causes:
        return findings
    order: Dict[str, int] = {}
    for op in graph or []:
        order.setdefault(op.module, op.id)
    for f in findings:
        order.setdefault(f.module, len(order) + 10**9)
    for f in findings:
        if f.code not in CONSEQUENCES:
            continue
        before = [c for c in causes if f.code in ("IL005", "IL006") or order.get(c.module, 0) <= order.get(f.module, 0)
                  or c.module == f.module]
        f.caused_by = sorted({c.ref() for c in before})
    return findings
