"""Suppressions: ``per-module-ignores`` from the configuration and ``initlint.ignore`` in code."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from .report import Finding


def ignore(*codes: str, reason: str = "") -> Any:
    """Class decorator: silence ``codes`` for this module class and everything under it."""
    def decorate(cls: Any) -> Any:
        existing = dict(getattr(cls, "__initlint_ignore__", {}) or {})
        for code in codes:
            existing[code] = reason
        cls.__initlint_ignore__ = existing
        return cls
    return decorate


def apply_suppressions(findings: List[Finding], model: Any, per_module_ignores: Optional[Dict[str, Sequence[str]]],
                       selected: Sequence[str]) -> List[Finding]:
    """Drop suppressed findings (full implementation pending: returns findings unchanged)."""
    return findings
