"""Root causes: point consequences (dead units, drift, saturation) at the init findings that explain them."""
from __future__ import annotations

from typing import Any, Dict, List

from ..report.findings import Finding
from . import all_rules


def link_findings(findings: List[Finding], graph: Any = None) -> List[Finding]:
    """Fill ``caused_by`` of symptom findings with the root-cause findings that precede them.

    Roles come from the rules (``Rule.role``). A symptom at module ``m`` is explained by a
    cause at a module that runs before it (or is ``m`` itself), in the graph's execution
    order; a symptom about a stretch of the network (``Rule.stretch``, such as drift through
    depth) is explained by every cause.
    """
    rules = all_rules()
    role = {code: rule.role for code, rule in rules.items()}
    causes: List[Finding] = [f for f in findings if role.get(f.code) == "cause" and f.severity != "info"]
    if not causes:
        return findings
    order: Dict[str, int] = {}
    for op in graph or []:
        order.setdefault(op.module, op.id)
    for f in findings:
        order.setdefault(f.module, len(order) + 10**9)
    for f in findings:
        if role.get(f.code) != "symptom":
            continue
        stretch = rules[f.code].stretch
        before = [c for c in causes if stretch or order.get(c.module, 0) <= order.get(f.module, 0)
                  or c.module == f.module]
        f.caused_by = sorted({c.ref() for c in before})
    return findings
